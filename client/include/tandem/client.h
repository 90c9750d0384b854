// libtandem-client: submit generation requests to a tandem scheduler and stream their
// tokens back. This header is the whole public API; it mentions no ZeroMQ or protobuf
// type, so a service links the library without seeing the wire.
//
// Contract: every request accepted by generate() ends with exactly one final event, even
// when the scheduler is gone, silent, or the Client is destroyed first, or its I/O loop
// fails (then the final event carries error UNAVAILABLE, and a message naming the cause).
// All Client and Stream methods are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tandem/status.h"

namespace tandem {

namespace client_detail {
class Core;
class EventQueue;
class Gate;
}  // namespace client_detail

// One message of a conversation, as chat templates read it; mirrors tandem.v1.ChatMessage.
struct ChatMessage {
  std::string role;                    // system, user, assistant, tool, developer or ipython
  std::optional<std::string> content;  // none: the template sees None (an assistant turn of tool calls)
  std::string name;                    // "" = none
  std::string tool_call_id;            // a tool result's call id; "" = none
  std::string tool_calls_json;         // a JSON array as OpenAI's tool_calls; "" = none
};

// One generation request; mirrors tandem.v1.Submit. The prompt is the first of these given:
// prompt_tokens, messages, prompt_text.
struct GenerateRequest {
  std::string id;                      // empty: the library makes one, unique in this process
  std::string prompt_text;             // tokenized by the scheduler (BOS added unless no_bos)
  std::vector<int32_t> prompt_tokens;  // used as given when non-empty
  // A conversation, rendered by the scheduler with the model's chat template (tools: a JSON
  // array of tool schemas, "" = none; add_generation_prompt opens the assistant's turn), then
  // tokenized with the template's control tokens recognised, BOS once unless no_bos.
  std::vector<ChatMessage> messages;
  std::string tools_json;
  bool add_generation_prompt = true;
  bool no_bos = false;
  // Sampling: the defaults turn every filter off (greedy decoding).
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
  int32_t top_logprobs = 0;
  // OpenAI's penalties, over the tokens generated so far (not the prompt), in [-2, 2]; 0: off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // (token id, bias in [-100, 100]) added to the logits before every other stage; at most
  // 300 entries, each token once.
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint32_t max_tokens = 16;
  std::vector<std::vector<int32_t>> stop_token_sequences;
  std::vector<std::string> stop_strings;
  bool include_stop_string = false;
  bool ignore_eos = false;
  bool logprobs = false;
  int32_t priority = 0;  // higher runs first among waiting requests
  // Speculative decoding on workers that speculate: unset, the worker's --spec-tokens drafts a
  // round; 0, none for this request; K <= 16, at most K.
  std::optional<uint32_t> spec_tokens;
  // Whom a proxy (an HTTP gateway) sends this request for: the scheduler's per-client limits
  // count per principal and its logs name it. "" = the client itself. At most 128 bytes of
  // printable ASCII; with --client-keys only a key listed with `proxy` may set it.
  std::string principal;
  std::chrono::milliseconds timeout{0};  // deadline from arrival at the scheduler; 0 = none
  bool stream = true;                    // false: every token arrives together with the final event
};

struct TokenEvent {
  int32_t id = 0;
  std::string text;  // whole UTF-8 characters; may be empty while a character is split
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // (token id, logprob), best first
};

enum class FinishReason { kStop, kLength, kCancelled, kError };

// "stop", "length", "cancelled", "error".
const char* finish_reason_name(FinishReason reason);

struct FinalEvent {
  FinishReason reason = FinishReason::kError;
  Code code = Code::kOk;   // set when reason == kError
  std::string error_code;  // code_name(code), e.g. "INVALID_ARGUMENT"; empty unless an error
  std::string error_message;
  uint32_t prompt_tokens = 0, completion_tokens = 0, cached_prompt_tokens = 0;
  double queue_ms = 0, ttft_ms = 0, total_ms = 0;
  std::string text;  // bytes held back until the end (an incomplete character, a partial stop string)
};

// A token event, or the final event (final == true), which comes last and exactly once.
struct Event {
  bool final = false;
  TokenEvent token;
  FinalEvent fin;
};

// The events of one request, for synchronous iteration. Obtained from Client::generate;
// stays valid (and ends) after its Client is destroyed.
class Stream {
 public:
  const std::string& id() const { return id_; }
  // Blocks for the next event. Returns false once the final event has been taken.
  bool next(Event& out);
  // The next event, or nothing when none arrives within `wait` or the final event was taken.
  std::optional<Event> next_for(std::chrono::milliseconds wait);
  // Asks the scheduler to cancel; the stream still ends with its final event (kCancelled,
  // or the reason it had already finished with). No effect once finished.
  void cancel();
  // True once the final event has been taken by next()/next_for().
  bool finished() const;

  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

 private:
  friend class client_detail::Core;
  Stream(std::string id, std::weak_ptr<client_detail::Gate> gate);

  const std::string id_;
  const std::weak_ptr<client_detail::Gate> gate_;
  const std::shared_ptr<client_detail::EventQueue> events_;  // filled on the client's I/O thread
};

// What Client::tokenize makes into ids, exactly as the scheduler would make a request's
// prompt: messages (with tools_json, add_generation_prompt) when given, else text.
struct TokenizeRequest {
  std::string text;
  std::vector<ChatMessage> messages;
  std::string tools_json;
  bool add_generation_prompt = true;
  bool no_bos = false;
};

// Mirrors tandem.v1.StatusReply.
struct WorkerInfo {
  uint32_t id = 0;
  std::string role;
  uint32_t pid = 0;
  bool alive = false;
  uint32_t kv_blocks_total = 0, kv_blocks_free = 0;
  uint32_t running = 0;
  uint64_t steps = 0, tokens = 0;
  double idle_share = 0;                 // pipeline bubbles: waiting for a plan already due / (that + compute)
  uint64_t idle_us = 0, compute_us = 0;  // cumulative pipeline idle and compute time
  uint32_t kv_blocks_cached = 0;         // prefix cache; free + cached + in use = total
  uint64_t kv_evictions = 0;
  uint32_t last_heard_ms = 0;               // since the scheduler last heard from it (dead past liveness x heartbeat)
  uint64_t weight_bytes = 0, kv_bytes = 0;  // its weights in memory, its KV pool
  // Speculative decoding: drafts per round at most (0: off), rounds, drafts fed and accepted.
  // Tokens per round: (spec_rounds + drafts_accepted) / spec_rounds.
  uint32_t spec_tokens = 0;
  uint64_t spec_rounds = 0, drafts = 0, drafts_accepted = 0;
  // A hybrid model (qwen35): recurrent state slots, one per sequence held (0: not a hybrid).
  uint32_t state_slots_total = 0, state_slots_free = 0;
  // Rings (--kv-rings): the windowed layers' block pool, total and free (0 total: no rings),
  // and cached (no sequence holds them: the windows of cached prefixes, evictable).
  uint32_t kv_ring_blocks_total = 0, kv_ring_blocks_free = 0, kv_ring_blocks_cached = 0;
  // A hybrid's state checkpoints (its prefix cache's recurrent states): total, holding no cached prefix.
  uint32_t checkpoints_total = 0, checkpoints_free = 0;
};

struct StatusInfo {
  std::vector<WorkerInfo> workers;
  uint32_t queued = 0, running = 0;
  uint64_t requests_total = 0, requests_finished = 0, tokens_generated = 0, steps = 0;
  double scheduler_cpu_ms_per_step = 0;
  bool ready = false;                                         // at least one worker of each needed role is registered
  uint64_t max_step_decode = 0, max_step_prefill_tokens = 0;  // largest step seen
  uint64_t decode_stalls = 0;  // decoding sequences left out of a step (only when out of KV blocks)
  uint64_t preemptions = 0;
  // Prefill -> decode KV handoffs (disaggregated deployments).
  uint64_t handoffs = 0, handoff_bytes = 0, handoff_failures = 0;
  double handoff_ms_mean = 0, handoff_ms_p99 = 0;
  // Prefix cache over first placements.
  uint64_t prompt_tokens = 0, cached_prompt_tokens = 0;
  double prefix_hit_rate = 0;
  bool draining = false;  // admitting nothing: finishing what runs, then exiting
  double tokens_per_s_last_minute = 0;
  uint64_t requests_finished_last_minute = 0;
  uint64_t planning_stalls = 0;  // scheduler loop turns that used > 1 ms of its thread's CPU
};

// Every field of StatusInfo and WorkerInfo, named once, each struct's in the order `tandem
// status --json` prints them: field(name, &Struct::member), `name` being the field's in
// tandem.v1.StatusReply / WorkerStatus and its key in that JSON unless a third argument gives
// the key (nullptr: not printed). The library's mapping from the wire and the CLI's JSON
// printer both walk this list (visit_status_fields), so a new status field is added here, in
// the struct and in the proto, and nowhere else. (StatusInfo::workers is not listed: it nests.)
template <class Field>
void list_status_fields(Field&& field) {
  field("ready", &StatusInfo::ready);
  field("queued", &StatusInfo::queued);
  field("running", &StatusInfo::running);
  field("requests_total", &StatusInfo::requests_total);
  field("requests_finished", &StatusInfo::requests_finished);
  field("tokens_generated", &StatusInfo::tokens_generated);
  field("steps", &StatusInfo::steps);
  field("scheduler_cpu_ms_per_step", &StatusInfo::scheduler_cpu_ms_per_step);
  field("max_step_decode", &StatusInfo::max_step_decode);
  field("max_step_prefill_tokens", &StatusInfo::max_step_prefill_tokens);
  field("decode_stalls", &StatusInfo::decode_stalls);
  field("preemptions", &StatusInfo::preemptions);
  field("handoffs", &StatusInfo::handoffs);
  field("handoff_bytes", &StatusInfo::handoff_bytes);
  field("handoff_failures", &StatusInfo::handoff_failures);
  field("handoff_ms_mean", &StatusInfo::handoff_ms_mean);
  field("handoff_ms_p99", &StatusInfo::handoff_ms_p99);
  field("prompt_tokens", &StatusInfo::prompt_tokens);
  field("cached_prompt_tokens", &StatusInfo::cached_prompt_tokens);
  field("prefix_hit_rate", &StatusInfo::prefix_hit_rate);
  field("draining", &StatusInfo::draining);
  field("tokens_per_s_last_minute", &StatusInfo::tokens_per_s_last_minute);
  field("requests_finished_last_minute", &StatusInfo::requests_finished_last_minute);
  field("planning_stalls", &StatusInfo::planning_stalls);
  field("worker_id", &WorkerInfo::id, "id");
  field("role", &WorkerInfo::role);
  field("pid", &WorkerInfo::pid);
  field("alive", &WorkerInfo::alive);
  field("kv_blocks_total", &WorkerInfo::kv_blocks_total);
  field("kv_blocks_free", &WorkerInfo::kv_blocks_free);
  field("kv_blocks_cached", &WorkerInfo::kv_blocks_cached);
  field("kv_evictions", &WorkerInfo::kv_evictions);
  field("running", &WorkerInfo::running);
  field("steps", &WorkerInfo::steps);
  field("tokens", &WorkerInfo::tokens);
  field("idle_share", &WorkerInfo::idle_share);
  field("last_heard_ms", &WorkerInfo::last_heard_ms);
  field("weight_bytes", &WorkerInfo::weight_bytes);
  field("kv_bytes", &WorkerInfo::kv_bytes);
  field("spec_tokens", &WorkerInfo::spec_tokens);
  field("spec_rounds", &WorkerInfo::spec_rounds);
  field("drafts", &WorkerInfo::drafts);
  field("drafts_accepted", &WorkerInfo::drafts_accepted);
  field("state_slots_total", &WorkerInfo::state_slots_total);
  field("state_slots_free", &WorkerInfo::state_slots_free);
  field("kv_ring_blocks_total", &WorkerInfo::kv_ring_blocks_total);
  field("kv_ring_blocks_free", &WorkerInfo::kv_ring_blocks_free);
  field("kv_ring_blocks_cached", &WorkerInfo::kv_ring_blocks_cached);
  field("checkpoints_total", &WorkerInfo::checkpoints_total);
  field("checkpoints_free", &WorkerInfo::checkpoints_free);
  field("idle_us", &WorkerInfo::idle_us, nullptr);
  field("compute_us", &WorkerInfo::compute_us, nullptr);
}

// Calls visit(json, wire, member) for each field of `info` (a StatusInfo or WorkerInfo, const
// or not), in the list's order.
template <class Info, class Visit>
void visit_status_fields(Info& info, Visit&& visit) {
  list_status_fields([&](const char* wire, auto member, auto... key) {
    const char* json = wire;
    ((json = key), ...);  // the key given, if any
    if constexpr (std::is_invocable_v<decltype(member), Info&>) visit(json, wire, info.*member);
  });
}

// Durations past 100 years are taken as 100 years: milliseconds::max() means "never".
struct ClientOptions {
  std::string endpoint;  // the scheduler's client endpoint, e.g. ipc:///run/tandem/client.sock
  // While requests are in flight, a heartbeat goes out this often; the scheduler cancels
  // the requests of a client silent past its timeout.
  std::chrono::milliseconds heartbeat_interval{500};
  // Default timeout of status().
  std::chrono::milliseconds request_timeout{5000};
  // A request with a timeout that has no final event from the scheduler this long after its
  // deadline ends with UNAVAILABLE (the scheduler itself ends it with kCancelled at the deadline).
  std::chrono::milliseconds deadline_grace{1000};
  // While requests are in flight and the scheduler has sent nothing for this long, the
  // client probes it (a status query); with no answer within twice this, every request in
  // flight ends with UNAVAILABLE. 0 = off (then only deadlines and disconnects end them).
  std::chrono::milliseconds liveness_timeout{5000};
  // The scheduler's CurveZMQ public key (Z85, 40 characters, the text of its server.pub)
  // when it runs with --curve-keys; empty: no encryption.
  std::string curve_server_key = {};
  // This client's own CurveZMQ key pair (Z85; the secret is the text of NAME.key from
  // `tandem keys --name NAME`), when the scheduler lists clients (--client-keys): its name there
  // decides what the client may do. Empty: a fresh key pair per connection.
  std::string curve_public_key = {};
  std::string curve_secret_key = {};
};

class Client {
 public:
  // Starts the I/O thread and connects (ZeroMQ connects lazily: a scheduler not up yet is
  // not an error here). Errors: an empty or malformed endpoint, a non-positive interval.
  static Result<std::unique_ptr<Client>> connect(ClientOptions options);
  // Cancels the requests still in flight (their final events: UNAVAILABLE, "client closed")
  // and joins the I/O thread.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Submits a request; its events arrive on the returned Stream. A request the library
  // refuses (a duplicate live id, a closed client, a failed I/O loop) gets its final error
  // event at once.
  std::shared_ptr<Stream> generate(GenerateRequest request);
  // Same, with each event passed to `on_event` on the client's I/O thread (keep it short;
  // do not call status() from it). A refused request's final event is passed at once, on
  // the calling thread. Returns the request id (for cancel()).
  std::string generate(GenerateRequest request, std::function<void(const Event&)> on_event);
  // Asks the scheduler to cancel request `id`; its final event follows. Unknown ids are ignored.
  Status cancel(const std::string& id);
  // Asks the scheduler for its state. UNAVAILABLE when no reply arrives within `timeout`
  // (past 100 years: 100 years).
  Result<StatusInfo> status(std::chrono::milliseconds timeout);
  Result<StatusInfo> status();
  // The prompt ids the scheduler would make of `request` (its model's vocabulary and chat
  // template), so callers can budget before submitting. Errors: the scheduler's, naming the
  // problem as a request's admission would (INVALID_ARGUMENT); UNAVAILABLE when no reply comes
  // within `timeout` (default: ClientOptions::request_timeout). Not from an event callback.
  Result<std::vector<int32_t>> tokenize(const TokenizeRequest& request, std::chrono::milliseconds timeout);
  Result<std::vector<int32_t>> tokenize(const TokenizeRequest& request);
  // How many ids tokenize() would return (the ids themselves are not sent).
  Result<size_t> count_tokens(const TokenizeRequest& request, std::chrono::milliseconds timeout);
  Result<size_t> count_tokens(const TokenizeRequest& request);
  // The scheduler's metrics in Prometheus' text format (version 0.0.4: what a /metrics endpoint
  // serves): vLLM's names under "tandem:" (docs/ARCHITECTURE.md lists them). UNAVAILABLE when no
  // reply comes within `timeout` (default: ClientOptions::request_timeout). Not from an event
  // callback. Needs a scheduler of this build or later (an older one takes the query for a
  // protocol error, which ends what this client has in flight).
  Result<std::string> metrics_text(std::chrono::milliseconds timeout);
  Result<std::string> metrics_text();

 private:
  explicit Client(std::unique_ptr<client_detail::Core> core);
  std::unique_ptr<client_detail::Core> core_;
};

}  // namespace tandem
