// The scheduler's Prometheus metrics on real deployments (`tandem up`): every value moves as the
// requests that ran say it should (tokens, latencies by how a request ended, refusals, prefix
// cache hits, KV usage while a request runs, handoffs), `tandem status --prometheus` prints the
// same text, and `promtool check metrics` (Debian's prometheus) accepts it.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <sstream>

#include "tests/e2e/streams.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using Deployment = test::ClientDeployment;

// The sum of the samples named `name` whose labels contain every one of `labels` (`k="v"`).
double sample(const std::string& text, const std::string& name, const std::vector<std::string>& labels = {}) {
  std::istringstream in(text);
  double sum = 0;
  bool found = false;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line.rfind(name, 0) != 0) continue;
    const char after = line.size() > name.size() ? line[name.size()] : '\0';
    if (after != '{' && after != ' ') continue;
    bool match = true;
    for (const std::string& l : labels) match &= line.find(l) != std::string::npos;
    if (!match) continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
    found = true;
  }
  EXPECT_TRUE(found) << "no sample " << name << " in:\n" << text;
  return sum;
}

std::string metrics(Client& c) {
  auto text = c.metrics_text(5s);
  EXPECT_TRUE(text) << text.status().to_string();
  return text ? *text : "";
}

// Runs `promtool check metrics` on `text`: its exit code and output. Lint problems exit 3; the
// only one tandem's text draws is the colon of vLLM's namespacing ("tandem:"), which promtool
// reserves for recording rules.
std::pair<int, std::string> promtool(const std::string& text) {
  const std::string file = test::temp_dir() + "/metrics.txt";
  FILE* f = std::fopen(file.c_str(), "w");
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  FILE* p = ::popen(("promtool check metrics < " + file + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

void expect_promtool_accepts(const std::string& text) {
  ASSERT_EQ(std::system("command -v promtool >/dev/null"), 0)
      << "promtool not found: scripts/install-deps.sh installs Debian's prometheus package";
  auto [code, out] = promtool(text);
  EXPECT_TRUE(code == 0 || code == 3) << "promtool failed (" << code << "):\n" << out;
  std::istringstream lines(out);
  int problems = 0;
  for (std::string line; std::getline(lines, line); ++problems)
    EXPECT_NE(line.find("metric names should not contain ':'"), std::string::npos) << "promtool: " << line;
  EXPECT_GT(problems, 0) << "the colon lint names every family";
}

GenerateRequest greedy(std::vector<int32_t> prompt, uint32_t max_tokens) {
  GenerateRequest r;
  r.prompt_tokens = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

TEST(Metrics, ValuesMoveWithTheRequestsThatRan) {
  Deployment d({"--workers", "1", "--threads", "1", "--test-step-delay-ms", "30"});
  ASSERT_TRUE(d.ok());
  auto c = d.client();
  ASSERT_TRUE(c);
  const std::string before = metrics(*c);
  EXPECT_EQ(sample(before, "tandem:generation_tokens_total"), 0);
  EXPECT_EQ(sample(before, "tandem:e2e_request_latency_seconds_count"), 0);
  EXPECT_EQ(sample(before, "tandem:kv_cache_usage_perc", {"worker=\"", "role=\"both\""}), 0);
  EXPECT_NE(before.find("model_name=\"tandem-tiny\""), std::string::npos) << before;

  // Two requests of one 40-token prompt (the second finds 32 of its tokens cached), one that
  // stops on a token the first generated, one refused (a token outside the vocabulary).
  const std::vector<int32_t> prompt = test::prompt_of(40, 1);
  test::Collected a = test::collect(*c->generate(greedy(prompt, 8)));
  ASSERT_EQ(a.fin.reason, FinishReason::kLength) << a.fin.error_message;
  test::Collected b = test::collect(*c->generate(greedy(prompt, 8)));
  GenerateRequest stop = greedy(test::prompt_of(20, 2), 8);
  test::Collected s0 = test::collect(*c->generate(stop));
  stop.stop_token_sequences = {{s0.tokens.at(2)}};
  test::Collected s = test::collect(*c->generate(stop));
  ASSERT_EQ(s.fin.reason, FinishReason::kStop);
  test::Collected refused = test::collect(*c->generate(greedy({3, 1 << 30}, 4)));
  ASSERT_EQ(refused.fin.code, Code::kInvalidArgument);

  // A long one: while it runs it is the one running request and holds KV; then it is cancelled.
  auto longer = c->generate(greedy(test::prompt_of(30, 3), 400));
  ASSERT_TRUE(longer->next_for(30s)) << "no first token";
  const std::string during = metrics(*c);
  EXPECT_EQ(sample(during, "tandem:num_requests_running"), 1);
  EXPECT_EQ(sample(during, "tandem:num_requests_waiting"), 0);
  EXPECT_GT(sample(during, "tandem:kv_cache_usage_perc"), 0);
  longer->cancel();
  test::Collected cancelled = test::collect(*longer);
  ASSERT_EQ(cancelled.fin.reason, FinishReason::kCancelled);

  const std::vector<const test::Collected*> ran = {&a, &b, &s0, &s, &cancelled};
  double prompt_tokens = 0, generated = 0, cached = 0, gaps = 0;
  for (const test::Collected* r : ran) {
    prompt_tokens += r->fin.prompt_tokens;
    generated += r->fin.completion_tokens;
    cached += r->fin.cached_prompt_tokens;
    gaps += r->fin.completion_tokens - 1;
  }
  // The cancelled request's blocks come back once the plans in flight that name it are answered.
  std::string after = metrics(*c);
  for (int i = 0; i < 100 && sample(after, "tandem:kv_cache_usage_perc") > 0; ++i) {
    std::this_thread::sleep_for(50ms);
    after = metrics(*c);
  }
  EXPECT_EQ(sample(after, "tandem:kv_cache_usage_perc"), 0) << "cached blocks are not in use";
  EXPECT_EQ(sample(after, "tandem:num_requests_running"), 0);
  EXPECT_EQ(sample(after, "tandem:generation_tokens_total"), generated);
  EXPECT_EQ(sample(after, "tandem:prompt_tokens_total"), prompt_tokens);
  EXPECT_EQ(sample(after, "tandem:prefix_cache_queries_total"), prompt_tokens);
  EXPECT_EQ(sample(after, "tandem:prefix_cache_hits_total"), cached);
  EXPECT_EQ(b.fin.cached_prompt_tokens, 32u);
  EXPECT_EQ(sample(after, "tandem:time_to_first_token_seconds_count"), 5);
  EXPECT_EQ(sample(after, "tandem:inter_token_latency_seconds_count"), gaps);
  EXPECT_EQ(sample(after, "tandem:request_queue_time_seconds_count"), 5);
  EXPECT_EQ(sample(after, "tandem:e2e_request_latency_seconds_count", {"finish_reason=\"length\""}), 3);
  EXPECT_EQ(sample(after, "tandem:e2e_request_latency_seconds_count", {"finish_reason=\"stop\""}), 1);
  EXPECT_EQ(sample(after, "tandem:e2e_request_latency_seconds_count", {"finish_reason=\"cancelled\""}), 1);
  EXPECT_EQ(sample(after, "tandem:e2e_request_latency_seconds_count", {"finish_reason=\"error\""}), 0);
  EXPECT_EQ(sample(after, "tandem:request_success_total"), 4);
  EXPECT_EQ(sample(after, "tandem:request_refused_total", {"code=\"invalid_argument\""}), 1);
  EXPECT_EQ(sample(after, "tandem:request_refused_total"), 1);
  // Steps of at least 30 ms put every gap between two tokens above the first bound (10 ms).
  EXPECT_EQ(sample(after, "tandem:inter_token_latency_seconds_bucket", {"le=\"0.01\""}), 0);
  EXPECT_EQ(sample(after, "tandem:inter_token_latency_seconds_bucket", {"le=\"5\""}), gaps);
  EXPECT_GE(sample(after, "tandem:inter_token_latency_seconds_sum"), gaps * 0.01);
  EXPECT_EQ(sample(after, "tandem:inter_token_latency_seconds_bucket", {"le=\"+Inf\""}), gaps);
  auto status = c->status();
  ASSERT_TRUE(status);
  EXPECT_EQ(sample(after, "tandem:worker_steps_total"), double(status->workers.at(0).steps));
  EXPECT_EQ(sample(after, "tandem:num_preemptions_total"), double(status->preemptions));
  EXPECT_EQ(sample(after, "tandem:kv_handoffs_total"), 0);
  expect_promtool_accepts(after);
}

// `tandem status --prometheus` prints the client library's text, on the client and the admin
// endpoint: promtool accepts it.
TEST(Metrics, StatusPrometheusPrintsWhatPromtoolAccepts) {
  Deployment d({"--workers", "1", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  auto c = d.client();
  ASSERT_TRUE(c);
  test::collect(*c->generate(greedy(test::prompt_of(20, 5), 4)));
  const std::string out = test::temp_dir() + "/status.out";
  const pid_t p = test::spawn({TANDEM_TANDEM_BIN, "status", "--endpoint", d.endpoint(), "--prometheus"}, out);
  ASSERT_EQ(test::wait_for(p, 20s), 0) << test::slurp(out + ".err");
  const std::string text = test::slurp(out);
  EXPECT_EQ(sample(text, "tandem:generation_tokens_total"), 4);
  EXPECT_EQ(sample(text, "tandem:time_to_first_token_seconds_count"), 1);
  expect_promtool_accepts(text);
  // The admin endpoint answers the same query (the metrics of a deployment whose clients use CurveZMQ).
  const pid_t admin =
      test::spawn({TANDEM_TANDEM_BIN, "status", "--endpoint", d.admin_endpoint(), "--prometheus"}, out + ".admin");
  ASSERT_EQ(test::wait_for(admin, 20s), 0) << test::slurp(out + ".admin.err");
  EXPECT_EQ(sample(test::slurp(out + ".admin"), "tandem:generation_tokens_total"), 4);
}

// Prefill and decode workers: each handoff is counted, with its time, and every worker has its series.
TEST(Metrics, HandoffsAreCountedPerDisaggregatedRequest) {
  Deployment d({"--prefill", "1", "--decode", "1", "--threads", "1", "--kv-memory", "67108864"});
  ASSERT_TRUE(d.ok());
  auto c = d.client();
  ASSERT_TRUE(c);
  for (uint32_t i = 0; i < 3; ++i)
    ASSERT_EQ(test::collect(*c->generate(greedy(test::prompt_of(24, 10 + i), 6))).fin.reason, FinishReason::kLength);
  const std::string text = metrics(*c);
  EXPECT_EQ(sample(text, "tandem:kv_handoffs_total"), 3);
  EXPECT_EQ(sample(text, "tandem:kv_handoff_seconds_count"), 3);
  EXPECT_GT(sample(text, "tandem:kv_handoff_bytes_total"), 0);
  EXPECT_GT(sample(text, "tandem:worker_steps_total", {"role=\"prefill\""}), 0);
  EXPECT_GT(sample(text, "tandem:worker_steps_total", {"role=\"decode\""}), 0);
  EXPECT_EQ(sample(text, "tandem:generation_tokens_total"), 18);
  expect_promtool_accepts(text);
}

}  // namespace
}  // namespace tandem
