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

constexpr const char* kUsage =
    "usage: tandem bench (--endpoint E | --openai-url URL --model NAME [--token-prompts]) [flags]\n"
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

bool on_path(const char* tool) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':'))
    if (!dir.empty() && ::access((dir + "/" + tool).c_str(), X_OK) == 0) return true;
  return false;
}

// Writes the plot's data files next to the PNG and runs gnuplot on them.
Status plot(const std::string& png, const std::vector<bench::Summary>& points, bool sweep) {
  if (!on_path("gnuplot"))
    return Status::error(Code::kUnavailable, "--plot needs gnuplot on PATH (Debian: apt-get install gnuplot-nox)");
  const std::string base = png + ".data";
  std::ofstream ttft(base + ".ttft"), itl(base + ".itl"), tput(base + ".tput"), curve(base + ".curve");
  const bench::Summary& s = points.back();
  double end_s = 0;
  for (const auto& r : s.records) {
    if (r.outcome != bench::Outcome::kCompleted) continue;
    ttft << r.ttft_ms << "\n";
    for (double v : r.itl_ms) itl << v << "\n";
    for (double t : r.token_s) end_s = std::max(end_s, t);
  }
  std::vector<uint64_t> per_second(static_cast<size_t>(end_s) + 1, 0);
  for (const auto& r : s.records)
    for (double t : r.token_s) ++per_second[static_cast<size_t>(t)];
  for (size_t i = 0; i < per_second.size(); ++i) tput << i << " " << per_second[i] << "\n";
  for (const auto& p : points)
    curve << p.output_tokens_per_s << " " << p.itl_ms.p50 << " " << p.itl_ms.p99 << " " << p.ttft_ms.p50 << " "
          << p.ttft_ms.p99 << "\n";
  ttft.close(), itl.close(), tput.close(), curve.close();
  std::ofstream gp(base + ".gp");
  gp << "set terminal pngcairo size 1200,900\nset output '" << png << "'\nset multiplot layout 2,2\n"
     << "set style fill solid 0.5\nbw_t=1\n"
     << "set title 'TTFT (ms), completed requests'\nstats '" << base << ".ttft' nooutput\n"
     << "bin(x,w)=w*floor(x/w)\nw1=(STATS_max-STATS_min)/40.0+1e-9\n"
     << "plot '" << base << ".ttft' using (bin($1,w1)):(1.0) smooth freq with boxes notitle\n"
     << "set title 'ITL (ms)'\nstats '" << base << ".itl' nooutput\nw2=(STATS_max-STATS_min)/40.0+1e-9\n"
     << "plot '" << base << ".itl' using (bin($1,w2)):(1.0) smooth freq with boxes notitle\n"
     << "set title 'output tokens/s over time (last run)'\nset xlabel 's'\n"
     << "plot '" << base << ".tput' using 1:2 with lines notitle\n";
  if (sweep)
    gp << "set title 'latency vs throughput (sweep)'\nset xlabel 'output tok/s'\nset ylabel 'ms'\n"
       << "plot '" << base << ".curve' using 1:2 w lp t 'ITL p50', '' using 1:3 w lp t 'ITL p99', "
       << "'' using 1:4 w lp t 'TTFT p50', '' using 1:5 w lp t 'TTFT p99'\n";
  gp << "unset multiplot\n";
  gp.close();
  const std::string cmd = "gnuplot '" + base + ".gp' 2>&1";
  if (std::system(cmd.c_str()) != 0) return Status::error(Code::kInternal, "gnuplot failed on " + base + ".gp");
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
  auto slo_ttft = args->real("slo-ttft-ms", 0);
  auto slo_tpot = args->real("slo-tpot-ms", 0);
  auto input_len = bench::parse_length_range(args->str("input-len").value_or("128"));
  auto output_len = bench::parse_length_range(args->str("output-len").value_or("128"));
  for (const Status* st : {&rate.status(), &burstiness.status(), &concurrency.status(), &num_requests.status(),
                           &duration.status(), &warmup.status(), &seed.status(), &drain.status(),
                           &shared_prefix.status(), &prefix_groups.status(), &cancel_fraction.status(),
                           &cancel_after.status(), &slo_ttft.status(), &slo_tpot.status(), &input_len.status(),
                           &output_len.status()})
    if (!st->is_ok()) return fail("bench", *st);
  if (*rate < 0 || *duration < 0 || *drain <= 0 || *slo_ttft < 0 || *slo_tpot < 0)
    return fail("bench", Status::invalid("--rate, --duration, --slo-* must be >= 0 and --drain-timeout > 0"));
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
  if (load.num_requests == 0 && load.duration_s <= 0) return fail("bench", Status::invalid("give --num-requests N and/or --duration S"));
  if (load.rate <= 0 && load.concurrency == 0 && sweep.empty())
    return fail("bench", Status::invalid("give --rate R and/or --concurrency C"));

  const bool openai = args->has("openai-url");
  bench::WorkloadOptions wl;
  wl.input_len = *input_len;
  wl.output_len = *output_len;
  wl.shared_prefix = static_cast<uint32_t>(*shared_prefix);
  wl.prefix_groups = static_cast<uint32_t>(*prefix_groups);
  wl.dataset = args->str("dataset").value_or("");
  wl.cancel_fraction = *cancel_fraction;
  wl.cancel_after = static_cast<uint32_t>(*cancel_after);
  wl.ignore_eos = args->has("ignore-eos");
  wl.text_prompts = openai && !args->has("token-prompts");
  wl.seed = load.seed;
  auto workload = bench::Workload::create(wl);
  if (!workload) return fail("bench", workload.status());

  Result<std::unique_ptr<bench::Target>> target = Status::invalid("no target");
  if (openai) {
    bench::OpenAIOptions o;
    o.url = *args->str("openai-url");
    o.model = args->str("model").value_or("");
    o.token_prompts = args->has("token-prompts");
    target = bench::make_openai_target(o);
  } else {
    target = bench::make_tandem_target(*args->str("endpoint"));
  }
  if (!target) return fail("bench", target.status());

  if (::isatty(STDERR_FILENO)) {
    load.progress = [](uint64_t done, uint64_t total, double tps) {
      if (total > 0)
        std::fprintf(stderr, "\r[%llu/%llu] %.1f tok/s   ", static_cast<unsigned long long>(done),
                     static_cast<unsigned long long>(total), tps);
      else
        std::fprintf(stderr, "\r[%llu done] %.1f tok/s   ", static_cast<unsigned long long>(done), tps);
      std::fflush(stderr);
    };
  }

  std::vector<bench::Summary> points;
  const size_t n_points = sweep.empty() ? 1 : sweep.size();
  for (size_t i = 0; i < n_points; ++i) {
    bench::LoadOptions point = load;
    if (sweep_conc) point.concurrency = static_cast<uint32_t>(sweep[i]);
    if (sweep_rate) point.rate = sweep[i];
    auto summary = bench::run(**target, *workload, point);
    if (load.progress) std::fputs("\n", stderr);
    if (!summary) return fail("bench", summary.status());
    if (i) std::fputs("\n", stdout);
    const std::string table = bench::summary_table(*summary);
    std::fwrite(table.data(), 1, table.size(), stdout);
    std::fflush(stdout);
    points.push_back(std::move(summary.value()));
  }

  if (auto out = args->str("out")) {
    std::string json;
    if (sweep.empty()) {
      json = bench::summary_json(points[0], true);
    } else {
      json = std::string("{\"sweep\":\"") + (sweep_conc ? "concurrency" : "rate") + "\",\"points\":[";
      for (size_t i = 0; i < points.size(); ++i) json += (i ? "," : "") + bench::summary_json(points[i], true);
      json += "]}";
    }
    json += '\n';
    std::ofstream f(*out, std::ios::binary);
    f << json;
    f.close();
    if (!f) return fail("bench", Status::error(Code::kInternal, "cannot write --out " + *out));
  }
  if (auto png = args->str("plot")) {
    const Status st = plot(*png, points, !sweep.empty());
    if (!st.is_ok()) std::fprintf(stderr, "tandem bench: no plot: %s\n", st.to_string().c_str());
  }
  return 0;
}

}  // namespace tandem::cli
