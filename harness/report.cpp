// Reports: the summary as JSON (one run or a sweep's points) and as a readable table.
#include <array>
#include <cstdio>

#include "runtime/json.h"
#include "tandem/bench.h"

namespace tandem::bench {

using runtime::json_number;
using runtime::json_string;

namespace {

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kCompleted: return "completed";
    case Outcome::kCancelled: return "cancelled";
    default: return "failed";
  }
}

// The latency distributions in report order, by their names in the table ("_ms" in JSON).
std::array<std::pair<const char*, const Distribution*>, 4> distributions(const Summary& s) {
  return {{{"ttft", &s.ttft_ms}, {"itl", &s.itl_ms}, {"tpot", &s.tpot_ms}, {"e2e", &s.e2e_ms}}};
}

std::string record_json(const RequestRecord& r) {
  std::string out = "{\"index\":" + std::to_string(r.index) + ",\"outcome\":\"" + outcome_name(r.outcome) +
                    "\",\"finish_reason\":" + json_string(r.finish_reason) + ",\"error\":" + json_string(r.error) +
                    ",\"start_s\":" + json_number(r.start_s) + ",\"input_tokens\":" + std::to_string(r.input_tokens) +
                    ",\"cached_tokens\":" + std::to_string(r.cached_tokens) +
                    ",\"output_tokens\":" + std::to_string(r.output_tokens) + ",\"ttft_ms\":" + json_number(r.ttft_ms) +
                    ",\"tpot_ms\":" + json_number(r.tpot_ms) + ",\"e2e_ms\":" + json_number(r.e2e_ms) + ",\"itl_ms\":[";
  for (size_t k = 0; k < r.itl_ms.size(); ++k) out += (k ? "," : "") + json_number(r.itl_ms[k]);
  return out + "]}";
}

}  // namespace

std::string summary_json(const Summary& s, bool with_records) {
  std::string out = "{\"target\":" + json_string(s.target);
  out += ",\"load\":{\"rate\":" + json_number(s.rate) + ",\"burstiness\":" + json_number(s.burstiness) +
         ",\"concurrency\":" + std::to_string(s.concurrency) + "}";
  out += ",\"duration_s\":" + json_number(s.duration_s);
  out += ",\"requests\":{\"completed\":" + std::to_string(s.completed) + ",\"failed\":" + std::to_string(s.failed) +
         ",\"cancelled\":" + std::to_string(s.cancelled) + ",\"errors\":{";
  for (size_t i = 0; i < s.errors.size(); ++i)
    out += (i ? "," : "") + json_string(s.errors[i].first) + ':' + std::to_string(s.errors[i].second);
  out += "}}";
  out += ",\"tokens\":{\"input\":" + std::to_string(s.input_tokens) +
         ",\"cached_input\":" + std::to_string(s.cached_input_tokens) +
         ",\"output\":" + std::to_string(s.output_tokens) + "}";
  out += ",\"throughput\":{\"requests_per_s\":" + json_number(s.requests_per_s) +
         ",\"input_tokens_per_s\":" + json_number(s.input_tokens_per_s) +
         ",\"output_tokens_per_s\":" + json_number(s.output_tokens_per_s) + "}";
  out += ",\"goodput\":{\"requests_per_s\":" +
         (s.goodput_requests_per_s ? json_number(*s.goodput_requests_per_s) : std::string("null")) + "}";
  for (const auto& [name, d] : distributions(s))
    out += ",\"" + std::string(name) + "_ms\":{\"count\":" + std::to_string(d->count) +
           ",\"mean\":" + json_number(d->mean) + ",\"p50\":" + json_number(d->p50) + ",\"p90\":" + json_number(d->p90) +
           ",\"p99\":" + json_number(d->p99) + ",\"max\":" + json_number(d->max) + "}";
  if (with_records) {
    out += ",\"records\":[";
    for (size_t i = 0; i < s.records.size(); ++i) out += (i ? "," : "") + record_json(s.records[i]);
    out += ']';
  }
  return out + '}';
}

std::string summary_table(const Summary& s) {
  std::string out;
  char line[256];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof line, fmt, args...);
    out += line;
  };
  add("target              %s\n", s.target.c_str());
  add("load                rate %s req/s, burstiness %.3g, concurrency %s\n",
      s.rate > 0 ? json_number(s.rate).c_str() : "unpaced", s.burstiness,
      s.concurrency > 0 ? std::to_string(s.concurrency).c_str() : "uncapped");
  add("duration            %.3f s\n", s.duration_s);
  add("requests            %llu completed, %llu failed, %llu cancelled\n", static_cast<unsigned long long>(s.completed),
      static_cast<unsigned long long>(s.failed), static_cast<unsigned long long>(s.cancelled));
  for (const auto& [reason, n] : s.errors)
    add("  error x%-6llu     %.180s\n", static_cast<unsigned long long>(n), reason.c_str());
  add("throughput          %.2f req/s, %.1f input tok/s, %.1f output tok/s\n", s.requests_per_s, s.input_tokens_per_s,
      s.output_tokens_per_s);
  if (s.cached_input_tokens)
    add("prefix cache        %.1f%% of input tokens served from the server's cache\n",
        100.0 * double(s.cached_input_tokens) / double(s.input_tokens));
  if (s.goodput_requests_per_s) add("goodput             %.2f req/s within the SLOs\n", *s.goodput_requests_per_s);
  add("%-12s %10s %10s %10s %10s %10s %8s\n", "(ms)", "mean", "p50", "p90", "p99", "max", "n");
  for (const auto& [name, d] : distributions(s))
    add("%-12s %10.2f %10.2f %10.2f %10.2f %10.2f %8llu\n", name, d->mean, d->p50, d->p90, d->p99, d->max,
        static_cast<unsigned long long>(d->count));
  return out;
}

std::string sweep_json(const std::string& kind, const std::vector<Summary>& points) {
  std::string json = "{\"sweep\":" + json_string(kind) + ",\"points\":[";
  for (size_t i = 0; i < points.size(); ++i) json += (i ? "," : "") + summary_json(points[i], true);
  return json + "]}";
}

}  // namespace tandem::bench
