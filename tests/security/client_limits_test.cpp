// #18 item 7: the number of client identities the scheduler keeps state for is bounded. A new
// identity past --max-clients is refused (OVERLOADED) while the known ones keep being served;
// it used to be unbounded.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "tandem/client.h"
#include "tests/e2e/deployment.h"

namespace tandem::test {
namespace {

using namespace std::chrono_literals;

TEST(ClientLimits, ANewClientPastMaxClientsIsRefusedAndTheOthersServed) {
  Deployment d({"--workers", "1", "--threads", "1", "--kv-memory", "67108864", "--max-clients", "2",
                "--client-timeout-ms", "60000"});
  ASSERT_TRUE(d.ok());
  auto connect = [&] {
    ClientOptions o;
    o.endpoint = d.endpoint();
    auto c = Client::connect(o);
    EXPECT_TRUE(c) << c.status().to_string();
    return c ? std::move(c.value()) : nullptr;
  };
  // tandem up's own supervisor queries the admin endpoint: both clients here are the test's.
  auto first = connect();
  ASSERT_TRUE(first);
  ASSERT_TRUE(first->status(5s));
  auto second = connect();
  ASSERT_TRUE(second);
  ASSERT_TRUE(second->status(5s));
  auto third = connect();
  ASSERT_TRUE(third);
  GenerateRequest r;
  r.prompt_tokens = {3, 4, 5};
  r.max_tokens = 2;
  auto refused = third->generate(r);
  std::optional<Event> ev;
  for (int i = 0; i < 100 && !(ev && ev->final); ++i) ev = refused->next_for(100ms);
  ASSERT_TRUE(ev && ev->final);
  EXPECT_EQ(ev->fin.code, Code::kOverloaded) << ev->fin.error_message;
  EXPECT_NE(ev->fin.error_message.find("clients at most"), std::string::npos) << ev->fin.error_message;
  auto served = first->generate(r);
  Event e;
  int tokens = 0;
  while (served->next(e) && !e.final) ++tokens;
  EXPECT_EQ(e.fin.reason, FinishReason::kLength) << e.fin.error_message;
  EXPECT_EQ(tokens, 2);
}

}  // namespace
}  // namespace tandem::test
