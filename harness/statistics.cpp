// Statistics, computed after the run from the trackers' timestamps: per-request records,
// distributions (percentiles as numpy computes them by default), totals and rates.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "tandem/bench.h"

namespace tandem::bench {

namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

// One request's record; a tracker not finished (no final event within the drain timeout) is
// failed, and only its request is read: the target may still write to the rest.
RequestRecord record_of(const RequestTracker& t, Clock::time_point t0) {
  const bool finished = t.finished();  // once: the target may finish it meanwhile
  RequestRecord r = finished ? t.record() : RequestRecord{};
  r.index = t.request().index;
  r.start_s = std::chrono::duration<double>(t.sent() - t0).count();
  if (!finished) {
    r.input_tokens = t.request().input_tokens;
    r.finish_reason = "error";
    r.error = "no final event within the drain timeout";
    r.outcome = Outcome::kFailed;
    return r;
  }
  const auto& times = t.token_times();
  // The server's count when it sent one (a chunk may carry several tokens), else the arrivals.
  if (r.output_tokens == 0) r.output_tokens = static_cast<uint32_t>(times.size());
  r.e2e_ms = ms_between(t.sent(), t.finished_at());
  if (!times.empty()) r.ttft_ms = ms_between(t.sent(), times.front());
  r.itl_ms.reserve(times.size());
  r.token_s.reserve(times.size());
  for (size_t i = 0; i < times.size(); ++i) {
    if (i > 0) r.itl_ms.push_back(ms_between(times[i - 1], times[i]));
    r.token_s.push_back(std::chrono::duration<double>(times[i] - t0).count());
  }
  // Time per output token after the first, over the server's count (vLLM's benchmark does so).
  if (times.size() > 1 && r.output_tokens > 1)
    r.tpot_ms = ms_between(times.front(), times.back()) / static_cast<double>(r.output_tokens - 1);
  return r;
}

}  // namespace

Distribution distribution(std::vector<double> values) {
  Distribution d;
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.count = values.size();
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  d.p50 = percentile(values, 0.50);
  d.p90 = percentile(values, 0.90);
  d.p99 = percentile(values, 0.99);
  d.max = values.back();
  return d;
}

Summary summarize(const std::vector<std::shared_ptr<RequestTracker>>& trackers, Clock::time_point t0,
                  const LoadOptions& load) {
  Summary s;
  s.rate = load.rate;
  s.burstiness = load.burstiness;
  s.concurrency = load.concurrency;
  std::vector<double> ttft, itl, tpot, e2e;
  std::map<std::string, uint64_t> errors;
  Clock::time_point last = t0;
  uint64_t good = 0;
  for (const auto& t : trackers) {
    RequestRecord r = record_of(*t, t0);
    if (t->finished()) last = std::max(last, t->finished_at());
    // A failed request's prompt may never have been processed; its streamed tokens were.
    if (r.outcome != Outcome::kFailed) s.input_tokens += r.input_tokens, s.cached_input_tokens += r.cached_tokens;
    s.output_tokens += r.output_tokens;
    switch (r.outcome) {
      case Outcome::kCompleted: {
        ++s.completed;
        const bool streamed = !r.token_s.empty();  // a first token arrived (TTFT is measured)
        if (streamed) ttft.push_back(r.ttft_ms);
        itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
        if (r.token_s.size() > 1 && r.output_tokens > 1) tpot.push_back(r.tpot_ms);
        e2e.push_back(r.e2e_ms);
        const bool ttft_ok = load.slo_ttft_ms <= 0 || (streamed && r.ttft_ms <= load.slo_ttft_ms);
        const bool tpot_ok = load.slo_tpot_ms <= 0 || r.tpot_ms <= load.slo_tpot_ms;
        if (ttft_ok && tpot_ok) ++good;
        break;
      }
      case Outcome::kCancelled: ++s.cancelled; break;
      case Outcome::kFailed:
        ++s.failed;
        ++errors[r.error.empty() ? "unknown" : r.error];
        break;
    }
    s.records.push_back(std::move(r));
  }
  s.duration_s = std::chrono::duration<double>(last - t0).count();
  auto per_s = [&](uint64_t n) { return s.duration_s > 0 ? static_cast<double>(n) / s.duration_s : 0.0; };
  s.requests_per_s = per_s(s.completed);
  s.input_tokens_per_s = per_s(s.input_tokens);
  s.output_tokens_per_s = per_s(s.output_tokens);
  if (load.slo_ttft_ms > 0 || load.slo_tpot_ms > 0) s.goodput_requests_per_s = per_s(good);
  for (auto& [reason, n] : errors) s.errors.emplace_back(reason, n);
  std::stable_sort(s.errors.begin(), s.errors.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  s.ttft_ms = distribution(std::move(ttft));
  s.itl_ms = distribution(std::move(itl));
  s.tpot_ms = distribution(std::move(tpot));
  s.e2e_ms = distribution(std::move(e2e));
  return s;
}

}  // namespace tandem::bench
