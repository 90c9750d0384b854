// Reports: the summary as JSON (one run or a sweep's points) and as a readable table.
#include <cstdio>

#include "runtime/json.h"
#include "tandem/bench.h"

namespace tandem::bench {

using runtime::append_json_string;
using runtime::json_number;

namespace {

void append_distribution(std::string& out, const char* name, const Distribution& d) {
  out += '"';
  out += name;
  out += "\":{\"count\":" + std::to_string(d.count) + ",\"mean\":" + json_number(d.mean) +
         ",\"p50\":" + json_number(d.p50) + ",\"p90\":" + json_number(d.p90) + ",\"p99\":" + json_number(d.p99) +
         ",\"max\":" + json_number(d.max) + "}";
}

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kCompleted: return "completed";
    case Outcome::kCancelled: return "cancelled";
    default: return "failed";
  }
}

}  // namespace

std::string summary_json(const Summary& s, bool with_records) {
  std::string out = "{\"target\":";
  append_json_string(out, s.target);
  out += ",\"load\":{\"rate\":" + json_number(s.rate) + ",\"burstiness\":" + json_number(s.burstiness) +
         ",\"concurrency\":" + std::to_string(s.concurrency) + "}";
  out += ",\"duration_s\":" + json_number(s.duration_s);
  out += ",\"requests\":{\"completed\":" + std::to_string(s.completed) + ",\"failed\":" + std::to_string(s.failed) +
         ",\"cancelled\":" + std::to_string(s.cancelled) + ",\"errors\":{";
  for (size_t i = 0; i < s.errors.size(); ++i) {
    if (i) out += ',';
    append_json_string(out, s.errors[i].first);
    out += ':' + std::to_string(s.errors[i].second);
  }
  out += "}}";
  out += ",\"tokens\":{\"input\":" + std::to_string(s.input_tokens) +
         ",\"cached_input\":" + std::to_string(s.cached_input_tokens) +
         ",\"output\":" + std::to_string(s.output_tokens) + "}";
  out += ",\"throughput\":{\"requests_per_s\":" + json_number(s.requests_per_s) +
         ",\"input_tokens_per_s\":" + json_number(s.input_tokens_per_s) +
         ",\"output_tokens_per_s\":" + json_number(s.output_tokens_per_s) + "}";
  out += ",\"goodput\":{\"requests_per_s\":" +
         (s.goodput_requests_per_s ? json_number(*s.goodput_requests_per_s) : std::string("null")) + "}";
  out += ',';
  append_distribution(out, "ttft_ms", s.ttft_ms);
  out += ',';
  append_distribution(out, "itl_ms", s.itl_ms);
  out += ',';
  append_distribution(out, "tpot_ms", s.tpot_ms);
  out += ',';
  append_distribution(out, "e2e_ms", s.e2e_ms);
  if (with_records) {
    out += ",\"records\":[";
    for (size_t i = 0; i < s.records.size(); ++i) {
      const RequestRecord& r = s.records[i];
      if (i) out += ',';
      out += "{\"index\":" + std::to_string(r.index) + ",\"outcome\":\"" + outcome_name(r.outcome) +
             "\",\"finish_reason\":";
      append_json_string(out, r.finish_reason);
      out += ",\"error\":";
      append_json_string(out, r.error);
      out += ",\"start_s\":" + json_number(r.start_s) + ",\"input_tokens\":" + std::to_string(r.input_tokens) +
             ",\"cached_tokens\":" + std::to_string(r.cached_tokens) +
             ",\"output_tokens\":" + std::to_string(r.output_tokens) + ",\"ttft_ms\":" + json_number(r.ttft_ms) +
             ",\"tpot_ms\":" + json_number(r.tpot_ms) + ",\"e2e_ms\":" + json_number(r.e2e_ms) + ",\"itl_ms\":[";
      for (size_t k = 0; k < r.itl_ms.size(); ++k) {
        if (k) out += ',';
        out += json_number(r.itl_ms[k]);
      }
      out += "]}";
    }
    out += ']';
  }
  out += '}';
  return out;
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
  for (const auto& [name, d] : {std::pair<const char*, const Distribution*>{"ttft", &s.ttft_ms},
                                {"itl", &s.itl_ms},
                                {"tpot", &s.tpot_ms},
                                {"e2e", &s.e2e_ms}})
    add("%-12s %10.2f %10.2f %10.2f %10.2f %10.2f %8llu\n", name, d->mean, d->p50, d->p90, d->p99, d->max,
        static_cast<unsigned long long>(d->count));
  return out;
}

std::string sweep_json(const std::string& kind, const std::vector<Summary>& points) {
  std::string json = "{\"sweep\":";
  append_json_string(json, kind);
  json += ",\"points\":[";
  for (size_t i = 0; i < points.size(); ++i) json += (i ? "," : "") + summary_json(points[i], true);
  return json + "]}";
}

}  // namespace tandem::bench
