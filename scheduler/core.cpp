#include "scheduler/core.h"

#include <sys/random.h>

#include <algorithm>
#include <cassert>

#include "runtime/sampling_proto.h"

namespace tandem::scheduler {

// One placement of a request on a worker: a sequence id the worker knows, and its blocks.
// It outlives its request while plans that include it are still in flight (their results
// are then ignored), and only then are its blocks freed and the worker told to forget it.
struct Core::Placement {
  uint64_t seq_id = 0;
  uint32_t worker_id = 0;
  KvSeq kv;                        // its blocks (only the worker's KvCacheManager changes them)
  uint32_t inflight = 0;           // plans in flight that include this sequence
  uint32_t reserved = 0;           // positions its speculating rounds in flight reserved
  bool appeared = false;           // named in a plan: the worker holds state for it
  bool ready = true;               // false while its KV is on the way from a prefill worker
  Request* owner = nullptr;        // null once the request finished or moved
  Request* sending_for = nullptr;  // a handoff's source: pinned until the decode side has the KV
};

struct Core::Request {
  std::string client, key;
  std::string account;  // its key in live_per_account_ (account())
  RequestSpec spec;
  std::vector<int32_t> tokens;  // the sequence so far: prompt, then generated tokens
  uint32_t prompt_len = 0;
  uint32_t generated = 0;        // tokens received
  uint32_t samples_planned = 0;  // tokens asked of workers (received + in flight)
  // At the current placement: positions the plans sent so far compute, and the prefix to
  // prefill (the whole sequence as it was when placed).
  uint32_t fed = 0, target = 0;
  Placement* placement = nullptr;
  Placement* source = nullptr;  // during a handoff: the prefill worker's placement
  uint64_t transfer_id = 0;
  int64_t transfer_start_us = 0;
  bool awaiting_handoff = false;  // in handoffs_waiting_
  PrefixKeys keys;                // chained keys of the full blocks of `tokens` (prefix cache)
  uint32_t cached_prompt = 0;     // prompt tokens served from the cache at the first placement
  bool placed_once = false;
  bool begun = false;  // its prompt passed admission (begin()): it counts in the e2e metrics
  bool queued = false;
  uint64_t prompt_job = 0;  // > 0 while its prompt is being made into ids (Core::tokenizing_)
  uint64_t order = 0;
  int64_t arrival_us = 0, scheduled_us = -1, first_token_us = -1, last_token_us = -1, deadline_us = 0;
  StopTokenMatcher stop_tokens;
  StopStringMatcher stop_strings;
  Detokenizer detok;
  std::string text, emit;
  RequestEvents held;  // tokens of a non-streaming request, sent with the final event
  explicit Request(const model::Tokenizer& t) : detok(t) {}
};

struct Core::Worker {
  uint32_t id = 0;
  Role role = Role::kBoth;
  std::string kv_endpoint, kv_public_key, kv_sender_key;
  uint32_t spec_tokens = 0;  // WorkerInfo::spec_tokens
  uint32_t max_running = 0;  // SchedulerConfig::max_running, within WorkerInfo::state_slots
  uint32_t state_slots = 0;  // WorkerInfo::state_slots
  KvCacheManager kv;
  std::vector<Placement*> running;  // in placement order (the newest is preempted first)
  struct InFlight {
    uint64_t step_id;
    std::vector<uint64_t> seqs;
    std::vector<uint32_t> reserves;  // per entry of seqs: a speculating round's reserved positions, else 0
    bool queued_behind = false;      // sent while another plan was in flight: the worker should not wait for it
    uint32_t tokens = 0;             // computed by the plan (a decode counts one): its StepHistory bucket
    uint32_t prompt_tokens = 0;      // of which prompt tokens (the rest are decodes): for its StepCost
    int64_t sent_us = 0;
  };
  std::deque<InFlight> inflight;  // plans sent and not yet answered, in order
  std::vector<uint64_t> to_release;
  uint64_t next_step = 1;
  bool short_of_blocks = false;  // the last plan left a decode out for want of blocks
  int64_t last_answer_us = 0;    // when its last result came: the next plan's step began then
  StepHistory step_times;        // for the per-step deadline (overdue_worker)
  StepCost cost;                 // for the step-time target (prompt_allowance)
  WorkerStats stats;
  Worker(const WorkerInfo& info, const SchedulerConfig& config)
      : kv(info.kv_blocks, info.block_tokens, info.tail_blocks, config.prefix_cache, config.block_hash) {
    // Rings: a round's trim cuts back at most its drafts (the margin); a step computes at most a
    // prompt chunk or a round's 1 + drafts positions of a sequence.
    const uint32_t drafts = info.role == Role::kPrefill ? 0 : std::min(info.spec_tokens, WorkerInfo::kMaxSpecTokens);
    kv.set_rings(info.ring_blocks, info.ring_window, drafts, std::max(config.prefill_chunk, 1 + drafts));
  }
  // When the worker could begin `plan`: once sent, and once the plan before it was answered.
  int64_t step_start(const InFlight& plan) const { return std::max(plan.sent_us, last_answer_us); }
};

namespace {

// A sequence of a plan whose result came (on_result marks the plan's list): no sequence has it.
constexpr uint64_t kAnswered = ~uint64_t{0};

constexpr size_t kHandoffTimes = 4096;

template <typename T>
void erase_one(std::vector<T>& v, const T& x) {
  if (auto it = std::find(v.begin(), v.end(), x); it != v.end()) v.erase(it);
}

}  // namespace

Core::Core(SchedulerConfig config, model::ModelConfig model, const model::Tokenizer& tokenizer, Sink& sink)
    : Core(config, model, PromptRenderer(tokenizer, std::nullopt), sink) {}

Core::Core(SchedulerConfig config, model::ModelConfig model, PromptRenderer renderer, Sink& sink)
    : config_(config), model_(model), renderer_(std::move(renderer)), sink_(sink), metrics_(model.context_length) {
  limits_.context_length = model_.context_length;
  limits_.vocab_size = model_.vocab_size;
}

Core::~Core() = default;

std::string Core::key(const std::string& client, const std::string& id) {
  std::string k;
  k.reserve(client.size() + id.size() + 1);
  k.append(client).push_back('\0');
  k.append(id);
  return k;
}

std::string Core::account(const std::string& client, const std::string& principal) { return key(client, principal); }

uint32_t Core::running() const {
  uint32_t n = 0;
  for (const auto& [id, w] : workers_) n += static_cast<uint32_t>(w->running.size());
  return n;
}

std::vector<Core::WorkerView> Core::workers() const {
  std::vector<WorkerView> out;
  for (const auto& [id, w] : workers_) {
    const auto running = static_cast<uint32_t>(w->running.size());
    out.push_back({id, w->kv.total(), w->kv.free(), running, &w->stats, w->role, w->kv.cached(), w->kv.evictions(),
                   w->spec_tokens, w->state_slots, w->state_slots > running ? w->state_slots - running : 0,
                   w->kv.ring_total(), w->kv.ring_free(), w->kv.ring_cached(), w->kv.checkpoints_total(),
                   w->kv.checkpoints_free()});
  }
  return out;
}

bool Core::takes_prompts(const Worker& w) const {
  return w.role == Role::kBoth || (w.role == Role::kPrefill && decode_workers_ > 0);
}

bool Core::ready() const {
  for (const auto& [id, w] : workers_)
    if (takes_prompts(*w)) return true;
  return false;
}

std::string Core::unready_reason() const {
  if (workers_.empty()) return "no worker is available";
  if (decode_workers_ == 0) return "no decode worker is available (prefill workers hand every sequence to one)";
  return "no worker takes prompts (decode workers need a prefill worker)";
}

uint32_t Core::live_requests(const std::string& client) const {
  uint32_t n = 0;
  for (const auto& [k, r] : requests_) n += r->client == client;
  return n;
}

void Core::add_worker(uint32_t worker_id, const WorkerInfo& info, int64_t now_us) {
  auto w = std::make_unique<Worker>(info, config_);
  w->id = worker_id;
  w->role = info.role;
  w->kv_endpoint = info.kv_endpoint;
  w->kv_public_key = info.kv_public_key;
  w->kv_sender_key = info.kv_sender_key;
  w->spec_tokens = info.role == Role::kPrefill ? 0 : std::min(info.spec_tokens, WorkerInfo::kMaxSpecTokens);
  w->state_slots = info.state_slots;
  // A hybrid's cached prefix resumes only from a state checkpoint (none: no prefix cache).
  if (model_.arch->hybrid()) w->kv.set_checkpoints(info.state_checkpoints, info.checkpoint_interval);
  w->max_running = info.state_slots > 0 ? std::min(config_.max_running, info.state_slots) : config_.max_running;
  w->stats.registered_us = now_us;
  decode_workers_ += info.role == Role::kDecode;
  workers_[worker_id] = std::move(w);
}

void Core::remove_worker(uint32_t worker_id, int64_t now_us) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  std::unique_ptr<Worker> w = std::move(it->second);
  workers_.erase(it);
  decode_workers_ -= w->role == Role::kDecode;
  // Its placements die with it (the pool is gone); their requests start over elsewhere,
  // and so do those whose KV it was sending (the handoff will never complete).
  std::vector<Request*> orphans;
  for (Placement* p : w->running) {
    if (p->owner) {
      p->owner->placement = nullptr;
      orphans.push_back(p->owner);
    }
    if (p->sending_for) {
      p->sending_for->source = nullptr;
      if (std::find(orphans.begin(), orphans.end(), p->sending_for) == orphans.end()) orphans.push_back(p->sending_for);
    }
    by_seq_.erase(p->seq_id);
  }
  for (Request* r : orphans) {
    if (r->source || r->placement) ++stats_.handoff_failures;  // a handoff that lost one of its ends
    if (!ready()) {
      finish(*r, v1::FINISH_REASON_ERROR, v1::ERROR_CODE_UNAVAILABLE,
             "the worker serving this request is gone and no other worker can take it", now_us);
    } else {
      requeue(*r);
    }
  }
  if (!ready()) {
    while (!queue_.empty())
      finish(*queue_.front(), v1::FINISH_REASON_ERROR, v1::ERROR_CODE_UNAVAILABLE, unready_reason(), now_us);
  }
  // Prefill done, waiting for a decode worker that is no longer there.
  if (decode_workers_ == 0) {
    std::vector<Request*> stranded = handoffs_waiting_;
    for (Request* r : stranded)
      finish(*r, v1::FINISH_REASON_ERROR, v1::ERROR_CODE_UNAVAILABLE, "no decode worker is available", now_us);
  }
}

void Core::reject(const std::string& client, const std::string& request_id, v1::ErrorCode code,
                  const std::string& message) {
  metrics_.refuse(code);
  RequestEvents ev;
  sink_.send_events(client, set_refusal(ev, request_id, code, message));
}

bool Core::refuse_unservable(const std::string& client, const std::string& k, const RequestSpec& spec) {
  if (requests_.count(k)) {
    reject(client, spec.id, v1::ERROR_CODE_INVALID_ARGUMENT,
           "request_id: '" + spec.id + "' is already in use by a live request of this client");
  } else if (auto live = live_per_account_.find(account(client, spec.principal));
             config_.max_client_requests && live != live_per_account_.end() &&
             live->second >= config_.max_client_requests) {
    const std::string who = spec.principal.empty() ? "this client" : "principal '" + spec.principal + "'";
    reject(client, spec.id, v1::ERROR_CODE_OVERLOADED,
           who + " has " + std::to_string(live->second) +
               " live requests, the most one client or principal may have (" +
               std::to_string(config_.max_client_requests) + "); retry when some have ended");
  } else if (queued() >= config_.max_queue) {
    reject(client, spec.id, v1::ERROR_CODE_OVERLOADED,
           "the waiting queue is full (" + std::to_string(config_.max_queue) + " requests); retry later");
  } else if (workers_.empty()) {
    reject(client, spec.id, v1::ERROR_CODE_UNAVAILABLE, "no worker is registered");
  } else if (!ready()) {
    reject(client, spec.id, v1::ERROR_CODE_UNAVAILABLE, unready_reason());
  } else {
    return false;
  }
  return true;
}

std::string Core::exceeds_kv(const RequestSpec& spec) const {
  uint64_t largest = 0;
  for (const auto& [id, w] : workers_)
    if (w->role != Role::kPrefill) largest = std::max(largest, w->kv.capacity_tokens());
  const uint32_t need = static_cast<uint32_t>(spec.prompt.size()) + spec.max_tokens;
  if (need <= largest) return "";
  return "prompt + max_tokens = " + std::to_string(need) + " tokens exceeds the KV cache of the largest worker (" +
         std::to_string(largest) + " tokens)";
}

uint64_t Core::random_u64() {
  uint64_t v = 0;
  // getrandom(2) without flags blocks only before the kernel's pool is first seeded (at boot).
  while (::getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) {
  }
  return v;
}

void Core::submit(const std::string& client, const v1::Submit& submit, int64_t now_us) {
  auto spec = admit_fields(submit, limits_);
  if (!spec) {
    // An id past the limit is echoed cut to it (set_refusal): a client sending long ids must
    // not make the scheduler queue long refusals for it.
    reject(client, submit.request_id(), v1::ERROR_CODE_INVALID_ARGUMENT, spec.status().message());
    return;
  }
  const std::string k = key(client, spec->id);
  if (refuse_unservable(client, k, *spec)) return;
  auto stop_tokens = StopTokenMatcher::build(spec->stop_token_sequences);
  auto stop_strings = StopStringMatcher::build(spec->stop_strings, spec->include_stop_string);
  if (!stop_tokens || !stop_strings) {
    const Status& st = !stop_tokens ? stop_tokens.status() : stop_strings.status();
    reject(client, spec->id, v1::ERROR_CODE_INVALID_ARGUMENT, st.message());
    return;
  }
  if (std::optional<PromptInput>& in = spec->prompt_input) {
    // Long text and conversations are made into ids off this thread; the request waits live.
    if ((in->chat || in->text.size() > config_.inline_prompt_bytes) && sink_.renders_async()) {
      const uint64_t job = next_prompt_job_++;
      sink_.render_async(job, std::move(*in));
      in.reset();
      Request& r = add_request(client, k, std::move(spec.value()), now_us);
      r.stop_tokens = std::move(stop_tokens.value());
      r.stop_strings = std::move(stop_strings.value());
      r.prompt_job = job;
      tokenizing_[job] = &r;
      return;
    }
    auto ids = renderer_.render(*in);
    if (!ids) return reject(client, spec->id, v1::ERROR_CODE_INVALID_ARGUMENT, ids.status().message());
    spec->prompt = std::move(ids).value();
  }
  Status st = admit_prompt_ids(*spec, limits_);
  if (!st) return reject(client, spec->id, v1::ERROR_CODE_INVALID_ARGUMENT, st.message());
  // Every sequence must fit one worker's pool, or it could never run.
  if (const std::string too_big = exceeds_kv(*spec); !too_big.empty())
    return reject(client, spec->id, v1::ERROR_CODE_INVALID_ARGUMENT, too_big);
  Request& r = add_request(client, k, std::move(spec.value()), now_us);
  r.stop_tokens = std::move(stop_tokens.value());
  r.stop_strings = std::move(stop_strings.value());
  begin(r);
}

void Core::on_prompt(uint64_t job, Result<std::vector<int32_t>> ids, int64_t now_us) {
  auto it = tokenizing_.find(job);
  if (it == tokenizing_.end()) return;  // its request ended while its prompt was tokenized
  Request& r = *it->second;
  tokenizing_.erase(it);
  r.prompt_job = 0;
  if (!ids) return finish(r, v1::FINISH_REASON_ERROR, v1::ERROR_CODE_INVALID_ARGUMENT, ids.status().message(), now_us);
  r.spec.prompt = std::move(ids).value();
  std::string error;
  if (Status st = admit_prompt_ids(r.spec, limits_); !st) error = st.message();
  if (error.empty()) error = exceeds_kv(r.spec);
  if (!error.empty()) return finish(r, v1::FINISH_REASON_ERROR, v1::ERROR_CODE_INVALID_ARGUMENT, error, now_us);
  if (!ready()) return finish(r, v1::FINISH_REASON_ERROR, v1::ERROR_CODE_UNAVAILABLE, unready_reason(), now_us);
  begin(r);
}

Core::Request& Core::add_request(const std::string& client, const std::string& k, RequestSpec spec, int64_t now_us) {
  auto r = std::make_unique<Request>(renderer_.tokenizer());
  r->client = client;
  r->key = k;
  r->account = account(client, spec.principal);
  r->spec = std::move(spec);
  r->arrival_us = now_us;
  r->deadline_us = r->spec.timeout_ms ? now_us + int64_t{r->spec.timeout_ms} * 1000 : 0;
  r->order = stats_.requests++;
  r->held.request_id = r->spec.id;
  Request& raw = *r;
  requests_[k] = std::move(r);
  ++live_per_account_[raw.account];
  return raw;
}

void Core::begin(Request& r) {
  r.begun = true;
  r.tokens = r.spec.prompt;
  r.tokens.reserve(r.tokens.size() + r.spec.max_tokens);
  r.prompt_len = static_cast<uint32_t>(r.tokens.size());
  enqueue(r);
}

void Core::cancel(const std::string& client, const std::string& request_id, int64_t now_us) {
  if (request_id.size() > limits_.max_request_id_bytes) return;  // no live request has such an id
  auto it = requests_.find(key(client, request_id));
  if (it == requests_.end()) return;  // already finished: its final event is on the way
  finish(*it->second, v1::FINISH_REASON_CANCELLED, v1::ERROR_CODE_UNSPECIFIED, "cancelled by the client", now_us);
}

void Core::client_gone(const std::string& client, int64_t now_us, const std::string& reason) {
  std::vector<Request*> mine;
  for (auto& [k, r] : requests_)
    if (r->client == client) mine.push_back(r.get());
  for (Request* r : mine) finish(*r, v1::FINISH_REASON_CANCELLED, v1::ERROR_CODE_UNSPECIFIED, reason, now_us);
}

void Core::cancel_all(const std::string& message, int64_t now_us) {
  std::vector<Request*> all;
  for (auto& [k, r] : requests_) all.push_back(r.get());
  for (Request* r : all) finish(*r, v1::FINISH_REASON_CANCELLED, v1::ERROR_CODE_UNSPECIFIED, message, now_us);
}

void Core::enqueue(Request& r) {
  r.queued = true;
  // Priority first (higher first), then arrival order.
  auto pos = std::find_if(queue_.begin(), queue_.end(), [&](Request* q) {
    return q->spec.priority < r.spec.priority || (q->spec.priority == r.spec.priority && q->order > r.order);
  });
  queue_.insert(pos, &r);
}

void Core::detach(Request& r) {
  end_handoff(r);
  if (r.awaiting_handoff) {
    erase_one(handoffs_waiting_, &r);
    r.awaiting_handoff = false;
  }
  if (Placement* p = r.placement) {
    r.placement = nullptr;
    p->owner = nullptr;
    retire(*p);
  }
}

void Core::end_handoff(Request& r) {
  if (Placement* src = r.source) {
    r.source = nullptr;
    src->sending_for = nullptr;
    retire(*src);
  }
}

void Core::retire(Placement& p) {
  if (p.inflight > 0 || p.sending_for) return;  // on_result / end_handoff retire it later
  auto wit = workers_.find(p.worker_id);
  if (wit != workers_.end()) {
    Worker& w = *wit->second;
    w.kv.free(p.kv);
    if (p.appeared) w.to_release.push_back(p.seq_id);
    w.running.erase(std::find(w.running.begin(), w.running.end(), &p));
    w.stats.running = static_cast<uint32_t>(w.running.size());
  }
  by_seq_.erase(p.seq_id);  // destroys p
}

// Preemption by recompute: the sequence gives its blocks back and waits in the queue with
// its prompt and the tokens generated so far as its new prompt. Sampling is a function of
// (seed, position), so it continues with the same tokens.
void Core::requeue(Request& r) {
  detach(r);
  r.fed = r.target = 0;
  r.samples_planned = r.generated;
  enqueue(r);
}

void Core::finish(Request& r, v1::FinishReason reason, v1::ErrorCode code, const std::string& message, int64_t now_us,
                  RequestEvents* carry) {
  if (r.queued) {
    queue_.erase(std::find(queue_.begin(), queue_.end(), &r));
    r.queued = false;
  }
  if (r.prompt_job) {
    tokenizing_.erase(r.prompt_job);  // its ids, if they still come, are ignored
    sink_.cancel_render(r.prompt_job);
  }
  detach(r);
  RequestEvents* out = carry;
  if (!out) {
    out = r.spec.stream ? &events_ : &r.held;
    if (r.spec.stream) {
      events_.clear();
      events_.request_id = r.spec.id;
    }
  }
  FinalEvent& f = set_final(*out, reason, code, message);
  // Bytes still held back: an incomplete character, or text that might have begun a stop string.
  r.text.clear();
  r.emit.clear();
  r.detok.flush(r.text);
  if (!r.stop_strings.feed(r.text, r.emit)) r.stop_strings.flush(r.emit);
  f.text = r.emit;
  f.accounted = true;
  f.prompt_tokens = r.prompt_len;
  f.completion_tokens = r.generated;
  f.cached_prompt_tokens = r.cached_prompt;
  const int64_t scheduled = r.scheduled_us >= 0 ? r.scheduled_us : now_us;
  f.queue_ms = (scheduled - r.arrival_us) / 1e3;
  f.ttft_ms = r.first_token_us >= 0 ? (r.first_token_us - r.arrival_us) / 1e3 : 0.0;
  f.total_ms = (now_us - r.arrival_us) / 1e3;
  f.principal = r.spec.principal;
  record_end(r, reason, code, scheduled, now_us);
  sink_.send_events(r.client, *out);
  ++stats_.finished;
  if (auto it = live_per_account_.find(r.account); it != live_per_account_.end() && --it->second == 0)
    live_per_account_.erase(it);
  requests_.erase(r.key);  // destroys r
}

void Core::record_end(const Request& r, v1::FinishReason reason, v1::ErrorCode code, int64_t scheduled_us,
                      int64_t now_us) {
  // A prompt refused once its ids came (made off the planning thread) is a refusal, as the same
  // prompt refused at submit would be.
  if (!r.begun && reason == v1::FINISH_REASON_ERROR) return metrics_.refuse(code);
  metrics_.e2e[static_cast<size_t>(end_reason(reason))].observe(double(now_us - r.arrival_us) / 1e6);
  metrics_.queue.observe(double(scheduled_us - r.arrival_us) / 1e6);
  metrics_.prompt_tokens.observe(r.prompt_len);
  metrics_.generation_tokens.observe(r.generated);
}

bool Core::place(Request& r, int64_t now_us) {
  const uint32_t target = static_cast<uint32_t>(r.tokens.size());
  // Per candidate: the blocks of its longest cached prefix (at least one position is left
  // to compute: its logits give the next token).
  struct Candidate {
    Worker* w;
    PrefixHit hit;
  };
  std::vector<Candidate> candidates;
  for (auto& [id, w] : workers_) {
    // A decode worker takes a prompt only when its cache holds all of it but at most one
    // chunk (a conversation's next turn: its last answer was decoded there); see below.
    const bool decode = w->role == Role::kDecode;
    if ((!takes_prompts(*w) && !(decode && config_.prefix_cache)) || w->running.size() >= w->max_running ||
        w->short_of_blocks)
      continue;
    PrefixHit hit = w->kv.match_prefix(r.tokens, r.keys);
    if (!w->kv.has_room(hit, target, static_cast<uint32_t>(w->running.size()))) continue;
    if (decode && (hit.empty() || target - w->kv.hit_tokens(hit) > config_.prefill_chunk)) continue;
    candidates.push_back({w.get(), std::move(hit)});
  }
  // The least loaded of the workers that take prompts; the longest cached prefix anywhere,
  // a prompt-taking worker first on a tie (a decode worker's copy only wins when longer).
  const Candidate* least = nullptr;
  const Candidate* longest = nullptr;
  for (const Candidate& c : candidates) {
    const size_t run = c.w->running.size();
    const bool decode = c.w->role == Role::kDecode;
    if (!decode && (!least || run < least->w->running.size() ||
                    (run == least->w->running.size() && c.w->kv.available() > least->w->kv.available())))
      least = &c;
    if (!longest || c.hit.blocks() > longest->hit.blocks() ||
        (c.hit.blocks() == longest->hit.blocks() && (longest->w->role == Role::kDecode) > decode) ||
        (c.hit.blocks() == longest->hit.blocks() && (longest->w->role == Role::kDecode) == decode &&
         run < longest->w->running.size()))
      longest = &c;
  }
  if (!longest) return false;
  if (!least) least = longest;  // only a decode worker's cache can take it now
  // Cache-aware: the longest prefix wins unless its worker is loaded well beyond the least loaded.
  const Candidate& chosen =
      !longest->hit.empty() && longest->w->running.size() <= least->w->running.size() + config_.cache_balance_slack
          ? *longest
          : *least;
  Worker* best = chosen.w;
  auto p = std::make_unique<Placement>();
  p->seq_id = next_seq_++;
  p->worker_id = best->id;
  p->owner = &r;
  if (!best->kv.allocate_slots(p->kv, target, chosen.hit)) return false;
  const uint32_t cached = best->kv.hit_tokens(chosen.hit);
  best->running.push_back(p.get());
  best->stats.running = static_cast<uint32_t>(best->running.size());
  if (!r.placed_once) {
    r.placed_once = true;
    r.cached_prompt = std::min(cached, r.prompt_len);
    stats_.prompt_tokens += r.prompt_len;
    stats_.cached_prompt_tokens += r.cached_prompt;
  }
  r.placement = p.get();
  r.fed = cached;
  r.target = target;
  r.queued = false;
  if (r.scheduled_us < 0) r.scheduled_us = now_us;
  by_seq_[p->seq_id] = std::move(p);
  return true;
}

uint32_t Core::tokens_wanted(const Worker& w, const Request& r) const {
  if (r.fed < r.target) return std::min(config_.prefill_chunk, r.target - r.fed);  // a prompt: a chunk
  // A decode: one position past those computed (the worker feeds the token it sampled), and
  // a speculating one room for its drafts. A prefill worker's sequences decode elsewhere (handoff).
  if (w.role == Role::kPrefill || r.samples_planned >= r.spec.max_tokens) return 0;
  return speculates(w, r) ? spec_wanted(w, r) : 1;
}

bool Core::speculates(const Worker& w, const Request& r) {
  return w.spec_tokens > 0 && r.spec.spec_tokens.value_or(1) > 0;
}

uint32_t Core::spec_wanted(const Worker& w, const Request& r) const {
  // r.fed is at most what the worker holds once the rounds in flight ran (each may accept every
  // draft): at the context, wait for their results to say how far they really went.
  if (r.fed + 1 > model_.context_length) return 0;
  const uint32_t remaining = r.spec.max_tokens - r.samples_planned;  // at least 1 (tokens_wanted)
  uint32_t k = std::min(
      {w.spec_tokens, r.spec.spec_tokens.value_or(w.spec_tokens), remaining - 1, model_.context_length - r.fed - 1});
  if (r.spec.sampling.top_logprobs > 0) k = 0;  // the worker does not speculate these (one token's top)
  return 1 + k;
}

uint32_t Core::order_for_step(const Worker& w) {
  // Decoding sequences first, then prompts, each in placement order: a stream advances in
  // every step and a prompt chunk only takes what the decodes left (Sarathi-Serve's
  // stall-free batching). A placement preemption retires is nulled here (preempt_for).
  snapshot_.clear();
  prompts_.clear();
  for (Placement* q : w.running) (q->owner && q->owner->fed >= q->owner->target ? snapshot_ : prompts_).push_back(q);
  const auto decoding = static_cast<uint32_t>(snapshot_.size());
  snapshot_.insert(snapshot_.end(), prompts_.begin(), prompts_.end());
  return decoding;
}

uint32_t Core::prompt_allowance(const Worker& w, uint32_t decoding) const {
  if (config_.target_step_ms == 0 || decoding == 0) return UINT32_MAX;
  const std::optional<uint32_t> fits = w.cost.prompt_tokens_within(int64_t{config_.target_step_ms} * 1000, decoding);
  return fits ? std::max(*fits, SchedulerConfig::kMinPromptTokens) : UINT32_MAX;  // prompts always progress
}

Core::Slots Core::preempt_for(Worker& w, Placement& p, uint32_t positions, const std::vector<uint64_t>& seqs) {
  // Out of blocks: the newest sequence not already in this step goes back to the queue
  // (recompute). If that is this one, it waits itself; else its blocks come back now, or
  // when its plans in flight do. While an earlier victim's blocks are still on their way
  // back, wait for them instead of preempting more.
  bool returning = false;
  for (const Placement* q : w.running) returning |= !q->owner && q->kv.blocks() > 0;
  Placement* victim = nullptr;
  for (auto it = w.running.rbegin(); it != w.running.rend() && !victim && !returning; ++it)
    if ((*it)->owner && std::find(seqs.begin(), seqs.end(), (*it)->seq_id) == seqs.end()) victim = *it;
  if (!victim) return Slots::kShort;
  ++stats_.preemptions;
  // Retiring destroys the victim's placement here (its source, if any, is another worker's).
  std::replace(snapshot_.begin(), snapshot_.end(), victim, static_cast<Placement*>(nullptr));
  requeue(*victim->owner);
  if (victim == &p) return Slots::kPreempted;
  return w.kv.allocate_slots(p.kv, positions) ? Slots::kReserved : Slots::kShort;
}

void Core::plan_tokens(Worker& w, Placement& p, Request& r, uint32_t n, std::vector<uint64_t>& seqs,
                       std::vector<uint32_t>& reserves) {
  SeqPlan& s = plan_.add_seq();
  s.seq_id = p.seq_id;
  s.keep_blocks = w.kv.take_cut(p.kv);
  for (int32_t b : w.kv.take_unsent(p.kv)) s.new_blocks.push_back(b);
  const std::span<const int32_t> ring = w.kv.ring(p.kv);
  s.ring.assign(ring.begin(), ring.end());
  s.ring_first = p.kv.ring_first();
  seqs.push_back(p.seq_id);
  ++p.inflight;  // the plan goes out: it has a sequence
  const bool prompt = r.fed < r.target;
  // A speculating decode continues from the worker's positions, which the scheduler knows only
  // up to the rounds in flight; r.fed counts every round's whole reserve until its result.
  s.speculate = !prompt && speculates(w, r);
  if (s.speculate) {
    s.max_drafts = n - 1;
    s.max_len = std::min(r.prompt_len + r.spec.max_tokens, model_.context_length);
    p.reserved += n;
  }
  reserves.push_back(s.speculate ? n : 0);
  // A prompt's tokens travel; a decode's one is the worker's own last sample.
  if (prompt) s.tokens.assign(r.tokens.begin() + r.fed, r.tokens.begin() + r.fed + n);
  s.start_pos = r.fed;
  const bool sample = !prompt || r.fed + n == r.target;  // a prompt's last chunk samples
  s.sample = sample;
  if (!p.appeared) {
    s.first = true;
    s.sampling = r.spec.sampling;
    s.logprobs = r.spec.logprobs;
    s.prompt_len = r.prompt_len;
    // A cached prefix: the worker takes its tokens as the sequence's history.
    if (r.fed > 0) s.history.assign(r.tokens.begin(), r.tokens.begin() + r.fed);
    const std::span<const int32_t> tail = w.kv.tail(p.kv);
    s.tail_blocks.assign(tail.begin(), tail.end());
    s.request_id = r.spec.id;
    s.principal = r.spec.principal;
    s.restore_checkpoint = w.kv.take_restore(p.kv);
    p.appeared = true;
  }
  r.fed += n;
  if (sample) ++r.samples_planned;
  publish(w, p, r);
  if (prompt && p.ready) s.save_checkpoint = w.kv.save_checkpoint(p.kv, r.tokens, r.fed, r.keys);
}

// One token-budget loop (vLLM v1's scheduler): each running sequence asks for
// min(its goal - computed, chunk, budget) tokens, 1 for a decode and a chunk for a prompt,
// in the order order_for_step gives; there is no prefill phase and no decode phase.
bool Core::build_plan(Worker& w, int64_t now_us) {
  plan_.clear();
  uint32_t budget = config_.max_batch_tokens, decodes = 0, prefill = 0;
  bool stalled = false;
  std::vector<uint64_t> seqs;
  std::vector<uint32_t> reserves;
  uint32_t prompt_room = prompt_allowance(w, order_for_step(w));
  for (Placement* q : snapshot_) {
    if (!q) continue;  // preempted while this step was built
    Placement& p = *q;
    Request* r = p.owner;
    if (!r || !p.ready) continue;
    const uint32_t want = tokens_wanted(w, *r);
    if (want == 0) continue;
    const bool prompt = r->fed < r->target;
    if (budget == 0) {
      stats_.decode_stalls += !prompt;  // a stream left out of a step it was ready for
      continue;
    }
    uint32_t n = std::min({want, budget, prompt ? prompt_room : want});
    if (n == 0) continue;
    if (prompt && w.kv.checkpointed()) n = w.kv.checkpoint_chunk(p.kv, r->tokens, r->fed, n, r->keys);
    // Rings: the window has passed the blocks before the lowest position this step may compute
    // (a speculating sequence's rounds in flight may accept no draft: its committed positions).
    if (w.kv.rings()) w.kv.release_window(p.kv, r->fed - p.reserved);
    const Slots slots = w.kv.allocate_slots(p.kv, r->fed + n) ? Slots::kReserved : preempt_for(w, p, r->fed + n, seqs);
    if (slots == Slots::kPreempted) continue;
    if (slots == Slots::kShort) {
      ++stats_.decode_stalls;
      stalled = true;
      continue;
    }
    plan_tokens(w, p, *r, n, seqs, reserves);
    budget -= n;  // a speculating decode counts its drafts' room
    if (prompt) {
      prefill += n;
      prompt_room -= n;
    } else {
      ++decodes;
    }
  }
  w.short_of_blocks = stalled;
  plan_.release.assign(w.to_release.begin(), w.to_release.end());
  w.to_release.clear();
  if (plan_.seqs().empty() && plan_.release.empty()) return false;
  plan_.step_id = w.next_step++;
  w.inflight.push_back(
      {plan_.step_id, std::move(seqs), std::move(reserves), !w.inflight.empty(), decodes + prefill, prefill, now_us});
  ++stats_.steps;
  stats_.max_step_decode = std::max(stats_.max_step_decode, decodes);
  stats_.max_step_prefill_tokens = std::max(stats_.max_step_prefill_tokens, prefill);
  sink_.send_plan(w.id, plan_);
  return true;
}

void Core::schedule(int64_t now_us) {
  // Handoffs first: they free prefill workers' blocks for the queue.
  for (size_t i = 0; i < handoffs_waiting_.size();) {
    Request* r = handoffs_waiting_[i];
    if (start_handoff(*r, now_us)) {
      r->awaiting_handoff = false;
      handoffs_waiting_.erase(handoffs_waiting_.begin() + static_cast<ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  while (!queue_.empty()) {
    Request& r = *queue_.front();
    if (place(r, now_us)) {
      queue_.pop_front();
      continue;
    }
    // A request no worker could ever hold (its worker left) ends now instead of waiting forever.
    const uint32_t need = static_cast<uint32_t>(r.prompt_len) + r.spec.max_tokens;
    bool fits = false;
    for (const auto& [id, w] : workers_) fits |= w->role != Role::kPrefill && w->kv.can_ever_fit(need);
    if (fits) break;
    finish(r, v1::FINISH_REASON_ERROR, v1::ERROR_CODE_UNAVAILABLE,
           "no remaining worker has KV room for " + std::to_string(need) + " tokens", now_us);
  }
  for (auto& [id, w] : workers_)
    while (w->inflight.size() < config_.pipeline_depth && build_plan(*w, now_us)) {
    }
}

void Core::tick(int64_t now_us) {
  std::vector<Request*> late;
  for (auto& [k, r] : requests_)
    if (r->deadline_us && now_us >= r->deadline_us) late.push_back(r.get());
  for (Request* r : late)
    finish(*r, v1::FINISH_REASON_CANCELLED, v1::ERROR_CODE_UNSPECIFIED, "deadline exceeded", now_us);
  // A handoff not acknowledged in time (the decode worker is hung, the transfer was lost):
  // recompute the sequence elsewhere. Its streamed tokens are part of the new prompt, so
  // the client sees no duplicate and no gap.
  std::vector<Request*> stuck;
  for (auto& [k, r] : requests_)
    if (r->source && now_us - r->transfer_start_us > int64_t{config_.handoff_timeout_ms} * 1000)
      stuck.push_back(r.get());
  for (Request* r : stuck) {
    ++stats_.handoff_failures;
    requeue(*r);
  }
  schedule(now_us);
  // Debug builds: every worker's blocks are free, cached or in use, and nothing else
  // (free + cached + used = total, the LRU list and key map agree). O(blocks) per tick.
  assert(std::all_of(workers_.begin(), workers_.end(), [](const auto& w) { return w.second->kv.consistent(); }));
}

std::optional<Core::Overdue> Core::overdue_worker(int64_t now_us) const {
  const int64_t floor_us = int64_t{config_.step_deadline_floor_ms} * 1000;
  for (const auto& [id, w] : workers_) {
    if (w->inflight.empty()) continue;
    const Worker::InFlight& oldest = w->inflight.front();
    const int64_t waited = now_us - w->step_start(oldest);
    const int64_t deadline = w->step_times.deadline_us(oldest.tokens, floor_us);
    if (waited > deadline) return Overdue{id, oldest.step_id, oldest.tokens, waited, deadline};
  }
  return std::nullopt;
}

void Core::postpone_step_deadlines(int64_t us) {
  for (auto& [id, w] : workers_) {
    if (w->last_answer_us) w->last_answer_us += us;
    for (Worker::InFlight& f : w->inflight) f.sent_us += us;
  }
}

void Core::accept_token(Request& r, const SeqResult& s, size_t i, int64_t now_us) {
  const int32_t token = i == 0 ? s.token : s.more_tokens[i - 1];
  r.tokens.push_back(token);
  ++r.generated;
  if (r.first_token_us < 0) {
    r.first_token_us = now_us;
    metrics_.ttft.observe(double(now_us - r.arrival_us) / 1e6);
  } else {
    metrics_.inter_token.observe(double(now_us - r.last_token_us) / 1e6);
  }
  r.last_token_us = now_us;
  RequestEvents* out = &r.held;
  if (r.spec.stream) {
    events_.clear();
    events_.request_id = r.spec.id;
    out = &events_;
  }
  TokenEvent& ev = out->add_token();
  ev.id = token;
  if (r.spec.logprobs) ev.logprob = i == 0 ? s.logprob : (i - 1 < s.more_logprobs.size() ? s.more_logprobs[i - 1] : 0);
  for (size_t t = 0; i == 0 && t < s.top_ids.size() && t < s.top_logprobs.size(); ++t)
    ev.top.push_back({s.top_ids[t], s.top_logprobs[t]});
  r.text.clear();
  r.emit.clear();
  r.detok.push(token, r.text);
  const bool stop_string = r.stop_strings.feed(r.text, r.emit);
  ev.text = r.emit;

  const bool stop_tokens = !r.stop_tokens.empty() && r.stop_tokens.feed(token) > 0;
  const bool eos = renderer_.tokenizer().is_eog(token) && !r.spec.ignore_eos;  // eos, eot, eom, <|im_end|>, ...
  if (stop_string || stop_tokens || eos) {
    finish(r, v1::FINISH_REASON_STOP, v1::ERROR_CODE_UNSPECIFIED, "", now_us, out);
  } else if (r.generated >= r.spec.max_tokens || r.tokens.size() >= model_.context_length) {
    finish(r, v1::FINISH_REASON_LENGTH, v1::ERROR_CODE_UNSPECIFIED, "", now_us, out);
  } else if (r.spec.stream) {
    sink_.send_events(r.client, events_);
  }
}

void Core::on_result(uint32_t worker_id, const StepResult& result, int64_t now_us) {
  auto wit = workers_.find(worker_id);
  if (wit == workers_.end()) return;
  Worker& w = *wit->second;
  if (w.inflight.empty() || w.inflight.front().step_id != result.step_id) return;  // stale
  std::vector<uint64_t> seqs = std::move(w.inflight.front().seqs);
  const std::vector<uint32_t> reserves = std::move(w.inflight.front().reserves);
  const std::vector<uint64_t>& plan_seqs = seqs_scratch_ = seqs;  // seqs is marked as results come
  const bool queued_behind = w.inflight.front().queued_behind;
  {
    const Worker::InFlight& f = w.inflight.front();
    const int64_t wall_us = now_us - w.step_start(f);
    w.step_times.record(f.tokens, wall_us);
    // The worker's own compute time when it reports one: the network and the pipeline are not the step's cost.
    if (result.error_code == v1::ERROR_CODE_UNSPECIFIED)
      w.cost.record(f.prompt_tokens, f.tokens - f.prompt_tokens, result.compute_us > 0 ? result.compute_us : wall_us);
  }
  w.last_answer_us = now_us;
  w.inflight.pop_front();
  ++w.stats.steps;
  w.stats.compute_us += result.compute_us;
  // Idle time counts against the pipeline only when the plan was already on its way while
  // the previous step ran; waiting because there was no work is not a bubble.
  if (queued_behind) w.stats.idle_us += result.idle_us;
  // The plan is answered: its sequences are no longer in flight there.
  for (uint64_t id : seqs)
    if (auto it = by_seq_.find(id); it != by_seq_.end()) --it->second->inflight;
  if (result.error_code != v1::ERROR_CODE_UNSPECIFIED) {
    for (uint64_t id : seqs) {  // what the failed step should have written cannot be shared
      auto it = by_seq_.find(id);
      if (it != by_seq_.end()) w.kv.distrust(it->second->kv);
    }
    for (uint64_t id : seqs) {
      auto it = by_seq_.find(id);
      if (it != by_seq_.end() && it->second->owner)
        finish(*it->second->owner, v1::FINISH_REASON_ERROR, v1::ERROR_CODE_INTERNAL,
               "worker " + std::to_string(worker_id) + " failed the step: " + result.error_message, now_us);
    }
  } else {
    w.stats.drafted += result.drafted;
    w.stats.accepted += result.accepted;
    for (const SeqResult& s : result.seqs) {
      // A worker answers only for the sequences of this plan, each once (a result for another
      // worker's sequence, or a second one for the same, is dropped).
      const auto mine = std::find(seqs.begin(), seqs.end(), s.seq_id);
      if (mine == seqs.end()) continue;
      *mine = kAnswered;
      auto it = by_seq_.find(s.seq_id);
      if (it == by_seq_.end()) continue;
      Request* r = it->second->owner;
      take_result(w, *it->second, s, reserves[static_cast<size_t>(mine - seqs.begin())], now_us);
      // The prompt is done on a prefill worker and the request goes on: hand it off. (The
      // token already went to the client: time to first token does not wait for this.)
      if (w.role != Role::kPrefill || !r) continue;
      it = by_seq_.find(s.seq_id);
      if (it == by_seq_.end() || it->second->owner != r || r->fed < r->target) continue;
      if (!start_handoff(*r, now_us)) {
        r->awaiting_handoff = true;
        handoffs_waiting_.push_back(r);
      }
    }
  }
  // A speculating round the worker did not answer for: its reserve is no longer in flight.
  for (size_t i = 0; i < seqs.size(); ++i)
    if (auto it = by_seq_.find(seqs[i]); seqs[i] != kAnswered && reserves[i] > 0 && it != by_seq_.end())
      it->second->reserved -= reserves[i];
  for (uint64_t id : plan_seqs) {
    auto it = by_seq_.find(id);
    if (it != by_seq_.end() && !it->second->owner) retire(*it->second);
  }
}

void Core::take_result(Worker& w, Placement& p, const SeqResult& s, uint32_t reserve, int64_t now_us) {
  p.reserved -= reserve;
  Request* r = p.owner;
  if (!r || s.token < 0) return;
  // Tokens of the vocabulary only (one outside would fail the next batch that embeds it), and
  // no more than the round had room for.
  const size_t n = 1 + s.more_tokens.size();
  std::string bad;
  if (n > std::max(reserve, 1u))
    bad = "returned " + std::to_string(n) + " tokens for a round of at most " + std::to_string(std::max(reserve, 1u));
  for (size_t i = 0; i < n && bad.empty(); ++i) {
    const int32_t t = i == 0 ? s.token : s.more_tokens[i - 1];
    if (t < 0 || static_cast<uint32_t>(t) >= model_.vocab_size)
      bad = "returned token id " + std::to_string(t) + ", outside the vocabulary (" +
            std::to_string(model_.vocab_size) + " tokens)";
  }
  if (!bad.empty()) {
    finish(*r, v1::FINISH_REASON_ERROR, v1::ERROR_CODE_INTERNAL, "worker " + std::to_string(w.id) + " " + bad, now_us);
    return;
  }
  w.stats.tokens += n;
  stats_.tokens += n;
  w.stats.spec_rounds += reserve > 0;
  r->samples_planned += static_cast<uint32_t>(n - 1);
  const uint64_t seq_id = p.seq_id;
  // In order, while the request lives: a stop or the length inside the round ends it at that
  // token, and nothing after it reaches the client (finish may destroy the placement too).
  for (size_t i = 0; i < n; ++i) {
    auto it = by_seq_.find(seq_id);
    if (it == by_seq_.end() || it->second->owner != r) return;
    accept_token(*r, s, i, now_us);
  }
  auto it = by_seq_.find(seq_id);
  if (reserve == 0 || it == by_seq_.end() || it->second->owner != r) return;
  // The worker now holds every token but the last sampled; the rounds still in flight may
  // each take their whole reserve. Blocks past that go back (no rejected draft stays).
  Placement& live = *it->second;  // p itself: it outlived the tokens
  r->fed = static_cast<uint32_t>(r->tokens.size() - 1) + live.reserved;
  w.kv.trim(live.kv, r->fed);
}

void Core::publish(Worker& w, Placement& p, Request& r) {
  if (!p.ready) return;
  // Tokens the worker will have computed once this plan runs (the token a pipelined decode
  // feeds may not be known here yet).
  const uint32_t known = std::min<uint32_t>(r.fed, static_cast<uint32_t>(r.tokens.size()));
  w.kv.publish(p.kv, r.tokens, known, r.keys);
}

bool Core::start_handoff(Request& r, int64_t now_us) {
  Placement& src = *r.placement;
  const uint32_t positions = r.fed;  // every position but the token just sampled
  // The least loaded decode worker with room (free blocks for the sequence plus headroom
  // for its running ones to grow); ties go to the one running fewer sequences.
  Worker* best = nullptr;
  double best_load = 0;
  for (auto& [id, w] : workers_) {
    if (w->role != Role::kDecode || w->running.size() >= w->max_running || w->short_of_blocks) continue;
    if (!w->kv.has_room({}, positions, static_cast<uint32_t>(w->running.size()))) continue;
    const double load = w->kv.load();
    if (!best || load < best_load || (load == best_load && w->running.size() < best->running.size())) {
      best = w.get();
      best_load = load;
    }
  }
  if (!best) return false;
  auto dp = std::make_unique<Placement>();
  // Rings: the decode worker's ring holds the window its first query (at `positions`) sees; the
  // prefill worker's ring reaches back at least as far (its last step's queries came before).
  best->kv.start_ring_at(dp->kv, positions);
  if (!best->kv.allocate_slots(dp->kv, positions)) return false;
  dp->seq_id = next_seq_++;
  dp->worker_id = best->id;
  dp->owner = &r;
  dp->ready = false;
  dp->appeared = true;  // KvExpect tells the worker about it: it must be told to forget it
  best->kv.mark_sent(dp->kv);
  best->running.push_back(dp.get());
  best->stats.running = static_cast<uint32_t>(best->running.size());

  src.owner = nullptr;
  src.sending_for = &r;
  r.source = &src;
  r.placement = dp.get();
  r.transfer_id = next_transfer_++;
  r.transfer_start_us = now_us;
  const uint64_t nonce = random_u64();

  KvExpect e;
  e.transfer_id = r.transfer_id;
  e.nonce = nonce;
  e.scheduler_epoch = epoch_;
  e.positions = positions;
  if (auto sender = workers_.find(src.worker_id); sender != workers_.end())
    e.sender_public_key = sender->second->kv_sender_key;
  e.seq_id = dp->seq_id;
  e.request_id = r.spec.id;
  e.principal = r.spec.principal;
  const std::span<const int32_t> blocks = best->kv.blocks(dp->kv), tail = best->kv.tail(dp->kv);
  e.blocks.assign(blocks.begin(), blocks.end());
  e.tail_blocks.assign(tail.begin(), tail.end());
  const std::span<const int32_t> ring = best->kv.ring(dp->kv);
  e.ring_blocks.assign(ring.begin(), ring.end());
  e.ring_first = dp->kv.ring_first();
  // What the worker still holds that the scheduler let go of goes first: a hybrid worker takes a
  // state slot for the handoff, and the scheduler counted the released ones free.
  e.release = std::move(best->to_release);
  best->to_release.clear();
  sink_.send_command(best->id, Command(std::move(e)));
  KvSend k;
  k.transfer_id = r.transfer_id;
  k.seq_id = src.seq_id;
  k.dest_seq_id = dp->seq_id;
  k.dest_endpoint = best->kv_endpoint;
  k.dest_public_key = best->kv_public_key;
  k.nonce = nonce;
  k.scheduler_epoch = epoch_;
  k.positions = positions;
  k.ring_first = dp->kv.ring_first();
  sink_.send_command(src.worker_id, Command(std::move(k)));
  by_seq_[dp->seq_id] = std::move(dp);
  return true;
}

void Core::on_kv_received(uint32_t worker_id, const KvReceived& ack, int64_t now_us) {
  auto it = by_seq_.find(ack.seq_id);
  if (it == by_seq_.end()) return;  // cancelled meanwhile: its blocks are already free
  Placement& dp = *it->second;
  Request* r = dp.owner;
  if (dp.worker_id != worker_id || !r || r->transfer_id != ack.transfer_id || !r->source) return;
  if (ack.error_code != v1::ERROR_CODE_UNSPECIFIED) {
    finish(*r, v1::FINISH_REASON_ERROR, v1::ERROR_CODE_INTERNAL,
           "KV handoff to worker " + std::to_string(worker_id) + " failed: " + ack.error_message, now_us);
    return;
  }
  dp.ready = true;  // joins the decode worker's next step
  end_handoff(*r);
  stats_.handoff_bytes += ack.bytes;
  const double ms = double(now_us - r->transfer_start_us) / 1e3;
  metrics_.handoff.observe(ms / 1e3);
  if (stats_.handoff_ms.size() < kHandoffTimes)
    stats_.handoff_ms.push_back(ms);
  else
    stats_.handoff_ms[stats_.handoffs % kHandoffTimes] = ms;
  ++stats_.handoffs;
}

}  // namespace tandem::scheduler
