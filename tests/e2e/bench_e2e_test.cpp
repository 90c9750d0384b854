// `tandem bench` against `tandem up` with the tiny model: 50 requests complete and the JSON
// has the documented schema.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "tests/e2e/deployment.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using test::Deployment;
using test::slurp;
using test::spawn;
using test::wait_for;

TEST(BenchE2E, FiftyRequestsCompleteWithTheJsonSchema) {
  Deployment d({"--workers", "1", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  const std::string json_path = d.dir() + "/bench.json", out = d.dir() + "/bench.out";
  const pid_t pid =
      spawn({TANDEM_TANDEM_BIN, "bench", "--endpoint", d.endpoint(), "--num-requests", "50", "--concurrency", "8",
             "--input-len", "16", "--output-len", "8", "--ignore-eos", "--out", json_path},
            out);
  ASSERT_EQ(wait_for(pid, 120s), 0) << slurp(out) << slurp(out + ".err");
  const std::string table = slurp(out);
  std::printf("%s", table.c_str());
  EXPECT_NE(table.find("50 completed, 0 failed, 0 cancelled"), std::string::npos) << table;
  const std::string json = slurp(json_path);
  for (const char* key : {"\"requests\":{\"completed\":50,\"failed\":0,\"cancelled\":0", "\"throughput\":{",
                          "\"requests_per_s\":", "\"input_tokens_per_s\":", "\"output_tokens_per_s\":",
                          "\"tokens\":{\"input\":800,\"cached_input\":0,\"output\":400}", "\"records\":["})
    EXPECT_NE(json.find(key), std::string::npos) << key << "\n" << json.substr(0, 800);
  for (const char* dist : {"ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"}) {
    const size_t at = json.find(std::string("\"") + dist + "\":{");
    ASSERT_NE(at, std::string::npos) << dist;
    const std::string obj = json.substr(at, json.find('}', at) - at);
    for (const char* stat : {"\"mean\":", "\"p50\":", "\"p90\":", "\"p99\":", "\"max\":"})
      EXPECT_NE(obj.find(stat), std::string::npos) << dist << " " << stat;
  }
  size_t records = 0;
  for (size_t at = json.find("\"index\":"); at != std::string::npos; at = json.find("\"index\":", at + 1)) ++records;
  EXPECT_EQ(records, 50u);
}

// Every request is cancelled after its 2nd token. The worker sleeps 50 ms before each step
// (--test-step-delay-ms), so a 64-token request needs over 3 s of steps while its cancel needs one
// socket round trip: the cancel wins by construction, on a fast machine or a loaded one.
TEST(BenchE2E, CancellationsAgainstTandemAreCounted) {
  constexpr int kRequests = 10, kCancelAfter = 2, kPipelineDepth = 2;
  Deployment d({"--workers", "1", "--threads", "1", "--test-step-delay-ms", "50", "--pipeline-depth",
                std::to_string(kPipelineDepth)});
  ASSERT_TRUE(d.ok());
  const std::string json_path = d.dir() + "/bench.json", out = d.dir() + "/bench.out";
  const pid_t pid = spawn({TANDEM_TANDEM_BIN,
                           "bench",
                           "--endpoint",
                           d.endpoint(),
                           "--num-requests",
                           std::to_string(kRequests),
                           "--rate",
                           "50",
                           "--concurrency",
                           "4",
                           "--input-len",
                           "8:16",
                           "--output-len",
                           "64",
                           "--ignore-eos",
                           "--cancel-fraction",
                           "1",
                           "--cancel-after",
                           std::to_string(kCancelAfter),
                           "--out",
                           json_path},
                          out);
  ASSERT_EQ(wait_for(pid, 120s), 0) << slurp(out) << slurp(out + ".err");
  const std::string json = slurp(json_path);
  EXPECT_NE(json.find("\"requests\":{\"completed\":0,\"failed\":0,\"cancelled\":" + std::to_string(kRequests)),
            std::string::npos)
      << json.substr(0, 800);
  // One record per request: its outcome, the reason of the final event it got, its tokens.
  int records = 0, cancelled_finals = 0;
  for (size_t at = json.find("{\"index\":"); at != std::string::npos; at = json.find("{\"index\":", at + 1)) {
    const std::string record = json.substr(at, json.find('}', at) - at);
    ++records;
    EXPECT_NE(record.find("\"outcome\":\"cancelled\""), std::string::npos) << record;
    if (record.find("\"finish_reason\":\"cancelled\"") != std::string::npos) ++cancelled_finals;
    const size_t tokens_at = record.find("\"output_tokens\":");
    ASSERT_NE(tokens_at, std::string::npos) << record;
    const int tokens = std::stoi(record.substr(tokens_at + std::strlen("\"output_tokens\":")));
    // The tokens it had when it cancelled, plus at most the steps already in flight.
    EXPECT_GE(tokens, kCancelAfter) << record;
    EXPECT_LE(tokens, kCancelAfter + kPipelineDepth) << record;
  }
  EXPECT_EQ(records, kRequests);
  EXPECT_EQ(cancelled_finals, kRequests) << "the harness's cancelled count must equal the cancelled final events";
}

// --openai-chat is a flag of the OpenAI target: without --openai-url, or with --token-prompts
// (chat messages are text), the command refuses to run with a usage error naming the problem.
TEST(BenchE2E, OpenAIChatFlagIsCheckedBeforeAnythingRuns) {
  const std::string out = test::temp_dir() + "/bench-chat.out";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--endpoint", "ipc:///nonexistent/bench.sock", "--openai-chat"}, "--openai-chat needs --openai-url URL"},
      {{"--openai-url", "http://127.0.0.1:9", "--model", "m", "--openai-chat", "--token-prompts"},
       "--token-prompts cannot be used with --openai-chat"}};
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> argv = {TANDEM_TANDEM_BIN, "bench", "--num-requests", "1", "--concurrency", "1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const pid_t pid = spawn(argv, out);
    EXPECT_EQ(wait_for(pid, 30s), 2) << message;
    EXPECT_NE(slurp(out + ".err").find(message), std::string::npos) << slurp(out + ".err");
  }
}

}  // namespace
}  // namespace tandem
