// tandem status: the scheduler's view of the service (workers, queue, totals), as a table
// or as one JSON object; with --prometheus, its metrics in Prometheus' text format.
#include <cstdio>
#include <string>
#include <type_traits>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/curve_flag.h"
#include "runtime/json.h"
#include "runtime/role.h"
#include "tandem/client.h"

namespace tandem::cli {

using runtime::append_json_string;
using runtime::json_number;
using runtime::json_string;

namespace {

// One member as JSON: integers in full (uint64 too: no quoting), doubles as json_number.
template <class T>
std::string json_value(const T& v) {
  if constexpr (std::is_same_v<T, bool>)
    return v ? "true" : "false";
  else if constexpr (std::is_same_v<T, std::string>)
    return json_string(v);
  else if constexpr (std::is_same_v<T, double>)
    return json_number(v);
  else
    return std::to_string(v);
}

// The printed fields of `info` as "key":value pairs, comma-separated.
template <class Info>
void append_fields(std::string& out, const Info& info) {
  bool first = true;
  visit_status_fields(info, [&](const char* json, const char*, const auto& member) {
    if (!json) return;
    out += first ? "\"" : ",\"";
    out += json;
    out += "\":" + json_value(member);
    first = false;
  });
}

// One line: the status fields, then "workers" (an array of objects), fields in the order of
// tandem::list_status_fields. Its bytes are a contract (the golden test).
std::string to_json(const StatusInfo& s) {
  std::string out = "{";
  append_fields(out, s);
  out += ",\"workers\":[";
  for (size_t i = 0; i < s.workers.size(); ++i) {
    out += i ? ",{" : "{";
    append_fields(out, s.workers[i]);
    out += "}";
  }
  out += "]}\n";
  return out;
}

void print_table(const StatusInfo& s) {
  std::printf(
      "scheduler: %s, %u queued, %u running, %llu requests (%llu finished), %llu tokens, %llu steps, "
      "%.3f ms cpu/step, largest step %llu decode + %llu prefill tokens, %llu decode stalls, "
      "%llu preemptions\n",
      s.ready ? "ready" : "NOT READY", s.queued, s.running, (unsigned long long)s.requests_total,
      (unsigned long long)s.requests_finished, (unsigned long long)s.tokens_generated, (unsigned long long)s.steps,
      s.scheduler_cpu_ms_per_step, (unsigned long long)s.max_step_decode, (unsigned long long)s.max_step_prefill_tokens,
      (unsigned long long)s.decode_stalls, (unsigned long long)s.preemptions);
  std::printf("last minute: %.1f tokens/s, %llu requests finished%s\n", s.tokens_per_s_last_minute,
              (unsigned long long)s.requests_finished_last_minute, s.draining ? "; DRAINING" : "");
  std::printf("prefix cache: %.1f%% of %llu prompt tokens served from cached blocks\n", 100.0 * s.prefix_hit_rate,
              (unsigned long long)s.prompt_tokens);
  std::printf("%-7s %-8s %-8s %-12s %-22s %-10s %-8s %-10s %-12s %-7s %s\n", "worker", "role", "pid", "heard",
              "kv free/cached/total", "evictions", "running", "steps", "tokens", "idle", "MiB weights/kv");
  for (const WorkerInfo& w : s.workers) {
    const std::string kv = std::to_string(w.kv_blocks_free) + "/" + std::to_string(w.kv_blocks_cached) + "/" +
                           std::to_string(w.kv_blocks_total);
    const std::string heard = std::to_string(w.last_heard_ms) + " ms ago";
    char idle[16];
    std::snprintf(idle, sizeof idle, "%.1f%%", 100.0 * w.idle_share);
    std::printf("%-7u %-8s %-8u %-12s %-22s %-10llu %-8u %-10llu %-12llu %-7s %.0f/%.0f\n", w.id, w.role.c_str(), w.pid,
                heard.c_str(), kv.c_str(), (unsigned long long)w.kv_evictions, w.running, (unsigned long long)w.steps,
                (unsigned long long)w.tokens, idle, double(w.weight_bytes) / (1 << 20), double(w.kv_bytes) / (1 << 20));
  }
  if (s.workers.empty()) std::printf("(no workers registered)\n");
  for (const WorkerInfo& w : s.workers)
    if (w.spec_tokens > 0)
      std::printf(
          "worker %u speculation: up to %u drafts a round, %llu rounds, %.1f%% of %llu drafts accepted, %.2f "
          "tokens per round\n",
          w.id, w.spec_tokens, (unsigned long long)w.spec_rounds,
          w.drafts ? 100.0 * double(w.drafts_accepted) / double(w.drafts) : 0.0, (unsigned long long)w.drafts,
          w.spec_rounds ? double(w.spec_rounds + w.drafts_accepted) / double(w.spec_rounds) : 0.0);
  for (const WorkerInfo& w : s.workers) {
    if (w.state_slots_total > 0)
      std::printf("worker %u recurrent state slots: %u of %u free\n", w.id, w.state_slots_free, w.state_slots_total);
    if (w.checkpoints_total > 0)
      std::printf("worker %u state checkpoints (prefix cache): %u of %u free\n", w.id, w.checkpoints_free,
                  w.checkpoints_total);
  }
  for (const WorkerInfo& w : s.workers)
    if (w.kv_ring_blocks_total > 0)
      std::printf(
          "worker %u kv rings: %u of %u ring blocks free, %u cached (windowed layers; the windows of cached "
          "prefixes)\n",
          w.id, w.kv_ring_blocks_free, w.kv_ring_blocks_total, w.kv_ring_blocks_cached);
  // Per role, when the deployment splits prefill and decode.
  bool split = false;
  for (const WorkerInfo& w : s.workers) split |= w.role != runtime::role_name(runtime::Role::kBoth);
  if (!split) return;
  for (runtime::Role r : {runtime::Role::kPrefill, runtime::Role::kDecode, runtime::Role::kBoth}) {
    const char* role = runtime::role_name(r);
    uint32_t n = 0, running = 0, free = 0, total = 0;
    unsigned long long steps = 0, tokens = 0;
    for (const WorkerInfo& w : s.workers) {
      if (w.role != role) continue;
      ++n, running += w.running, free += w.kv_blocks_free, total += w.kv_blocks_total, steps += w.steps,
          tokens += w.tokens;
    }
    if (n)
      std::printf("role %-7s %u workers, %u running, kv %u/%u free, %llu steps, %llu tokens\n", role, n, running, free,
                  total, steps, tokens);
  }
  std::printf("handoffs: %llu done (%llu failed over), %.1f MiB moved, transfer mean %.2f ms, p99 %.2f ms\n",
              (unsigned long long)s.handoffs, (unsigned long long)s.handoff_failures, s.handoff_bytes / 1048576.0,
              s.handoff_ms_mean, s.handoff_ms_p99);
}

}  // namespace

int status_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, kStatus);
  if (!args) return fail("status", args.status());
  if (args->has("help")) {
    std::fputs(help_text(kStatus, "usage: tandem status --endpoint E [flags]").c_str(), stdout);
    return 0;
  }
  auto endpoint = args->str("endpoint");
  if (!endpoint) return fail("status", Status::invalid("--endpoint E is required"));
  auto timeout_ms = args->integer("timeout-ms", 2000);
  if (!timeout_ms) return fail("status", timeout_ms.status());

  ClientOptions options;
  options.endpoint = *endpoint;
  if (Status st = apply_curve_flag(*args, options); !st) return fail("status", st);
  auto client = Client::connect(options);
  if (!client) return fail("status", client.status());
  if (args->has("prometheus")) {
    auto text = (*client)->metrics_text(std::chrono::milliseconds(*timeout_ms));
    if (!text) return fail("status", text.status());
    std::fputs(text->c_str(), stdout);
    return 0;
  }
  auto info = (*client)->status(std::chrono::milliseconds(*timeout_ms));
  if (!info) return fail("status", info.status());
  if (args->has("json")) {
    std::fputs(to_json(*info).c_str(), stdout);
  } else {
    print_table(*info);
  }
  return 0;
}

}  // namespace tandem::cli
