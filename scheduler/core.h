// The scheduler's pure core: every request's lifecycle, per-worker KV block accounting,
// step planning (decodes first, then prefill chunks under a token budget), stop
// detection and the events sent to clients. No sockets and no clocks: the actor feeds it
// messages and the time, and a Sink receives what it decides to send. Tested with
// scripted worker results (tests/scheduler/core_test.cpp).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/model/model_config.h"
#include "runtime/model/tokenizer.h"
#include "scheduler/admission.h"
#include "scheduler/block_pool.h"
#include "scheduler/stops.h"
#include "tandem/v1/client.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::scheduler {

struct SchedulerConfig {
  uint32_t max_queue = 4096;        // waiting requests; past it a submit gets OVERLOADED
  uint32_t max_batch_tokens = 512;  // tokens per step (decodes count one each)
  uint32_t prefill_chunk = 256;     // prompt tokens of one sequence per step
  uint32_t max_running = 256;       // sequences per worker
  uint32_t pipeline_depth = 2;      // plans in flight per worker (2: the next plan waits at the worker)
};

// What the core sends. The actor serializes and routes; tests record.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void send_plan(uint32_t worker_id, const v1::StepPlan& plan) = 0;
  virtual void send_events(const std::string& client, const v1::RequestEvents& events) = 0;
};

struct WorkerStats {
  // idle_us: pipeline bubbles only (see StepResult.idle_us and WorkerStatus.idle_share).
  uint64_t steps = 0, tokens = 0, compute_us = 0, idle_us = 0;
  int64_t registered_us = 0;
  uint32_t running = 0;
};

struct CoreStats {
  uint64_t requests = 0, finished = 0, tokens = 0, steps = 0;
  uint32_t max_step_decode = 0;          // most decode sequences in one step
  uint32_t max_step_prefill_tokens = 0;  // most prompt tokens in one step
  // A decoding sequence left out of a step it was ready for (only when its worker ran out
  // of KV blocks): interleaving never stalls a stream for a prefill.
  uint64_t decode_stalls = 0;
  uint64_t preemptions = 0;
};

class Core {
 public:
  Core(SchedulerConfig config, model::ModelConfig model, const model::Tokenizer& tokenizer, Sink& sink);
  ~Core();

  // Workers. A removed worker's requests are placed again (recomputed) on the others, or
  // end with an UNAVAILABLE error when none is left.
  void add_worker(uint32_t worker_id, uint32_t kv_blocks, uint32_t block_tokens, int64_t now_us);
  void remove_worker(uint32_t worker_id, int64_t now_us);
  bool has_worker(uint32_t worker_id) const { return workers_.count(worker_id) > 0; }

  // Client traffic. Invalid or unplaceable requests get their final error event at once.
  void submit(const std::string& client, const v1::Submit& submit, int64_t now_us);
  void cancel(const std::string& client, const std::string& request_id, int64_t now_us);
  // The client went silent or away: every request of it is cancelled.
  void client_gone(const std::string& client, int64_t now_us);
  // Ends every live request (queued or running) with a final CANCELLED event carrying
  // `message` (a drain past its deadline).
  void cancel_all(const std::string& message, int64_t now_us);

  // A worker's step result (results come back in plan order per worker).
  void on_result(uint32_t worker_id, const v1::StepResult& result, int64_t now_us);
  // Deadlines, then new plans for every worker with room in its pipeline.
  void tick(int64_t now_us);

  const CoreStats& stats() const { return stats_; }
  uint32_t queued() const { return static_cast<uint32_t>(queue_.size()); }
  uint32_t running() const;
  // Per worker: total and free blocks, running sequences.
  struct WorkerView {
    uint32_t id, blocks_total, blocks_free, running;
    const WorkerStats* stats;
  };
  std::vector<WorkerView> workers() const;
  // Every request of this client that has not had its final event.
  uint32_t live_requests(const std::string& client) const;
  bool idle() const { return queue_.empty() && running() == 0; }

 private:
  struct Request;
  struct Worker;
  struct Placement;
  void schedule(int64_t now_us);
  bool build_plan(Worker& w);
  bool place(Request& r, int64_t now_us);
  // Sends the final event (in `carry`, after its tokens, when given) and forgets the request.
  void finish(Request& r, v1::FinishReason reason, v1::ErrorCode code, const std::string& message, int64_t now_us,
              v1::RequestEvents* carry = nullptr);
  void reject(const std::string& client, const std::string& request_id, v1::ErrorCode code, const std::string& message);
  void accept_token(Request& r, const v1::SeqResult& s, int64_t now_us);
  void requeue(Request& r);
  void enqueue(Request& r);
  void detach(Request& r);
  void retire(Placement& p);
  static std::string key(const std::string& client, const std::string& id);

  SchedulerConfig config_;
  model::ModelConfig model_;
  const model::Tokenizer& tokenizer_;
  AdmissionLimits limits_;
  Sink& sink_;
  CoreStats stats_;
  uint64_t next_seq_ = 1;
  std::map<uint32_t, std::unique_ptr<Worker>> workers_;
  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;  // by key(client, id)
  std::unordered_map<uint64_t, std::unique_ptr<Placement>> by_seq_;
  v1::RequestEvents events_;  // reused for every event message: no allocation per token
  v1::StepPlan plan_;
  std::vector<uint64_t> snapshot_;  // sequence ids of a worker's placements, for build_plan
  std::deque<Request*> queue_;  // waiting for a worker, by priority then arrival
};

}  // namespace tandem::scheduler
