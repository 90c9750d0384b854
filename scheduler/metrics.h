// The scheduler's Prometheus metrics: fixed-bucket histograms and counters the core updates as
// events happen (a token accepted, a request finished or refused), and the MetricsReply built
// from them and the core's state when a client asks. An update is a binary search over at most
// 22 bounds and a few adds: no allocation, lock or log per token. Names are vLLM's
// (vllm/v1/metrics/loggers.py) under "tandem:", with vLLM's bucket boundaries where it has them.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/v1/client.pb.h"

namespace tandem::scheduler {

// Observations counted into buckets of fixed upper bounds (Prometheus' `le`, ascending) and a
// last +Inf bucket. The bounds are set once; observe() never allocates.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }
  const std::vector<double>& bounds() const { return bounds_; }
  // Cumulative counts as the wire carries them: observations <= each bound, in order.
  void fill(v1::Metric& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// vLLM's bucket boundaries (vllm/v1/metrics/loggers.py, PrometheusStatLogger).
std::vector<double> ttft_buckets();             // time_to_first_token_seconds
std::vector<double> inter_token_buckets();      // inter_token_latency_seconds (as time_per_output_token)
std::vector<double> request_latency_buckets();  // e2e_request_latency_seconds, request_queue_time_seconds
// 1, 2, 5, 10, 20, 50, ... up to `max` (build_1_2_5_buckets): request_prompt_tokens and
// request_generation_tokens, up to the context length.
std::vector<double> one_two_five_buckets(uint32_t max);

// The `finish_reason` label of e2e_request_latency_seconds: every request admitted (its prompt
// checked) ends with one of these; refusals, at submit or when the prompt's ids came, are counted
// apart, by error code.
enum class EndReason : uint8_t { kStop, kLength, kCancelled, kError };
inline constexpr size_t kEndReasons = 4;
const char* end_reason_label(EndReason reason);  // "stop", "length", "cancelled", "error"
EndReason end_reason(v1::FinishReason reason);

// What the core records per request event.
struct RequestMetrics {
  explicit RequestMetrics(uint32_t context_length);
  Histogram ttft, inter_token, queue, prompt_tokens, generation_tokens, handoff;
  std::array<Histogram, kEndReasons> e2e;
  // Submits refused before they were taken (a bad field, a full queue, no worker, draining, a
  // credential's limits), by v1::ErrorCode.
  std::array<uint64_t, 8> refused{};
  void refuse(v1::ErrorCode code) {
    const size_t i = static_cast<size_t>(code);
    ++refused[i < refused.size() ? i : 0];
  }
};

class Core;

// Fills `out` (cleared first) from the core's metrics and state. `model_name` labels every
// series (`model_name`, as vLLM's served model name).
void fill_metrics_reply(const Core& core, const std::string& model_name, uint64_t query_id, v1::MetricsReply& out);

}  // namespace tandem::scheduler
