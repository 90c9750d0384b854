// The scheduler's pure core: every request's lifecycle, step planning (one token-budget loop
// over the running sequences), stop detection and the events sent to clients. Each worker's
// KV blocks are its KvCacheManager's (kv_cache_manager.h): the core asks for slots and
// preempts when told no. No sockets and no clocks: the actor feeds it messages and the time,
// and a Sink receives what it decides to send. Tested with scripted worker results
// (tests/scheduler/core_test.cpp).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/model_config.h"
#include "model/tokenizer.h"
#include "runtime/role.h"
#include "scheduler/admission.h"
#include "scheduler/kv_cache_manager.h"
#include "scheduler/messages.h"
#include "scheduler/metrics.h"
#include "scheduler/prompt.h"
#include "scheduler/step_cost.h"
#include "scheduler/step_history.h"
#include "scheduler/stops.h"
#include "tandem/v1/client.pb.h"

namespace tandem::scheduler {

struct SchedulerConfig {
  uint32_t max_queue = 4096;  // waiting requests; past it a submit gets OVERLOADED
  // Live (queued, tokenizing or running) requests of one client, or of one principal a proxy
  // client sends them for (Submit.principal; the proxy's requests without one count as its
  // own); past it that client's (principal's) submit gets OVERLOADED while others are served.
  // 0: no limit but max_queue.
  uint32_t max_client_requests = 1024;
  uint32_t max_batch_tokens = 512;  // tokens per step (decodes count one each)
  uint32_t prefill_chunk = 256;     // prompt tokens of one sequence per step
  // The step-time target (0: off). While sequences decode on a worker, its steps take at most
  // as many prompt tokens as its recent steps say fit in this time besides the decodes
  // (StepCost), and never fewer than kMinPromptTokens. max_batch_tokens and prefill_chunk
  // still bound every step; a worker with nothing decoding fills them (time to first token).
  uint32_t target_step_ms = 0;
  static constexpr uint32_t kMinPromptTokens = 16;
  uint32_t max_running = 256;          // sequences per worker
  uint32_t pipeline_depth = 2;         // plans in flight per worker (2: the next plan waits at the worker)
  uint32_t handoff_timeout_ms = 5000;  // a KV handoff not acknowledged by then is recomputed elsewhere
  // The floor of a plan's deadline (overdue_worker): the actor's worker liveness timeout. A
  // worker's steps are allowed StepHistory::kMultiple times their recent p99, never less.
  uint32_t step_deadline_floor_ms = 3000;
  // Prefix caching: full prompt blocks stay cached after their sequence ends and later
  // prompts with the same prefix share them. A new request goes to the worker holding its
  // longest cached prefix unless that worker runs more than cache_balance_slack sequences
  // beyond the least loaded one (then to the least loaded).
  bool prefix_cache = true;
  uint32_t cache_balance_slack = 8;
  BlockHash block_hash = xxh3_block_hash;  // tests force collisions through it
  // Text prompts up to this many bytes are tokenized at once, on the planning thread (a few
  // tens of microseconds); longer ones and every conversation go to the Sink's prompt threads
  // when it has them (Sink::renders_async).
  uint32_t inline_prompt_bytes = 512;
};

using runtime::Role;  // what a worker does (runtime/role.h)
using runtime::role_name;

struct WorkerInfo {
  Role role = Role::kBoth;
  uint32_t kv_blocks = 0;
  uint32_t block_tokens = 16;
  std::string kv_endpoint;  // kDecode: where prefill workers push KV
  // Blocks each sequence takes besides its positions' (the F32 rows of its most recent blocks,
  // engine::KvPool::tail_blocks); allocated with the sequence, freed with it.
  uint32_t tail_blocks = 0;
  std::string kv_public_key{};  // kDecode with CurveZMQ: its KV socket's server key
  std::string kv_sender_key{};  // kPrefill with CurveZMQ: the key its KV sockets connect with
  // Speculative decoding (Register.spec_tokens): the most drafts its decoding sequences carry
  // per round; 0: it does not speculate. Its decode rounds then continue from the worker's own
  // positions and reserve KV for 1 + spec_tokens positions (docs/ARCHITECTURE.md).
  uint32_t spec_tokens = 0;
  // A hybrid model's recurrent state slots (Register.state_slots): the worker holds at most
  // this many sequences, so admission counts them beside its blocks. 0: no such bound.
  uint32_t state_slots = 0;
  // Rings (Register.kv_ring_blocks, docs/WINDOWS.md): the windowed layers' pool of ring_blocks
  // blocks for layers of window ring_window; the core's manager keeps each sequence's ring,
  // releases the blocks the window has passed and sends the ring with every plan. 0: none.
  uint32_t ring_blocks = 0, ring_window = 0;
  // A hybrid's state checkpoints for the prefix cache (Register.state_checkpoints, docs/HYBRID.md
  // "Prefix cache"), one every checkpoint_interval tokens of a cached prefix at most. 0: no prefix cache.
  uint32_t state_checkpoints = 0, checkpoint_interval = 0;
  static constexpr uint32_t kMaxSpecTokens = scheduler::kMaxSpecTokens;
};

// What the core sends. The actor maps it to the wire (actor_wire.h) and routes it; tests record.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void send_plan(uint32_t worker_id, const StepPlan& plan) = 0;
  virtual void send_events(const std::string& client, const RequestEvents& events) = 0;
  // KvExpect to a decode worker, KvSend to a prefill worker (the version is the actor's).
  virtual void send_command(uint32_t worker_id, const Command& command) = 0;
  // Prompts made into ids off the planning thread: when renders_async(), render_async hands a
  // prompt over and the Sink's owner calls Core::on_prompt(job, ids) later, once per job (a
  // job whose request ended meanwhile is ignored there). Otherwise the core renders inline.
  virtual bool renders_async() const { return false; }
  virtual void render_async(uint64_t /*job*/, PromptInput /*input*/) {}
  // The request of `job` ended before its ids came: the work may be dropped if not started.
  virtual void cancel_render(uint64_t /*job*/) {}
};

struct WorkerStats {
  // idle_us: pipeline bubbles only (see StepResult.idle_us and WorkerStatus.idle_share).
  uint64_t steps = 0, tokens = 0, compute_us = 0, idle_us = 0;
  // Speculative decoding: rounds answered (a speculating sequence's decode each), drafts fed,
  // drafts accepted. Tokens per round: (rounds + accepted) / rounds.
  uint64_t spec_rounds = 0, drafted = 0, accepted = 0;
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
  // Prefill -> decode KV handoffs: acknowledged ones, their bytes, and how long each took
  // from the send order to the acknowledgement (the last 4096).
  uint64_t handoffs = 0, handoff_bytes = 0, handoff_failures = 0;
  // Prefix cache, over first placements: prompt tokens, and those served from the cache.
  uint64_t prompt_tokens = 0, cached_prompt_tokens = 0;
  std::vector<double> handoff_ms;  // a ring: handoff_ms[handoffs % 4096]
};

class Core {
 public:
  Core(SchedulerConfig config, model::ModelConfig model, const model::Tokenizer& tokenizer, Sink& sink);
  // With the model's chat template: requests may carry messages.
  Core(SchedulerConfig config, model::ModelConfig model, PromptRenderer renderer, Sink& sink);
  ~Core();

  // Workers. A removed worker's requests are placed again (recomputed) on the others, or
  // end with an UNAVAILABLE error when none is left.
  void add_worker(uint32_t worker_id, const WorkerInfo& info, int64_t now_us);
  void add_worker(uint32_t worker_id, uint32_t kv_blocks, uint32_t block_tokens, int64_t now_us) {
    add_worker(worker_id, WorkerInfo{Role::kBoth, kv_blocks, block_tokens, {}}, now_us);
  }
  void remove_worker(uint32_t worker_id, int64_t now_us);
  bool has_worker(uint32_t worker_id) const { return workers_.count(worker_id) > 0; }

  // Client traffic. Invalid or unplaceable requests get their final error event at once.
  // A request whose prompt is text or messages may wait for its ids (Sink::render_async): it is
  // live meanwhile (cancel, client_gone, cancel_all and deadlines end it with its one final
  // event), and admission's prompt checks run when on_prompt brings them.
  void submit(const std::string& client, const v1::Submit& submit, int64_t now_us);
  // The ids of prompt job `job` (or why it has none). Ignored when its request has ended.
  void on_prompt(uint64_t job, Result<std::vector<int32_t>> ids, int64_t now_us);
  void cancel(const std::string& client, const std::string& request_id, int64_t now_us);
  // The client went silent or away: every request of it is cancelled.
  void client_gone(const std::string& client, int64_t now_us,
                   const std::string& reason = "the client stopped heartbeating");
  // Ends every live request (queued or running) with a final CANCELLED event carrying
  // `message` (a drain past its deadline).
  void cancel_all(const std::string& message, int64_t now_us);

  // A worker's step result (results come back in plan order per worker).
  void on_result(uint32_t worker_id, const StepResult& result, int64_t now_us);
  // A decode worker has the KV of a handed-off sequence (or refused it).
  void on_kv_received(uint32_t worker_id, const KvReceived& ack, int64_t now_us);
  // Deadlines, then new plans for every worker with room in its pipeline.
  void tick(int64_t now_us);

  // Per-step deadlines: a worker whose oldest unanswered plan has waited (since the worker
  // could start it: sent, and the plan before answered) longer than its StepHistory allows,
  // with step_deadline_floor_ms as the floor. The caller fences it as a dead worker
  // (remove_worker), so its sequences fail over. None when every worker is within its deadline.
  struct Overdue {
    uint32_t worker_id;
    uint64_t step_id;
    uint32_t tokens;
    int64_t waited_us, deadline_us;
  };
  std::optional<Overdue> overdue_worker(int64_t now_us) const;
  // The caller was held up for `us` (its loop did not run, results sat unread): not counted
  // against any plan in flight.
  void postpone_step_deadlines(int64_t us);

  const CoreStats& stats() const { return stats_; }
  const RequestMetrics& metrics() const { return metrics_; }
  // A submit the caller refused before it reached the core (draining, a credential's limits, a
  // stalled client): counted with the core's own refusals.
  void count_refusal(v1::ErrorCode code) { metrics_.refuse(code); }
  // Requests that have not had their final event (waiting, tokenizing, placed, handing off).
  uint32_t live_requests() const { return static_cast<uint32_t>(requests_.size()); }
  // Waiting requests, those whose prompt is being tokenized included.
  uint32_t queued() const { return static_cast<uint32_t>(queue_.size() + tokenizing_.size()); }
  uint32_t running() const;
  // Per worker: total and free blocks, running sequences.
  struct WorkerView {
    uint32_t id, blocks_total, blocks_free, running;
    const WorkerStats* stats;
    Role role;
    uint32_t blocks_cached;  // free + cached + in use = total
    uint64_t evictions;
    uint32_t spec_tokens;                          // WorkerInfo::spec_tokens
    uint32_t state_slots_total, state_slots_free;  // WorkerInfo::state_slots, less one per running sequence
    uint32_t ring_total, ring_free, ring_cached;   // the ring pool's blocks (0 total: no rings)
    uint32_t checkpoints_total, checkpoints_free;  // a hybrid's state checkpoints (KvCacheManager)
  };
  std::vector<WorkerView> workers() const;
  // Every request of this client that has not had its final event.
  uint32_t live_requests(const std::string& client) const;
  bool idle() const { return queue_.empty() && tokenizing_.empty() && running() == 0; }
  // A request can be served: some worker takes prompts and some worker decodes.
  bool ready() const;
  std::string unready_reason() const;  // why not ready(), for error events

 private:
  struct Request;
  struct Worker;
  struct Placement;
  void schedule(int64_t now_us);
  bool build_plan(Worker& w, int64_t now_us);
  // build_plan's parts: the tokens a sequence asks of this step (0: none), the order the
  // step visits the worker's sequences (into snapshot_), KV slots for a sequence's first
  // `positions` positions once the pool said no (preempting the newest other sequence), and the
  // sequence's entry in plan_ for `n` tokens.
  uint32_t tokens_wanted(const Worker& w, const Request& r) const;
  // The order the step visits; returns how many sequences are decoding.
  uint32_t order_for_step(const Worker& w);
  // Prompt tokens this step may take besides `decoding` decodes (SchedulerConfig::target_step_ms).
  uint32_t prompt_allowance(const Worker& w, uint32_t decoding) const;
  enum class Slots { kReserved, kShort, kPreempted };  // kPreempted: this sequence went back to the queue
  Slots preempt_for(Worker& w, Placement& p, uint32_t positions, const std::vector<uint64_t>& seqs);
  void plan_tokens(Worker& w, Placement& p, Request& r, uint32_t n, std::vector<uint64_t>& seqs,
                   std::vector<uint32_t>& reserves);
  bool place(Request& r, int64_t now_us);
  bool takes_prompts(const Worker& w) const;
  // Prefill done on a prefill worker: reserve blocks on a decode worker and order the KV
  // sent there. False when no decode worker has room now (retried every tick).
  bool start_handoff(Request& r, int64_t now_us);
  void end_handoff(Request& r);  // frees the source blocks (after the ack, or when abandoned)
  // Offers the placement's newly full blocks to the prefix cache (once planned: a later
  // plan that shares them runs after the one that writes them).
  void publish(Worker& w, Placement& p, Request& r);
  // Sends the final event (in `carry`, after its tokens, when given) and forgets the request.
  void finish(Request& r, v1::FinishReason reason, v1::ErrorCode code, const std::string& message, int64_t now_us,
              RequestEvents* carry = nullptr);
  void reject(const std::string& client, const std::string& request_id, v1::ErrorCode code, const std::string& message);
  // The metrics of a request's end: e2e by reason, queue time, token counts; or a refusal when its
  // prompt was refused after it was taken (its ids came from the prompt threads).
  void record_end(const Request& r, v1::FinishReason reason, v1::ErrorCode code, int64_t scheduled_us, int64_t now_us);
  // Refuses (with its final event) a request that cannot be taken now: a duplicate id, a full
  // queue, no worker that takes prompts. True when refused.
  bool refuse_unservable(const std::string& client, const std::string& k, const RequestSpec& spec);
  // Why a sequence of this spec could never run: it exceeds every worker's KV ("" when it fits).
  std::string exceeds_kv(const RequestSpec& spec) const;
  Request& add_request(const std::string& client, const std::string& k, RequestSpec spec, int64_t now_us);
  void begin(Request& r);  // its prompt known and admitted: into the queue
  // Token `i` of a result: 0 its token (with its top logprobs), then its more_tokens.
  void accept_token(Request& r, const SeqResult& s, size_t i, int64_t now_us);
  // A worker's answer for one of its plan's sequences (`reserve`: the positions a speculating
  // round reserved, 0 for others): its tokens to the request in order while it lives, then
  // what a speculating round did not use back to the pool.
  void take_result(Worker& w, Placement& p, const SeqResult& s, uint32_t reserve, int64_t now_us);
  // Whether r's decodes on w speculate: w does and the request did not turn it off.
  static bool speculates(const Worker& w, const Request& r);
  // A speculating decode's draft room in this step: 1 + max drafts (0: wait for results).
  uint32_t spec_wanted(const Worker& w, const Request& r) const;
  void requeue(Request& r);
  void enqueue(Request& r);
  void detach(Request& r);
  void retire(Placement& p);
  static std::string key(const std::string& client, const std::string& id);
  // What max_client_requests counts per: the client, and each principal a proxy client names
  // ("client\0principal": a principal holds no NUL, so no two pairs share a key).
  static std::string account(const std::string& client, const std::string& principal);
  // 64 bits from the kernel's CSPRNG: a KV transfer's nonce (a peer that did not see its
  // KvExpect cannot guess it) and the first transfer id.
  static uint64_t random_u64();

  SchedulerConfig config_;
  model::ModelConfig model_;
  PromptRenderer renderer_;
  std::vector<uint64_t> seqs_scratch_;  // on_result: the answered plan's sequences (capacity kept)
  AdmissionLimits limits_;
  Sink& sink_;
  CoreStats stats_;
  RequestMetrics metrics_;
  uint64_t next_seq_ = 1;
  // Transfer ids start at a random base, so they do not repeat across a scheduler restart.
  uint64_t next_transfer_ = (random_u64() >> 1) + 1;
  // This run's: in every KvExpect and KvSend, so a transfer ordered by an earlier run of the
  // scheduler (whose ids may meet this run's) is refused by the decode worker.
  const uint64_t epoch_ = random_u64() | 1;
  uint64_t next_prompt_job_ = 1;
  std::unordered_map<uint64_t, Request*> tokenizing_;  // by prompt job: its ids are being made
  uint32_t decode_workers_ = 0;
  std::vector<Request*> handoffs_waiting_;  // prefill done, no decode worker with room yet
  std::map<uint32_t, std::unique_ptr<Worker>> workers_;
  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;  // by key(client, id)
  // requests_ per account: a client's own, and each principal's it sent (max_client_requests).
  std::unordered_map<std::string, uint32_t> live_per_account_;
  std::unordered_map<uint64_t, std::unique_ptr<Placement>> by_seq_;
  RequestEvents events_;  // reused for every event message: no allocation per token
  StepPlan plan_;
  std::vector<Placement*> snapshot_;  // a worker's placements in build_plan's order
  std::vector<Placement*> prompts_;   // order_for_step's scratch (capacity kept)
  std::deque<Request*> queue_;        // waiting for a worker, by priority then arrival
};

}  // namespace tandem::scheduler
