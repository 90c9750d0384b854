// #18 item 3: KV injection between workers. A decode worker took the first KvTransfer under an
// announced transfer id, from anyone (ids counted from 1); a forged one that arrived first was
// written into the sequence's blocks or made the real handoff fail. Now a transfer must carry
// the random nonce (and the positions) of its KvExpect; others are dropped and the real one is
// taken when it comes.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <zmq.hpp>

#include "model/gguf.h"
#include "model/model_config.h"
#include "runtime/wire.h"
#include "tandem/client.h"
#include "tandem/v1/worker.pb.h"
#include "tests/e2e/deployment.h"
#include "tests/security/greedy.h"
#include "workers/actor.h"
#include "workers/engine/kv_cache.h"
#include "workers/kv_transfer.h"

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

// A decode worker (its own handlers, fed directly) and a ROUTER standing for the scheduler.
struct DecodeWorker {
  zmq::context_t ctx;
  zmq::socket_t router{ctx, zmq::socket_type::router};
  std::unique_ptr<worker::WorkerHarness> worker;
  std::string identity;

  DecodeWorker() {
    const std::string dir = temp_dir();
    router.set(zmq::sockopt::linger, 0);
    router.set(zmq::sockopt::rcvtimeo, 300);
    router.bind("ipc://" + dir + "/sched.sock");
    worker::WorkerOptions o;
    o.model_path = model_file("tiny", 1);
    o.scheduler_endpoint = "ipc://" + dir + "/sched.sock";
    o.kv_endpoint = "ipc://" + dir + "/kv.sock";
    o.role = runtime::Role::kDecode;
    o.threads = 1;
    o.kv_blocks = 64;
    worker = worker::WorkerHarness::create(o).value();
    v1::WorkerMessage reg;
    EXPECT_TRUE(receive(reg) && reg.has_register_());
    v1::SchedulerCommand reply;
    reply.set_version(v1::PROTOCOL_VERSION_CURRENT);
    reply.mutable_register_reply()->set_accepted(true);
    reply.mutable_register_reply()->set_worker_id(1);
    reply.mutable_register_reply()->set_epoch(1);
    command(reply);
  }
  bool receive(v1::WorkerMessage& m) {
    zmq::message_t id, frame;
    if (!router.recv(id) || !router.recv(frame)) return false;
    identity = id.to_string();
    return runtime::parse_frame(frame, m).is_ok();
  }
  void command(const v1::SchedulerCommand& c) {
    runtime::Frames f;
    f.push_back(runtime::to_frame(c));
    worker->scheduler(f);
  }
};

// #18 item 3, the epoch: a transfer ordered by another run of the scheduler (its transfer id and
// nonce those of the KvExpect, as a replay from before a restart would have them if ids met) is
// dropped, and the real one is taken after it.
TEST(KvInjection, ATransferOfAnotherSchedulerEpochIsDropped) {
  DecodeWorker d;
  constexpr uint64_t kEpoch = 0x5eed5eed5eed5eedull, kNonce = 0x1234567890abcdefull;
  v1::SchedulerCommand expect;
  expect.set_version(v1::PROTOCOL_VERSION_CURRENT);
  v1::KvExpect* e = expect.mutable_kv_expect();
  e->set_transfer_id(7);
  e->set_seq_id(1);
  e->add_blocks(0);
  e->add_blocks(1);
  e->set_nonce(kNonce);
  e->set_positions(20);
  e->set_epoch(1);
  e->set_scheduler_epoch(kEpoch);
  d.command(expect);

  auto file = model::GgufFile::open(model_file("tiny", 1));
  auto pool = engine::KvPool::create(model::read_model_config(**file).value(), 64).value();
  auto transfer = [&](uint64_t scheduler_epoch) {
    v1::KvTransfer t;
    t.set_version(v1::PROTOCOL_VERSION_CURRENT);
    t.set_transfer_id(7);
    t.set_dest_seq_id(1);
    t.set_positions(20);
    t.set_nonce(kNonce);
    t.set_scheduler_epoch(scheduler_epoch);
    for (int i = 0; i < 20; ++i) t.add_tokens(3 + i);
    t.set_last(5);
    t.set_tail_end(-1);
    runtime::Frames frames;
    const std::vector<int32_t> blocks = {0, 1};
    worker::pack_transfer(*pool, blocks, {}, t, frames);
    return frames;
  };
  runtime::Frames stale = transfer(kEpoch ^ 1);
  d.worker->transfer(stale);
  v1::WorkerMessage m;
  EXPECT_FALSE(d.receive(m)) << "a transfer of another scheduler epoch was taken: " << m.ShortDebugString();
  runtime::Frames real = transfer(kEpoch);
  d.worker->transfer(real);
  ASSERT_TRUE(d.receive(m));
  ASSERT_TRUE(m.has_kv_received()) << m.ShortDebugString();
  EXPECT_EQ(m.kv_received().transfer_id(), 7u);
  EXPECT_EQ(m.kv_received().error_code(), v1::ERROR_CODE_UNSPECIFIED) << m.kv_received().error_message();
}

}  // namespace
}  // namespace tandem::test
