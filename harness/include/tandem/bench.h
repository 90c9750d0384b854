// tandem bench, the library (tandem_harness, harness/): a load generator that drives a Target (tandem through the
// client library, or any OpenAI-compatible /v1/completions or /v1/chat/completions server over HTTP/1.1 + SSE)
// with a synthetic or recorded workload and measures every request's stream.
//
// Bookkeeping is cheap by construction: per streamed token the harness pushes one
// timestamp into a vector reserved for the request's max_tokens; every statistic is
// computed after the run. No ZeroMQ, protobuf or Boost type appears here.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tandem/status.h"

namespace tandem::bench {

using Clock = std::chrono::steady_clock;

// One request as the workload makes it. Synthetic token prompts use ids in [3, 259): every
// byte-level vocabulary (tandem's GGUF models included) has them, so no tokenizer query is needed.
struct BenchRequest {
  uint64_t index = 0;
  std::vector<int32_t> prompt_tokens;  // sent as ids when non-empty (and the target takes ids)
  std::string prompt_text;             // sent as text otherwise
  uint32_t input_tokens = 0;           // as far as the harness knows; a target may correct it
  uint32_t max_tokens = 16;
  bool ignore_eos = false;
  float temperature = 0.0f;  // > 0: sampled with `seed` (from the workload's seed and the index)
  uint64_t seed = 0;
  uint32_t cancel_after = 0;  // > 0: the target cancels the request once this many tokens arrived
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token, bias) added to the logits
};

enum class Outcome { kCompleted, kCancelled, kFailed };

struct RequestRecord {
  uint64_t index = 0;
  double start_s = 0;                            // send time since the run began
  uint32_t input_tokens = 0, output_tokens = 0;  // output: usage.completion_tokens, else the arrivals
  uint32_t cached_tokens = 0;  // prompt tokens the server served from its prefix cache (tandem reports it)
  // ttft/tpot 0 when there was no (second) arrival; tpot: first-to-last arrival / (output_tokens - 1)
  double ttft_ms = 0, tpot_ms = 0, e2e_ms = 0;
  std::vector<double> itl_ms;   // between arrivals (chunks)
  std::vector<double> token_s;  // token arrival times since the run began (for plots)
  std::string finish_reason, error;
  Outcome outcome = Outcome::kFailed;
};

// The live state of one request. A Target calls token() per streamed token and finish()
// exactly once, from one thread at a time per request (any thread). Nothing is locked here.
class RequestTracker {
 public:
  RequestTracker(BenchRequest request, std::function<void()> on_finish);
  const BenchRequest& request() const { return request_; }
  // Records the send time; called by the runner right before Target::start.
  void mark_sent() { sent_ = Clock::now(); }
  // Appends the arrival time of one token; returns the number of tokens so far.
  uint32_t token() {
    token_times_.push_back(Clock::now());
    return static_cast<uint32_t>(token_times_.size());
  }
  // `finish_reason`: "stop", "length", "cancelled" or "error"; `error` says why a request failed.
  // `input_tokens`: the server's count when it reported one (0: keep the workload's).
  // `cached_tokens`: of those, served from the server's prefix cache.
  // `output_tokens`: the server's count of generated tokens when it reported one (OpenAI
  // `usage.completion_tokens`; 0: the number of token() calls). A chunk may carry several tokens.
  void finish(Outcome outcome, std::string finish_reason, std::string error = {}, uint32_t input_tokens = 0,
              uint32_t cached_tokens = 0, uint32_t output_tokens = 0);
  bool finished() const { return done_.load(std::memory_order_acquire); }

  Clock::time_point sent() const { return sent_; }
  Clock::time_point finished_at() const { return finished_at_; }
  const std::vector<Clock::time_point>& token_times() const { return token_times_; }
  // What finish() was told (outcome, finish_reason, error, input, cached and output tokens), read
  // once finished(); summarize() adds the rest.
  const RequestRecord& record() const { return record_; }

 private:
  BenchRequest request_;
  std::function<void()> on_finish_;
  Clock::time_point sent_{}, finished_at_{};
  std::vector<Clock::time_point> token_times_;
  RequestRecord record_;
  std::atomic<bool> done_{false};
};

// Where requests go. start() must not block for long; the tracker gets its tokens and its
// one finish() later, on any thread. The target keeps the tracker alive while it uses it.
class Target {
 public:
  virtual ~Target() = default;
  virtual void start(std::shared_ptr<RequestTracker> tracker) = 0;
  // "tandem ipc://..." or "openai http://host:port model".
  virtual std::string describe() const = 0;
};

// tandem through libtandem-client. Requests get ids "bench-<n>"; cancellation is Client::cancel.
Result<std::unique_ptr<Target>> make_tandem_target(const std::string& endpoint);

struct OpenAIOptions {
  std::string url;                                // http://host:port (an optional path prefix before /v1 is kept)
  std::string model;                              // the "model" field
  bool token_prompts = false;                     // send prompts as token-id arrays
  bool chat = false;                              // POST /v1/chat/completions with one user message
  std::chrono::milliseconds read_timeout{60000};  // a stream silent this long fails
};
// HTTP/1.1 over Boost.Beast on its own I/O thread with a keep-alive connection pool; stream:true
// with stream_options.include_usage. POST /v1/completions: every SSE `data:` chunk with a "text"
// field is one token arrival (as vLLM and llama.cpp stream). chat: POST /v1/chat/completions with
// messages [{"role":"user","content":prompt}]; a chat.completion.chunk whose choices[0].delta has
// non-empty "content", "reasoning_content" or "reasoning" is one arrival (the role-only first chunk
// is not). `data: [DONE]` ends it. Output tokens are the final usage chunk's completion_tokens when
// the server sends one, else the arrivals; prompt_tokens and prompt_tokens_details.cached_tokens
// likewise. Cancelling closes the connection.
// Errors: a URL that is not http://host[:port][/prefix]; no model; chat with token_prompts.
Result<std::unique_ptr<Target>> make_openai_target(const OpenAIOptions& options);

// Lengths: fixed (lo == hi) or uniform in [lo, hi].
struct LengthRange {
  uint32_t lo = 0, hi = 0;
};
// "128" or "64:256".
Result<LengthRange> parse_length_range(const std::string& text);

struct WorkloadOptions {
  LengthRange input_len{128, 128}, output_len{128, 128};
  uint32_t shared_prefix = 0;  // the first tokens of every prompt (part of input_len) shared by each prefix group
  uint32_t prefix_groups = 1;
  std::string dataset;         // JSONL path: {"prompt": "..."} or {"prompt_tokens": [...]}, "output_len"
  double cancel_fraction = 0;  // share of requests cancelled after cancel_after tokens
  uint32_t cancel_after = 1;
  bool ignore_eos = false;
  float temperature = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;  // every request's (e.g. output that repeats, for speculation)
  bool text_prompts = false;  // synthetic prompts as words, dataset lines need "prompt" (a text-only OpenAI target)
  uint64_t seed = 0;
};

// Makes request i deterministically from (seed, i); dataset lines are used in order, cycling.
class Workload {
 public:
  static Result<Workload> create(WorkloadOptions options);
  BenchRequest make(uint64_t index) const;

 private:
  struct Entry {  // a dataset line
    std::string text;
    std::vector<int32_t> tokens;
    uint32_t output_len = 0;  // 0: not given
  };
  static Result<Entry> parse_entry(const std::string& line);
  WorkloadOptions options_;
  std::vector<Entry> dataset_;
  std::vector<std::vector<int32_t>> prefixes_;
};

struct LoadOptions {
  double rate = 0;            // requests/s, open loop; 0 = no pacing (closed loop only)
  double burstiness = 1.0;    // gamma shape of inter-arrival times; 1 = Poisson
  uint32_t concurrency = 0;   // cap on requests in flight; 0 = none
  uint64_t num_requests = 0;  // 0 = until duration
  double duration_s = 0;      // 0 = until num_requests
  uint32_t warmup = 0;        // requests run first and not counted
  uint64_t seed = 0;
  double drain_timeout_s = 120;             // after sending stops, wait at most this for requests in flight
  double slo_ttft_ms = 0, slo_tpot_ms = 0;  // goodput thresholds; 0 = not set
  // Called about every progress_interval on the runner's thread.
  std::function<void(uint64_t done, uint64_t total, double tokens_per_s)> progress;
  std::chrono::milliseconds progress_interval{250};
};

struct Distribution {
  uint64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
// Percentiles by linear interpolation between closest ranks (numpy's default).
Distribution distribution(std::vector<double> values);

struct Summary {
  std::string target;
  double rate = 0, burstiness = 1;
  uint32_t concurrency = 0;
  double duration_s = 0;
  uint64_t completed = 0, failed = 0, cancelled = 0;
  std::vector<std::pair<std::string, uint64_t>> errors;  // reason, count; most frequent first
  // Input: of completed and cancelled requests; output: of every request of the run, the server's
  // usage count where it sent one (completed requests), else the streamed tokens.
  uint64_t input_tokens = 0, output_tokens = 0;
  uint64_t cached_input_tokens = 0;  // of input_tokens, served from the server's prefix cache
  double requests_per_s = 0, input_tokens_per_s = 0, output_tokens_per_s = 0;
  std::optional<double> goodput_requests_per_s;   // set when an SLO was given
  Distribution ttft_ms, itl_ms, tpot_ms, e2e_ms;  // over completed requests
  std::vector<RequestRecord> records;
};

// Computes the summary from finished trackers (pure; `t0` is the run's start).
Summary summarize(const std::vector<std::shared_ptr<RequestTracker>>& trackers, Clock::time_point t0,
                  const LoadOptions& load);

// Runs the load against `target` and returns the summary. Errors: no stop condition
// (num_requests and duration both 0), rate and concurrency both 0, bad burstiness.
Result<Summary> run(Target& target, const Workload& workload, const LoadOptions& load);

// {"target":...,"requests":{...},"throughput":{...},"ttft_ms":{...},...,"records":[...]}.
std::string summary_json(const Summary& summary, bool with_records);
// A readable table.
std::string summary_table(const Summary& summary);
// {"sweep":kind,"points":[summary_json(point, true),...]}; kind: "concurrency" or "rate".
std::string sweep_json(const std::string& kind, const std::vector<Summary>& points);
// Writes `png`: TTFT and ITL histograms and output tokens/s over time of the last point and, for
// a sweep, latency against throughput over the points; its data files go next to it (png.data.*).
// Runs gnuplot; UNAVAILABLE when it is not on PATH, INTERNAL when it fails.
Status plot(const std::string& png, const std::vector<Summary>& points, bool sweep);

}  // namespace tandem::bench
