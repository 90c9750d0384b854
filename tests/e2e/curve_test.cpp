// CurveZMQ: a deployment on tcp:// with --curve-keys serves a client that has the
// scheduler's public key and refuses one (or a worker) that does not.
#include <gtest/gtest.h>

#include <fstream>

#include "tandem/client.h"
#include "tests/e2e/deployment.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Client> connect(const std::string& endpoint, const std::string& key) {
  ClientOptions o;
  o.endpoint = endpoint;
  o.curve_server_key = key;
  o.liveness_timeout = 500ms;
  auto c = Client::connect(o);
  EXPECT_TRUE(c) << c.status().to_string();
  return c ? std::move(c.value()) : nullptr;
}

TEST(Curve, AClientWithoutTheServerKeyIsRefusedAndOneWithItIsServed) {
  const std::string keys = test::temp_dir() + "/keys";
  ASSERT_EQ(
      test::wait_for(test::spawn({TANDEM_TANDEM_BIN, "keys", "--out", keys}, test::temp_dir() + "/keys.out"), 30s), 0);
  std::string pub;
  std::ifstream(keys + "/server.pub") >> pub;
  ASSERT_EQ(pub.size(), 40u);

  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(test::free_port());
  test::Deployment d({"--workers", "1", "--threads", "1", "--endpoint",
                      "tcp://:" + endpoint.substr(endpoint.rfind(':') + 1), "--curve-keys", keys});
  ASSERT_TRUE(d.ok());
  ASSERT_NE(d.output().find("endpoint " + endpoint), std::string::npos)
      << "tcp://:PORT binds 127.0.0.1: " << d.output();

  auto with_key = connect(endpoint, pub);
  GenerateRequest r;
  r.prompt_tokens = {5, 6, 7};
  r.max_tokens = 4;
  auto s = with_key->generate(r);
  Event ev;
  int tokens = 0;
  while (s->next(ev) && !ev.final) ++tokens;
  EXPECT_EQ(ev.fin.reason, FinishReason::kLength) << ev.fin.error_message;
  EXPECT_EQ(tokens, 4);

  auto without = connect(endpoint, "");
  auto st = without->status(1s);
  EXPECT_FALSE(st) << "a client without the key got a status reply";
  auto refused = without->generate(r);
  std::optional<Event> fin;
  for (int i = 0; i < 100 && !(fin && fin->final); ++i) fin = refused->next_for(100ms);
  ASSERT_TRUE(fin && fin->final) << "no final event for the refused client";
  EXPECT_EQ(fin->fin.code, Code::kUnavailable) << fin->fin.error_message;

  auto wrong = connect(endpoint, "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7");  // a well-formed other key
  EXPECT_FALSE(wrong->status(1s));

  // A worker without the key cannot register.
  const std::string dir = test::temp_dir();
  const pid_t w = test::spawn({std::string(TANDEM_TANDEM_BIN), "worker", "--model", test::model_file("tiny", 1),
                               "--scheduler", d.worker_endpoint(), "--threads", "1"},
                              dir + "/w.out");
  std::this_thread::sleep_for(3s);  // long enough to load and try to register several times
  EXPECT_EQ(with_key->status(5s).value().workers.size(), 1u);
  test::signal_one(w, SIGKILL);
  waitpid(w, nullptr, 0);
}

}  // namespace
}  // namespace tandem
