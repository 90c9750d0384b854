// `tandem bench` against `tandem up` with the tiny model: 50 requests complete and the JSON
// has the documented schema.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

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
  const pid_t pid = spawn({TANDEM_TANDEM_BIN, "bench", "--endpoint", d.endpoint(), "--num-requests", "50",
                           "--concurrency", "8", "--input-len", "16", "--output-len", "8", "--ignore-eos", "--out",
                           json_path},
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

TEST(BenchE2E, CancellationsAgainstTandemAreCounted) {
  Deployment d({"--workers", "1", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  const std::string json_path = d.dir() + "/bench.json", out = d.dir() + "/bench.out";
  const pid_t pid = spawn({TANDEM_TANDEM_BIN, "bench", "--endpoint", d.endpoint(), "--num-requests", "10",
                           "--rate", "50", "--concurrency", "4", "--input-len", "8:16", "--output-len", "64",
                           "--ignore-eos", "--cancel-fraction", "1", "--cancel-after", "2", "--out", json_path},
                          out);
  ASSERT_EQ(wait_for(pid, 120s), 0) << slurp(out) << slurp(out + ".err");
  const std::string json = slurp(json_path);
  EXPECT_NE(json.find("\"requests\":{\"completed\":0,\"failed\":0,\"cancelled\":10"), std::string::npos)
      << json.substr(0, 800);
}

}  // namespace
}  // namespace tandem
