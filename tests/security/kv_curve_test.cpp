// #18 item 4: with CurveZMQ, prefill and decode workers hand KV over. The decode worker's bound
// KV socket used to be a CURVE client like the prefill worker's PUSH, so no handshake ever
// completed and every handoff timed out (8 tokens took 35 s, each recomputed). Now the KV
// socket is a CURVE server with a key pair of its own, announced in Register.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>

#include "tandem/client.h"
#include "tests/e2e/deployment.h"
#include "tests/security/greedy.h"

namespace tandem::test {
namespace {

using namespace std::chrono_literals;

TEST(KvCurve, PrefillAndDecodeWorkersHandKvOverWithCurveZmq) {
  const std::string keys = temp_dir() + "/keys";
  ASSERT_EQ(wait_for(spawn({TANDEM_TANDEM_BIN, "keys", "--out", keys}, temp_dir() + "/keys.out"), 30s), 0);
  std::string pub;
  std::ifstream(keys + "/server.pub") >> pub;
  const std::vector<std::string> split = {
      "--prefill", "1", "--decode", "1", "--threads", "1", "--kv-memory", "67108864", "--handoff-timeout-ms", "20000"};
  std::vector<int32_t> plain_tokens;
  {
    Deployment plain(split);
    ASSERT_TRUE(plain.ok());
    plain_tokens = greedy_tokens(plain);
  }
  std::vector<std::string> flags = split;
  flags.insert(flags.end(), {"--curve-keys", keys});
  Deployment d(flags);
  ASSERT_TRUE(d.ok());
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> tokens = greedy_tokens(d, pub);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(tokens, plain_tokens);
  // A handoff that times out is counted as a failure (and the sequence recomputed): none may.
  ClientOptions o;
  o.endpoint = d.endpoint();
  o.curve_server_key = pub;
  auto client = Client::connect(o);
  ASSERT_TRUE(client);
  const StatusInfo st = (*client)->status(5s).value();
  EXPECT_EQ(st.handoff_failures, 0u) << "KV handoffs failed under CurveZMQ (" << seconds << " s)";
  EXPECT_GE(st.handoffs, 1u) << "the request was never handed from the prefill to the decode worker";
}

}  // namespace
}  // namespace tandem::test
