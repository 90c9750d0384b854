// The worker actor: loads the model, owns the KV pool, registers with the scheduler and
// executes its step plans, one ragged forward pass each. Single-threaded event loop; the
// engine's thread pool does the arithmetic inside a step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/event_loop.h"
#include "runtime/harness.h"
#include "runtime/role.h"
#include "runtime/status.h"
#include "workers/engine/engine.h"

namespace tandem::worker {

// The role named "both", "prefill" or "decode" (runtime/role.h); kInvalidArgument naming
// `--role` otherwise.
Result<runtime::Role> parse_role(const std::string& name);

struct WorkerOptions {
  std::string model_path;
  std::string scheduler_endpoint;  // the scheduler's worker endpoint
  std::string name;                // for logs; defaults to worker-<pid>
  uint32_t threads = 2;
  engine::GemmBackend gemm = engine::GemmBackend::kPacked;
  uint32_t kv_blocks = 0;           // 0: from kv_memory
  uint64_t kv_memory = 1ull << 30;  // bytes of KV cache when kv_blocks is 0; 0: from what the host has left
  // With kv_memory 0 (workers/memory_budget.h): left for the process, the OS and the page cache,
  // and how many workers on this host split the rest.
  uint64_t memory_reserve = 1ull << 30;
  uint32_t host_workers = 1;
  uint32_t block_tokens = 16;
  engine::KvFormat kv_format;  // F32 by default; blocks_for_bytes uses its real bytes
  // --kv-rings (docs/WINDOWS.md "Rings"): the windowed layers' KV in a ring pool of their own
  // (a quarter of the full layers' blocks, kv_blocks/kv_memory split between the two). Role
  // both only (no handoff of rings), no F32 window tail, a model with windowed layers.
  bool kv_rings = false;
  // Speculative decoding (--spec ngram --spec-tokens K): drafts per round at most; 0: off. A
  // prefill worker never speculates (its sequences decode elsewhere).
  uint32_t spec_tokens = 0;
  // --spec draft --draft-model FILE: the drafts come from this model (same vocabulary), run on
  // this worker with its KV beside the target's in every block; empty: prompt lookup.
  std::string draft_model_path;
  // A hybrid model's recurrent state slots (engine::StatePool): the most sequences it holds at once.
  uint32_t state_slots = 64;
  // Its prefix cache (docs/HYBRID.md "Prefix cache"): state checkpoints kept beside the slots
  // (0: no prefix cache for the hybrid), one per checkpoint_interval tokens of a cached prefix
  // at most (a multiple of 64 and of block_tokens; 0: the least such multiple >= 256).
  uint32_t state_checkpoints = 16;
  uint32_t checkpoint_interval = 0;
  uint32_t heartbeat_ms = 1000;
  runtime::Role role = runtime::Role::kBoth;
  // Role decode: where prefill workers push KV. tcp://127.0.0.1:* picks a free port.
  std::string kv_endpoint = "tcp://127.0.0.1:*";
  // Role prefill: a PUSH socket to a decode worker unused this long is closed (a decode worker
  // that is gone would otherwise keep a socket, its reconnect attempts and queued KV forever).
  uint32_t kv_peer_idle_ms = 60000;
  std::string curve_keys_dir;  // the scheduler's CurveZMQ public key (DIR/server.pub); empty: none
  // With CurveZMQ: this worker's own secret key (tandem keys --name NAME: NAME.key), the credential
  // the scheduler's --worker-keys names; also the key its KV sockets present. Empty: a key pair
  // made at start (which only a scheduler without --worker-keys lets in).
  std::string worker_key;
  // Test seam (`--test-step-delay-ms`): sleep this long before executing each step plan, as a
  // slower machine would. Lets end-to-end tests make races (a cancel against a request's last
  // token) come out one way by construction, whatever the speed of the machine. 0 in service.
  uint32_t test_step_delay_ms = 0;
};

// How a worker's run ended: the scheduler's shutdown (signal 0), or a signal from elsewhere.
// `tandem worker` exits 0 for the first (a supervisor leaves it down) and 128 + signal for the
// second (a supervisor restarts it).
struct WorkerStop {
  int signal = 0;
};

// What a worker of `options` would refuse about its model before loading it (--kv-rings on a
// model without windowed layers or with an F32 window tail, a hybrid's --checkpoint-interval off
// the grid): `tandem up` checks every worker with it before
// starting anything. A model file that cannot be read is left to the worker to report.
Status check_model_options(const WorkerOptions& options);

// Runs until the scheduler says shutdown, or SIGINT/SIGTERM. Errors: the model file, the KV
// pool, or a refused registration (the scheduler's reason).
Result<WorkerStop> run_worker(const WorkerOptions& options);

class Actor;  // loads, registers, runs step plans (actor.cpp)

// The actor with its model and KV pool loaded and its sockets connected, but its loop not
// running: the handlers its sockets call are fed frames directly. For the fuzz targets
// (fuzz/): arbitrary bytes through the same decode paths as the scheduler's commands and
// other workers' KV transfers. Give it inproc:// endpoints.
class WorkerHarness : runtime::Harness<Actor> {
 public:
  static Result<std::unique_ptr<WorkerHarness>> create(const WorkerOptions& options);
  ~WorkerHarness();
  void scheduler(runtime::Frames& frames);  // as the DEALER delivers the scheduler's commands
  void transfer(runtime::Frames& frames);   // as the KV PULL socket delivers a transfer

 private:
  friend class runtime::Harness<Actor>;
  explicit WorkerHarness(std::unique_ptr<Actor> actor);
};

}  // namespace tandem::worker
