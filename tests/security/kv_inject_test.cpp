// #18 item 3: KV injection between workers. A decode worker took the first KvTransfer under an
// announced transfer id, from anyone (ids counted from 1); a forged one that arrived first was
// written into the sequence's blocks or made the real handoff fail. Now a transfer must carry
// the random nonce (and the positions) of its KvExpect; others are dropped and the real one is
// taken when it comes.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <zmq.hpp>

#include "runtime/wire.h"
#include "tandem/client.h"
#include "tandem/v1/worker.pb.h"
#include "tests/e2e/deployment.h"
#include "tests/security/greedy.h"

namespace tandem::test {
namespace {

using namespace std::chrono_literals;

TEST(KvInjection, ForgedTransfersUnderAnnouncedIdsAreDropped) {
  const std::vector<std::string> split = {
      "--prefill", "1", "--decode", "1", "--threads", "1", "--kv-memory", "67108864", "--handoff-timeout-ms", "20000"};
  std::vector<int32_t> clean;
  {
    Deployment d(split);
    ASSERT_TRUE(d.ok());
    clean = greedy_tokens(d);
  }
  Deployment d(split);
  ASSERT_TRUE(d.ok());
  // The decode worker's KV socket (tandem up: kv-worker-1.sock in the runtime folder). Push a
  // forged transfer for each of the first ids before any request: the worker holds them as
  // "early" until their KvExpect comes.
  zmq::context_t ctx;
  zmq::socket_t push(ctx, zmq::socket_type::push);
  push.set(zmq::sockopt::linger, 1000);
  push.connect("ipc://" + d.dir() + "/run/kv-worker-1.sock");
  for (uint64_t id = 1; id <= 32; ++id) {
    v1::KvTransfer t;
    t.set_version(v1::PROTOCOL_VERSION_CURRENT);
    t.set_transfer_id(id);
    t.set_positions(17);
    for (int i = 0; i < 17; ++i) t.add_tokens(3);
    ASSERT_TRUE(push.send(runtime::to_frame(t), zmq::send_flags::none));
  }
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(greedy_tokens(d), clean);
  ClientOptions o;
  o.endpoint = d.endpoint();
  auto client = Client::connect(o);
  ASSERT_TRUE(client);
  const StatusInfo st = (*client)->status(5s).value();
  EXPECT_GE(st.handoffs, 1u);
  EXPECT_EQ(st.handoff_failures, 0u) << "a forged transfer took the place of the real one";
}

}  // namespace
}  // namespace tandem::test
