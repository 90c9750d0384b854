// tandem bench: load-test tandem (through the client library) or any OpenAI-compatible
// /v1/completions server, print a table, write the summary and per-request records as JSON.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "tandem/bench.h"

namespace tandem::cli {

namespace {

constexpr const char* kHelp =
    "usage: tandem bench (--endpoint E | --openai-url URL --model NAME [--token-prompts]) [flags]\n"
    "target:\n"
    "  --endpoint E              a tandem scheduler's client endpoint (ipc://... or tcp://...)\n"
    "  --openai-url URL          an OpenAI-compatible server, http://host:port (POST /v1/completions, SSE)\n"
    "  --model NAME              the \"model\" field sent to it\n"
    "  --token-prompts           send prompts as token-id arrays (vLLM, llama.cpp); else as text\n"
    "load (at least one of --rate / --concurrency, one of --num-requests / --duration):\n"
    "  --rate R                  open loop: R requests/s (Poisson arrivals)\n"
    "  --burstiness B            gamma shape of the arrival gaps (default 1 = Poisson; < 1 burstier)\n"
    "  --concurrency C           closed loop / cap: at most C requests in flight\n"
    "  --num-requests N          measured requests\n"
    "  --duration S              stop sending after S seconds\n"
    "  --warmup N                requests run first and not counted (default 0)\n"
    "  --seed S                  workload and arrival seed (default 0)\n"
    "  --drain-timeout S         wait at most S s for requests in flight at the end (default 120)\n"
    "workload:\n"
    "  --input-len N|A:B         prompt tokens, fixed or uniform (default 128); synthetic prompts use\n"
    "                            token ids in [3, 259), present in every byte-level vocabulary\n"
    "  --output-len N|A:B        max tokens per request (default 128)\n"
    "  --shared-prefix LEN       each prompt's first LEN tokens (of --input-len) are one of --prefix-groups G\n"
    "                            shared prefixes\n"
    "  --prefix-groups G         (default 1)\n"
    "  --dataset FILE.jsonl      one request per line: \"prompt\" or \"prompt_tokens\", \"output_len\"\n"
    "  --cancel-fraction F       share of requests cancelled after --cancel-after K tokens (default 1)\n"
    "  --ignore-eos              generate exactly the output length\n"
    "report:\n"
    "  --slo-ttft-ms MS --slo-tpot-ms MS   goodput: completed requests within these per second\n"
    "  --out FILE.json           summary and per-request records\n"
    "  --sweep-concurrency c1,c2,...  or  --sweep-rate r1,r2,...   one run per point, one JSON\n"
    "  --plot FILE.png           TTFT/ITL distributions and throughput (needs gnuplot on PATH)\n"
    "exit status: 0 ok (even with failed requests), 1 the run could not be made, 2 usage\n";

int fail(const Status& st) {
  std::fprintf(stderr, "tandem bench: %s\n", st.to_string().c_str());
  return st.code() == Code::kInvalidArgument ? 2 : 1;
}

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

}  // namespace

int bench_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv,
                          {"endpoint", "openai-url", "model", "rate", "burstiness", "concurrency", "num-requests",
                           "duration", "warmup", "seed", "drain-timeout", "input-len", "output-len", "shared-prefix",
                           "prefix-groups", "dataset", "cancel-fraction", "cancel-after", "slo-ttft-ms", "slo-tpot-ms",
                           "out", "sweep-concurrency", "sweep-rate", "plot"},
                          {"token-prompts", "ignore-eos", "help"});
  if (!args) return fail(args.status());
  if (args->has("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  if (args->has("endpoint") == args->has("openai-url"))
    return fail(Status::invalid("give exactly one of --endpoint E or --openai-url URL"));
  if (args->has("sweep-concurrency") && args->has("sweep-rate"))
    return fail(Status::invalid("give at most one of --sweep-concurrency and --sweep-rate"));

  bench::LoadOptions load;
  auto rate = args->real("rate", 0);
  auto burstiness = args->real("burstiness", 1.0);
  auto concurrency = args->integer("concurrency", 0, 0, 1000000);
  auto num_requests = args->integer("num-requests", 0, 0, INT64_MAX);
  auto duration = args->real("duration", 0);
  auto warmup = args->integer("warmup", 0, 0, 1000000);
  auto seed = args->integer("seed", 0, 0, INT64_MAX);
  auto drain = args->real("drain-timeout", 120);
  auto shared_prefix = args->integer("shared-prefix", 0, 0, 1000000);
  auto prefix_groups = args->integer("prefix-groups", 1, 1, 1000000);
  auto cancel_fraction = args->real("cancel-fraction", 0);
  auto cancel_after = args->integer("cancel-after", 1, 1, 10000000);
  auto slo_ttft = args->real("slo-ttft-ms", 0);
  auto slo_tpot = args->real("slo-tpot-ms", 0);
  auto input_len = bench::parse_length_range(args->str("input-len").value_or("128"));
  auto output_len = bench::parse_length_range(args->str("output-len").value_or("128"));
  for (const Status* st : {&rate.status(), &burstiness.status(), &concurrency.status(), &num_requests.status(),
                           &duration.status(), &warmup.status(), &seed.status(), &drain.status(),
                           &shared_prefix.status(), &prefix_groups.status(), &cancel_fraction.status(),
                           &cancel_after.status(), &slo_ttft.status(), &slo_tpot.status(), &input_len.status(),
                           &output_len.status()})
    if (!st->is_ok()) return fail(*st);
  if (*rate < 0 || *duration < 0 || *drain <= 0 || *slo_ttft < 0 || *slo_tpot < 0)
    return fail(Status::invalid("--rate, --duration, --slo-* must be >= 0 and --drain-timeout > 0"));
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
    if (!list) return fail(list.status());
    sweep = std::move(list.value());
  }
  // Validate the load shape once, before connecting anywhere.
  if (load.num_requests == 0 && load.duration_s <= 0) return fail(Status::invalid("give --num-requests N and/or --duration S"));
  if (load.rate <= 0 && load.concurrency == 0 && sweep.empty())
    return fail(Status::invalid("give --rate R and/or --concurrency C"));

  bench::WorkloadOptions wl;
  wl.input_len = *input_len;
  wl.output_len = *output_len;
  wl.shared_prefix = static_cast<uint32_t>(*shared_prefix);
  wl.prefix_groups = static_cast<uint32_t>(*prefix_groups);
  wl.dataset = args->str("dataset").value_or("");
  wl.cancel_fraction = *cancel_fraction;
  wl.cancel_after = static_cast<uint32_t>(*cancel_after);
  wl.ignore_eos = args->has("ignore-eos");
  wl.text_prompts = args->has("openai-url") && !args->has("token-prompts");
  wl.seed = load.seed;
  auto workload = bench::Workload::create(wl);
  if (!workload) return fail(workload.status());

  auto target = make_target(*args);
  if (!target) return fail(target.status());

  if (::isatty(STDERR_FILENO)) load.progress = print_progress;

  std::vector<bench::Summary> points;
  if (Status st = run_points(**target, *workload, load, sweep, sweep_conc, points); !st) return fail(st);
  if (auto out = args->str("out")) {
    const std::string json =
        sweep.empty() ? bench::summary_json(points[0], true) : bench::sweep_json(sweep_conc ? "concurrency" : "rate", points);
    if (Status st = write_file(*out, json + '\n'); !st) return fail(st);
  }
  if (auto png = args->str("plot")) {
    const Status st = bench::plot(*png, points, !sweep.empty());
    if (!st.is_ok()) std::fprintf(stderr, "tandem bench: no plot: %s\n", st.to_string().c_str());
  }
  return 0;
}

}  // namespace tandem::cli
