// #18 item 2: a client cannot drain (and so stop) the deployment. Drain is taken only on the
// scheduler's admin endpoint, an ipc:// socket in the private runtime folder; on the client
// endpoint it is refused with PERMISSION_DENIED and the service keeps serving.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "tandem/client.h"
#include "tests/e2e/deployment.h"

namespace tandem::test {
namespace {

using namespace std::chrono_literals;

TEST(AdminVerbs, AClientCannotDrainAndTheServiceKeepsServing) {
  Deployment d({"--workers", "1", "--threads", "1", "--kv-memory", "67108864"});
  ASSERT_TRUE(d.ok());
  const CommandOutput refused = run_command(std::string(TANDEM_TANDEM_BIN) + " drain --drain-timeout-ms 1 --endpoint " +
                                            shell_quote(d.endpoint()));
  EXPECT_EQ(refused.exit_code, 1) << refused.out << refused.err;
  EXPECT_NE(refused.err.find("Drain is not taken on the client endpoint"), std::string::npos) << refused.err;

  ClientOptions o;
  o.endpoint = d.endpoint();
  auto client = Client::connect(o);
  ASSERT_TRUE(client) << client.status().to_string();
  const StatusInfo st = (*client)->status(5s).value();
  EXPECT_FALSE(st.draining);
  GenerateRequest r;
  r.prompt_tokens = {3, 4, 5, 6};
  r.max_tokens = 4;
  r.ignore_eos = true;
  auto stream = (*client)->generate(r);
  Event ev;
  int tokens = 0;
  bool final = false;
  for (int i = 0; i < 64 && !final && stream->next(ev); ++i) {
    if (ev.final) {
      final = true;
      EXPECT_EQ(ev.fin.reason, FinishReason::kLength) << ev.fin.error_message;
    } else {
      ++tokens;
    }
  }
  EXPECT_TRUE(final);
  EXPECT_EQ(tokens, 4);
}

TEST(AdminVerbs, TheAdminEndpointTakesNoRequests) {
  Deployment d({"--workers", "1", "--threads", "1", "--kv-memory", "67108864"});
  ASSERT_TRUE(d.ok());
  ClientOptions o;
  o.endpoint = d.admin_endpoint();
  auto client = Client::connect(o);
  ASSERT_TRUE(client) << client.status().to_string();
  EXPECT_TRUE((*client)->status(5s)) << "the admin endpoint answers status queries";
  GenerateRequest r;
  r.prompt_tokens = {3, 4, 5};
  r.max_tokens = 2;
  auto stream = (*client)->generate(r);
  Event ev;
  bool final = false;
  for (int i = 0; i < 16 && !final && stream->next(ev); ++i) final = ev.final;
  EXPECT_TRUE(final);
  EXPECT_NE(ev.fin.reason, FinishReason::kLength) << "a request was served on the admin endpoint";
}

}  // namespace
}  // namespace tandem::test
