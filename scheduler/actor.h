// The scheduler actor: the Core wrapped in an event loop with two ROUTER sockets, one for
// clients and one for workers. Single-threaded; owns all scheduling state.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/event_loop.h"
#include "runtime/harness.h"
#include "runtime/status.h"
#include "scheduler/core.h"

namespace tandem::scheduler {

struct ActorOptions {
  std::string model_path;       // the GGUF: vocabulary, context length, fingerprint
  std::string client_endpoint;  // e.g. ipc:///run/tandem/client.sock or tcp://127.0.0.1:5555
  std::string worker_endpoint;
  // Where Drain is accepted (with StatusQuery and Heartbeat): an ipc:// socket, whose folder's
  // permissions say who may stop the deployment. Empty: none (signals still drain). The client
  // endpoint refuses Drain.
  std::string admin_endpoint;
  SchedulerConfig core;
  uint32_t heartbeat_ms = 1000;       // liveness checks run at this period
  uint32_t worker_liveness = 3;       // a worker silent for liveness x heartbeat is dead
  uint32_t client_timeout_ms = 5000;  // a client with live requests silent this long is gone
  uint32_t max_clients = 4096;        // client identities heard from within client_timeout_ms (0: no cap)
  // Messages queued to one client before it counts as not reading: its requests are then
  // cancelled (their final events wait, and are sent once it reads again).
  uint32_t client_send_queue = 10000;
  // Bytes of replies queued to one client at most: its socket's queue bound in messages is
  // derived from it (send_hwm_for() in client_outbox.h: every message of events is at most
  // kReplyChunkBytes), and past it the client counts as not reading, as above.
  uint64_t client_send_bytes = uint64_t{64} << 20;
  uint32_t drain_timeout_ms = 30000;  // draining: running requests get this long, then are cancelled
  std::string curve_keys_dir;         // CurveZMQ server keys (runtime/security.h); empty: none
  // A Register's kv_blocks x block_bytes at most (registration.h); 0: this host's MemTotal.
  uint64_t max_worker_kv_bytes = 0;
  // kv_endpoints taken from any worker, beyond its own address (registration.h): these and the
  // entries of kv_endpoint_allow_file (read_allow_file), which SIGHUP re-reads; a decode worker
  // whose kv_endpoint is no longer allowed then is fenced.
  std::vector<std::string> kv_endpoint_allow;
  std::string kv_endpoint_allow_file;
  // Allow-lists (runtime/zap.h), with CurveZMQ only; SIGHUP re-reads both. Empty: any holder of
  // server.pub may connect there. A worker whose key leaves the list is fenced; a client whose
  // key leaves it has its new requests refused.
  std::string worker_keys;  // --worker-keys: the keys that may register as workers
  std::string client_keys;  // --client-keys: the keys that may submit, each with its priority range
  // Threads that make long text prompts and conversations into ids (and answer tokenize
  // queries) off the planning thread (prompt_pool.h); 0: on it.
  uint32_t prompt_threads = 2;
};

// Runs until drained or stopped: SIGTERM, SIGINT or a Drain on the admin endpoint drain (new
// submits get UNAVAILABLE; running requests finish within the drain timeout, then the rest
// are cancelled with their final event; then it returns ok). A second SIGTERM/SIGINT, or
// SIGQUIT, stops at once. Errors: the model file, or an endpoint that cannot be bound.
Status run_scheduler(const ActorOptions& options);

class Actor;  // the event loop around the Core (actor.cpp)

// The actor with its sockets bound but its loop not running: the handlers its sockets call
// are fed frames directly. For the fuzz targets (fuzz/), which push arbitrary bytes through
// the same decode paths as real peers; give it inproc:// endpoints.
class ActorHarness : runtime::Harness<Actor> {
 public:
  static Result<std::unique_ptr<ActorHarness>> create(const ActorOptions& options);
  ~ActorHarness();
  void client(runtime::Frames& frames);  // as the client ROUTER delivers: frames[0] is the peer
  void worker(runtime::Frames& frames);  // as the worker ROUTER delivers
  void tick();                           // deadlines, plans, and flushing events
  // The liveness timer's work: silent workers declared dead, workers past a step deadline
  // fenced, silent clients' requests cancelled.
  void check_liveness();
  void pass_time(std::chrono::microseconds d);  // the actor's clock moves on by `d`
  // The actor's ZeroMQ context: inproc:// peers (real DEALERs) connect through it.
  zmq::context_t& context();

 private:
  friend class runtime::Harness<Actor>;
  explicit ActorHarness(std::unique_ptr<Actor> actor);
};

}  // namespace tandem::scheduler
