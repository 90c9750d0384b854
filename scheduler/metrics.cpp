#include "scheduler/metrics.h"

#include <algorithm>
#include <cctype>

#include "scheduler/core.h"

namespace tandem::scheduler {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  // The first bound >= v: Prometheus buckets are upper-inclusive (le).
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::fill(v1::Metric& out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) out.add_bucket_counts(cumulative += counts_[i]);
  out.set_sum(sum_);
  out.set_count(count_);
}

std::vector<double> ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}

std::vector<double> inter_token_buckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}

std::vector<double> request_latency_buckets() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

std::vector<double> one_two_five_buckets(uint32_t max) {
  std::vector<double> out;
  for (uint64_t scale = 1;; scale *= 10) {
    for (uint64_t m : {1, 2, 5}) {
      if (m * scale > max) return out;
      out.push_back(double(m * scale));
    }
  }
}

const char* end_reason_label(EndReason reason) {
  switch (reason) {
    case EndReason::kStop: return "stop";
    case EndReason::kLength: return "length";
    case EndReason::kCancelled: return "cancelled";
    case EndReason::kError: return "error";
  }
  return "error";
}

EndReason end_reason(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP: return EndReason::kStop;
    case v1::FINISH_REASON_LENGTH: return EndReason::kLength;
    case v1::FINISH_REASON_CANCELLED: return EndReason::kCancelled;
    default: return EndReason::kError;
  }
}

RequestMetrics::RequestMetrics(uint32_t context_length)
    : ttft(ttft_buckets()),
      inter_token(inter_token_buckets()),
      queue(request_latency_buckets()),
      prompt_tokens(one_two_five_buckets(context_length)),
      generation_tokens(one_two_five_buckets(context_length)),
      handoff(ttft_buckets()),
      e2e{Histogram(request_latency_buckets()), Histogram(request_latency_buckets()),
          Histogram(request_latency_buckets()), Histogram(request_latency_buckets())} {}

namespace {

// Families are added in the order they are printed; each helper adds one series.
class ReplyBuilder {
 public:
  explicit ReplyBuilder(v1::MetricsReply& out) : out_(out) {}

  v1::MetricFamily& family(const char* name, v1::MetricType type, const char* help) {
    v1::MetricFamily& f = *out_.add_families();
    f.set_name(std::string("tandem:") + name);
    f.set_type(type);
    f.set_help(help);
    return f;
  }
  static v1::Metric& series(v1::MetricFamily& f, std::initializer_list<std::pair<const char*, std::string>> labels) {
    v1::Metric& m = *f.add_metrics();
    for (const auto& [name, value] : labels) {
      v1::MetricLabel& l = *m.add_labels();
      l.set_name(name);
      l.set_value(value);
    }
    return m;
  }
  void scalar(const char* name, v1::MetricType type, const char* help, double value) {
    series(family(name, type, help), {}).set_value(value);
  }
  void histogram(const char* name, const char* help, const Histogram& h) {
    v1::MetricFamily& f = family(name, v1::METRIC_TYPE_HISTOGRAM, help);
    f.mutable_bucket_bounds()->Add(h.bounds().begin(), h.bounds().end());
    h.fill(series(f, {}));
  }

 private:
  v1::MetricsReply& out_;
};

constexpr v1::MetricType kCounter = v1::METRIC_TYPE_COUNTER;
constexpr v1::MetricType kGauge = v1::METRIC_TYPE_GAUGE;

void fill_requests(const Core& core, ReplyBuilder& b) {
  const RequestMetrics& m = core.metrics();
  const CoreStats& cs = core.stats();
  b.scalar("num_requests_running", kGauge, "Requests placed on a worker (prefilling, decoding or handing off).",
           double(core.live_requests() - core.queued()));
  b.scalar("num_requests_waiting", kGauge, "Requests waiting for a worker, or for their prompt to be tokenized.",
           double(core.queued()));
  b.scalar("prompt_tokens_total", kCounter, "Prompt tokens of requests placed (counted once, at first placement).",
           double(cs.prompt_tokens));
  b.scalar("generation_tokens_total", kCounter, "Tokens generated.", double(cs.tokens));
  v1::MetricFamily& success = b.family("request_success_total", kCounter,
                                       "Requests that finished with a stop condition or their length limit.");
  for (EndReason r : {EndReason::kStop, EndReason::kLength})
    ReplyBuilder::series(success, {{"finished_reason", end_reason_label(r)}})
        .set_value(double(m.e2e[static_cast<size_t>(r)].count()));
  v1::MetricFamily& refused =
      b.family("request_refused_total", kCounter,
               "Requests refused (at submit, or when their prompt was checked), by error code; not in e2e.");
  for (int c = v1::ERROR_CODE_INVALID_ARGUMENT; c <= v1::ERROR_CODE_PERMISSION_DENIED; ++c) {
    std::string code = v1::ErrorCode_Name(static_cast<v1::ErrorCode>(c)).substr(sizeof "ERROR_CODE_" - 1);
    std::transform(code.begin(), code.end(), code.begin(), [](unsigned char ch) { return std::tolower(ch); });
    ReplyBuilder::series(refused, {{"code", code}}).set_value(double(m.refused[static_cast<size_t>(c)]));
  }
  b.histogram("time_to_first_token_seconds", "Time from arrival to the first token, in seconds.", m.ttft);
  b.histogram("inter_token_latency_seconds", "Time between two tokens of a request, in seconds.", m.inter_token);
  v1::MetricFamily& e2e =
      b.family("e2e_request_latency_seconds", v1::METRIC_TYPE_HISTOGRAM,
               "Time from arrival to the final event, in seconds, of every request admitted, by how it ended.");
  e2e.mutable_bucket_bounds()->Add(m.e2e[0].bounds().begin(), m.e2e[0].bounds().end());
  for (size_t r = 0; r < kEndReasons; ++r)
    m.e2e[r].fill(ReplyBuilder::series(e2e, {{"finish_reason", end_reason_label(static_cast<EndReason>(r))}}));
  b.histogram("request_queue_time_seconds", "Time from arrival to the first scheduled step, in seconds.", m.queue);
  b.histogram("request_prompt_tokens", "Prompt tokens per finished request.", m.prompt_tokens);
  b.histogram("request_generation_tokens", "Generated tokens per finished request.", m.generation_tokens);
}

void fill_scheduler(const Core& core, ReplyBuilder& b) {
  const RequestMetrics& m = core.metrics();
  const CoreStats& cs = core.stats();
  b.scalar("prefix_cache_queries_total", kCounter, "Prefix cache queries, in prompt tokens looked up.",
           double(cs.prompt_tokens));
  b.scalar("prefix_cache_hits_total", kCounter, "Prefix cache hits, in prompt tokens served from cached blocks.",
           double(cs.cached_prompt_tokens));
  b.scalar("num_preemptions_total", kCounter, "Sequences preempted (sent back to the queue to be recomputed).",
           double(cs.preemptions));
  b.scalar("decode_stalls_total", kCounter, "Decoding sequences left out of a step for want of KV blocks.",
           double(cs.decode_stalls));
  b.scalar("scheduler_steps_total", kCounter, "Step plans sent to workers.", double(cs.steps));
  b.scalar("kv_handoffs_total", kCounter, "Prefill-to-decode KV handoffs acknowledged.", double(cs.handoffs));
  b.scalar("kv_handoff_bytes_total", kCounter, "Bytes of KV moved by handoffs.", double(cs.handoff_bytes));
  b.scalar("kv_handoff_failures_total", kCounter, "Handoffs timed out or lost with a worker (recomputed).",
           double(cs.handoff_failures));
  b.histogram("kv_handoff_seconds", "Time from a handoff's send order to its acknowledgement, in seconds.", m.handoff);
}

void fill_workers(const Core& core, ReplyBuilder& b) {
  const std::vector<Core::WorkerView> workers = core.workers();
  auto per_worker = [&](const char* name, v1::MetricType type, const char* help, auto value) {
    v1::MetricFamily& f = b.family(name, type, help);
    for (const Core::WorkerView& w : workers)
      ReplyBuilder::series(f, {{"worker", std::to_string(w.id)}, {"role", role_name(w.role)}}).set_value(value(w));
  };
  using W = const Core::WorkerView&;
  per_worker("kv_cache_usage_perc", kGauge, "KV blocks in use over the worker's total (cached blocks are not in use).",
             [](W w) {
               const uint32_t used = w.blocks_total - w.blocks_free - w.blocks_cached;
               return w.blocks_total ? double(used) / double(w.blocks_total) : 0.0;
             });
  per_worker("worker_kv_cache_blocks", kGauge, "KV blocks of the worker's pool.",
             [](W w) { return double(w.blocks_total); });
  per_worker("worker_num_requests_running", kGauge, "Sequences placed on the worker.",
             [](W w) { return double(w.running); });
  per_worker("worker_steps_total", kCounter, "Steps the worker answered.", [](W w) { return double(w.stats->steps); });
  per_worker("worker_generation_tokens_total", kCounter, "Tokens the worker sampled that the scheduler accepted.",
             [](W w) { return double(w.stats->tokens); });
  per_worker("worker_compute_seconds_total", kCounter, "The worker's compute time in steps, in seconds.",
             [](W w) { return double(w.stats->compute_us) / 1e6; });
  per_worker("prefix_cache_evictions_total", kCounter, "Cached KV blocks evicted for new ones.",
             [](W w) { return double(w.evictions); });
}

}  // namespace

void fill_metrics_reply(const Core& core, const std::string& model_name, uint64_t query_id, v1::MetricsReply& out) {
  out.Clear();
  out.set_query_id(query_id);
  v1::MetricLabel& model = *out.add_const_labels();
  model.set_name("model_name");
  model.set_value(model_name);
  ReplyBuilder b(out);
  fill_requests(core, b);
  fill_scheduler(core, b);
  fill_workers(core, b);
}

}  // namespace tandem::scheduler
