// Plots: the report's pictures, drawn by gnuplot from data files written next to the PNG.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tandem/bench.h"

namespace tandem::bench {

namespace {

bool on_path(const char* tool) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':'))
    if (!dir.empty() && ::access((dir + "/" + tool).c_str(), X_OK) == 0) return true;
  return false;
}

}  // namespace

Status plot(const std::string& png, const std::vector<Summary>& points, bool sweep) {
  if (!on_path("gnuplot"))
    return Status::error(Code::kUnavailable, "--plot needs gnuplot on PATH (Debian: apt-get install gnuplot-nox)");
  const std::string base = png + ".data";
  std::ofstream ttft(base + ".ttft"), itl(base + ".itl"), tput(base + ".tput"), curve(base + ".curve");
  const Summary& s = points.back();
  double end_s = 0;
  for (const auto& r : s.records) {
    if (r.outcome != Outcome::kCompleted) continue;
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

}  // namespace tandem::bench
