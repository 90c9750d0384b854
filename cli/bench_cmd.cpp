// tandem bench: load-test tandem (through the client library) or any OpenAI-compatible
// /v1/completions or /v1/chat/completions server, print a table, write the summary and per-request records as JSON.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/sampling_flags.h"
#include "tandem/bench.h"

namespace tandem::cli {

namespace {

constexpr const char* kUsage =
    "usage: tandem bench (--endpoint E | --openai-url URL --model NAME [--token-prompts | --openai-chat]) [flags]\n"
    "load: at least one of --rate / --concurrency, one of --num-requests / --duration";
constexpr const char* kNotes = "exit status: 0 ok (even with failed requests), 1 the run could not be made, 2 usage\n";

Result<std::vector<double>> real_list(const std::string& flag, const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(v > 0)) return Status::invalid("--" + flag + ": bad value '" + item + "'");
    out.push_back(v);
  }
  if (out.empty()) return Status::invalid("--" + flag + ": no values");
  return out;
}

void print_progress(uint64_t done, uint64_t total, double tokens_per_s) {
  if (total > 0)
    std::fprintf(stderr, "\r[%llu/%llu] %.1f tok/s   ", static_cast<unsigned long long>(done),
                 static_cast<unsigned long long>(total), tokens_per_s);
  else
    std::fprintf(stderr, "\r[%llu done] %.1f tok/s   ", static_cast<unsigned long long>(done), tokens_per_s);
  std::fflush(stderr);
}

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  if (!f) return Status::error(Code::kInternal, "cannot write --out " + path);
  return Status::ok();
}

Result<std::unique_ptr<bench::Target>> make_target(const Args& args) {
  if (!args.has("openai-url")) return bench::make_tandem_target(*args.str("endpoint"));
  bench::OpenAIOptions o;
  o.url = *args.str("openai-url");
  o.model = args.str("model").value_or("");
  o.token_prompts = args.has("token-prompts");
  o.chat = args.has("openai-chat");
  return bench::make_openai_target(o);
}

// One run per sweep point (or the one run), each summary printed as a table when it ends.
Status run_points(bench::Target& target, const bench::Workload& workload, const bench::LoadOptions& load,
                  const std::vector<double>& sweep, bool sweep_conc, std::vector<bench::Summary>& points) {
  const size_t n_points = sweep.empty() ? 1 : sweep.size();
  for (size_t i = 0; i < n_points; ++i) {
    bench::LoadOptions point = load;
    if (!sweep.empty() && sweep_conc) point.concurrency = static_cast<uint32_t>(sweep[i]);
    if (!sweep.empty() && !sweep_conc) point.rate = sweep[i];
    auto summary = bench::run(target, workload, point);
    if (load.progress) std::fputs("\n", stderr);
    if (!summary) return summary.status();
    if (i) std::fputs("\n", stdout);
    const std::string table = bench::summary_table(*summary);
    std::fwrite(table.data(), 1, table.size(), stdout);
    std::fflush(stdout);
    points.push_back(std::move(summary.value()));
  }
  return Status::ok();
}

// The workload's flags that the table's parsing covers, and --logit-bias (every request's).
Status workload_flags(const Args& args, bench::WorkloadOptions& wl) {
  wl.dataset = args.str("dataset").value_or("");
  wl.ignore_eos = args.has("ignore-eos");
  wl.text_prompts = args.has("openai-url") && !args.has("token-prompts");
  auto bias = logit_bias_from_flag(args.str("logit-bias").value_or(""));
  if (!bias) return bias.status();
  for (const model::LogitBias& b : *bias) wl.logit_bias.emplace_back(b.token, b.bias);
  return Status::ok();
}

}  // namespace

int bench_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, kBench);
  if (!args) return fail("bench", args.status());
  if (args->has("help")) {
    std::fputs(help_text(kBench, kUsage, kNotes).c_str(), stdout);
    return 0;
  }
  if (args->has("endpoint") == args->has("openai-url"))
    return fail("bench", Status::invalid("give exactly one of --endpoint E or --openai-url URL"));
  if (args->has("openai-chat") && !args->has("openai-url"))
    return fail("bench", Status::invalid("--openai-chat needs --openai-url URL"));
  if (args->has("sweep-concurrency") && args->has("sweep-rate"))
    return fail("bench", Status::invalid("give at most one of --sweep-concurrency and --sweep-rate"));

  bench::LoadOptions load;
  auto rate = args->real("rate", 0);
  auto burstiness = args->real("burstiness", 1.0);
  auto concurrency = args->integer("concurrency", 0);
  auto num_requests = args->integer("num-requests", 0);
  auto duration = args->real("duration", 0);
  auto warmup = args->integer("warmup", 0);
  auto seed = args->integer("seed", 0);
  auto drain = args->real("drain-timeout", 120);
  auto shared_prefix = args->integer("shared-prefix", 0);
  auto prefix_groups = args->integer("prefix-groups", 1);
  auto cancel_fraction = args->real("cancel-fraction", 0);
  auto cancel_after = args->integer("cancel-after", 1);
  auto temperature = args->real("temperature", 0);
  auto slo_ttft = args->real("slo-ttft-ms", 0);
  auto slo_tpot = args->real("slo-tpot-ms", 0);
  auto input_len = bench::parse_length_range(args->str("input-len").value_or("128"));
  auto output_len = bench::parse_length_range(args->str("output-len").value_or("128"));
  for (const Status* st :
       {&rate.status(), &burstiness.status(), &concurrency.status(), &num_requests.status(), &duration.status(),
        &warmup.status(), &seed.status(), &drain.status(), &shared_prefix.status(), &prefix_groups.status(),
        &cancel_fraction.status(), &cancel_after.status(), &slo_ttft.status(), &slo_tpot.status(), &input_len.status(),
        &output_len.status(), &temperature.status()})
    if (!st->is_ok()) return fail("bench", *st);
  if (*rate < 0 || *duration < 0 || *drain <= 0 || *slo_ttft < 0 || *slo_tpot < 0)
    return fail("bench", Status::invalid("--rate, --duration, --slo-* must be >= 0 and --drain-timeout > 0"));
  if (!(*temperature >= 0 && *temperature <= 2))
    return fail("bench", Status::invalid("--temperature must be in [0, 2], got " + std::to_string(*temperature)));
  load.rate = *rate;
  load.burstiness = *burstiness;
  load.concurrency = static_cast<uint32_t>(*concurrency);
  load.num_requests = static_cast<uint64_t>(*num_requests);
  load.duration_s = *duration;
  load.warmup = static_cast<uint32_t>(*warmup);
  load.seed = static_cast<uint64_t>(*seed);
  load.drain_timeout_s = *drain;
  load.slo_ttft_ms = *slo_ttft;
  load.slo_tpot_ms = *slo_tpot;

  std::vector<double> sweep;
  const bool sweep_conc = args->has("sweep-concurrency"), sweep_rate = args->has("sweep-rate");
  if (sweep_conc || sweep_rate) {
    const std::string flag = sweep_conc ? "sweep-concurrency" : "sweep-rate";
    auto list = real_list(flag, *args->str(flag));
    if (!list) return fail("bench", list.status());
    sweep = std::move(list.value());
  }
  // Validate the load shape once, before connecting anywhere.
  if (load.num_requests == 0 && load.duration_s <= 0)
    return fail("bench", Status::invalid("give --num-requests N and/or --duration S"));
  if (load.rate <= 0 && load.concurrency == 0 && sweep.empty())
    return fail("bench", Status::invalid("give --rate R and/or --concurrency C"));

  bench::WorkloadOptions wl;
  wl.input_len = *input_len;
  wl.output_len = *output_len;
  wl.shared_prefix = static_cast<uint32_t>(*shared_prefix);
  wl.prefix_groups = static_cast<uint32_t>(*prefix_groups);
  wl.cancel_fraction = *cancel_fraction;
  wl.cancel_after = static_cast<uint32_t>(*cancel_after);
  wl.temperature = static_cast<float>(*temperature);
  if (Status st = workload_flags(*args, wl); !st) return fail("bench", st);
  wl.seed = load.seed;
  auto workload = bench::Workload::create(wl);
  if (!workload) return fail("bench", workload.status());

  auto target = make_target(*args);
  if (!target) return fail("bench", target.status());

  if (::isatty(STDERR_FILENO)) load.progress = print_progress;

  std::vector<bench::Summary> points;
  if (Status st = run_points(**target, *workload, load, sweep, sweep_conc, points); !st) return fail("bench", st);
  if (auto out = args->str("out")) {
    const std::string json = sweep.empty() ? bench::summary_json(points[0], true)
                                           : bench::sweep_json(sweep_conc ? "concurrency" : "rate", points);
    if (Status st = write_file(*out, json + '\n'); !st) return fail("bench", st);
  }
  if (auto png = args->str("plot")) {
    const Status st = bench::plot(*png, points, !sweep.empty());
    if (!st.is_ok()) std::fprintf(stderr, "tandem bench: no plot: %s\n", st.to_string().c_str());
  }
  return 0;
}

}  // namespace tandem::cli
