// What the security tests share: the tokens of one greedy request on a deployment.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tandem/client.h"
#include "tests/e2e/deployment.h"

namespace tandem::test {

// 8 greedy tokens after a 17-token prompt (over one block, so a split deployment hands it off),
// through a client with CurveZMQ server key `key` ("" for none); empty on failure.
inline std::vector<int32_t> greedy_tokens(const Deployment& d, const std::string& key = "") {
  ClientOptions o;
  o.endpoint = d.endpoint();
  o.curve_server_key = key;
  auto client = Client::connect(o);
  EXPECT_TRUE(client) << client.status().to_string();
  if (!client) return {};
  GenerateRequest r;
  r.prompt_tokens = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21};
  r.max_tokens = 8;
  r.ignore_eos = true;
  auto s = (*client)->generate(r);
  std::vector<int32_t> tokens;
  Event ev;
  for (int i = 0; i < 64 && s->next(ev) && !ev.final; ++i) tokens.push_back(ev.token.id);
  EXPECT_TRUE(ev.final);
  EXPECT_EQ(ev.fin.reason, FinishReason::kLength) << ev.fin.error_message;
  return tokens;
}

}  // namespace tandem::test
