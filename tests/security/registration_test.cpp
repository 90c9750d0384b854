// #18 item 1 (in part): a refused registration never tells the peer what the scheduler expects.
// The refusal of a worker with another model used to contain the scheduler's own model
// fingerprint, so any peer could read it and register with it next.
#include <gtest/gtest.h>

#include <dirent.h>

#include <csignal>

#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "model/gguf.h"
#include "model/model_config.h"
#include "runtime/wire.h"
#include "tandem/v1/worker.pb.h"
#include "tests/e2e/deployment.h"
#include "tests/security/greedy.h"
#include "workers/engine/kv_cache.h"

namespace tandem::test {
namespace {

TEST(Registration, ARefusalNamesNeitherFingerprint) {
  const std::string model = model_file("tiny", 1);
  Deployment d({"--workers", "1", "--threads", "1"}, model);
  ASSERT_TRUE(d.ok());
  auto file = model::GgufFile::open(model);
  ASSERT_TRUE(file);
  const std::string expected = model::model_fingerprint(**file, model::read_model_config(**file).value());
  ASSERT_FALSE(expected.empty());

  zmq::context_t ctx;
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvtimeo, 10000);
  dealer.connect(d.worker_endpoint());
  v1::WorkerMessage reg;
  reg.set_version(v1::PROTOCOL_VERSION_CURRENT);
  reg.mutable_register_()->set_role(v1::WORKER_ROLE_BOTH);
  reg.mutable_register_()->set_model_fingerprint("guess");
  ASSERT_TRUE(dealer.send(runtime::to_frame(reg), zmq::send_flags::none));
  zmq::message_t frame;
  ASSERT_TRUE(dealer.recv(frame));
  v1::SchedulerCommand c;
  ASSERT_TRUE(runtime::parse_frame(frame, c).is_ok());
  ASSERT_TRUE(c.has_register_reply());
  EXPECT_FALSE(c.register_reply().accepted());
  EXPECT_EQ(c.register_reply().reason(), v1::REFUSAL_REASON_MODEL_FINGERPRINT);
  const std::string message = c.register_reply().error_message();
  EXPECT_EQ(message.find(expected), std::string::npos) << "the refusal gives the scheduler's fingerprint: " << message;
  EXPECT_EQ(message.find("guess"), std::string::npos) << message;
  EXPECT_NE(message.find("must load the same model file"), std::string::npos) << message;
}

std::string fingerprint() {
  auto file = model::GgufFile::open(model_file("tiny", 1));
  return model::model_fingerprint(**file, model::read_model_config(**file).value());
}

// A peer on the worker endpoint that speaks as a worker of its own making.
class FakeWorker {
 public:
  explicit FakeWorker(const std::string& endpoint) {
    dealer_.set(zmq::sockopt::linger, 0);
    dealer_.set(zmq::sockopt::rcvtimeo, 10000);
    dealer_.connect(endpoint);
  }
  // Sends `body` (set on a WorkerMessage) and returns the scheduler's RegisterReply to it.
  v1::RegisterReply ask(const std::function<void(v1::WorkerMessage&)>& body) {
    v1::WorkerMessage m;
    m.set_version(v1::PROTOCOL_VERSION_CURRENT);
    body(m);
    EXPECT_TRUE(dealer_.send(runtime::to_frame(m), zmq::send_flags::none));
    zmq::message_t frame;
    v1::SchedulerCommand c;
    if (!dealer_.recv(frame) || !runtime::parse_frame(frame, c).is_ok() || !c.has_register_reply()) {
      ADD_FAILURE() << "no RegisterReply";
      return {};
    }
    return c.register_reply();
  }
  v1::RegisterReply register_as(const v1::Register& r) {
    return ask([&](v1::WorkerMessage& m) { *m.mutable_register_() = r; });
  }

 private:
  zmq::context_t ctx_;
  zmq::socket_t dealer_{ctx_, zmq::socket_type::dealer};
};

// The scheduler's reply to a Register of a peer's own making.
v1::RegisterReply register_as(const std::string& endpoint, const v1::Register& r) {
  return FakeWorker(endpoint).register_as(r);
}

// The tiny model's registration as a decode worker would send it, KV at `kv_endpoint`.
v1::Register decode_worker(const std::string& kv_endpoint) {
  v1::Register r;
  r.set_role(v1::WORKER_ROLE_DECODE);
  r.set_model_fingerprint(fingerprint());
  r.set_kv_blocks(64);
  r.set_block_tokens(16);
  r.set_block_bytes(8192);
  r.set_threads(1);
  r.set_name("fake");
  r.set_kv_endpoint(kv_endpoint);
  return r;
}

// #18 item 1: a worker could name any kv_endpoint, and prefill workers then pushed other
// requests' KV there. Now it must be on the address the worker registers from (ipc:// only over
// ipc://) or listed in [scheduler] kv_endpoint_allow; a refusal says which rule, typed.
TEST(Registration, AKvEndpointMustBeTheWorkersOwnOrAllowed) {
  {
    Deployment d({"--workers", "1", "--threads", "1"});
    ASSERT_TRUE(d.ok());
    const v1::RegisterReply far = register_as(d.worker_endpoint(), decode_worker("tcp://10.9.9.9:5600"));
    EXPECT_FALSE(far.accepted()) << "an ipc:// peer named a KV endpoint on another host";
    EXPECT_EQ(far.reason(), v1::REFUSAL_REASON_KV_ENDPOINT);
    EXPECT_NE(far.error_message().find("kv_endpoint_allow"), std::string::npos) << far.error_message();
    EXPECT_TRUE(register_as(d.worker_endpoint(), decode_worker("ipc://" + d.dir() + "/kv.sock")).accepted());
    EXPECT_TRUE(register_as(d.worker_endpoint(), decode_worker("tcp://127.0.0.1:5600")).accepted());
  }
  const std::string workers = "tcp://127.0.0.1:" + std::to_string(free_port());
  Deployment d({"--workers", "1", "--threads", "1", "--worker-endpoint", workers, "--kv-endpoint-allow",
                "10.9.9.8, tcp://10.9.9.7:5600"});
  ASSERT_TRUE(d.ok());
  const v1::RegisterReply ipc = register_as(workers, decode_worker("ipc://" + d.dir() + "/kv.sock"));
  EXPECT_FALSE(ipc.accepted()) << "a tcp:// peer named an ipc:// KV endpoint";
  EXPECT_EQ(ipc.reason(), v1::REFUSAL_REASON_KV_ENDPOINT);
  const v1::RegisterReply other = register_as(workers, decode_worker("tcp://10.9.9.9:5600"));
  EXPECT_FALSE(other.accepted()) << "a peer on 127.0.0.1 named a KV endpoint on 10.9.9.9";
  EXPECT_EQ(other.reason(), v1::REFUSAL_REASON_KV_ENDPOINT);
  EXPECT_EQ(other.error_message().find("127.0.0.1"), std::string::npos) << other.error_message();
  EXPECT_TRUE(register_as(workers, decode_worker("tcp://127.0.0.1:5600")).accepted()) << "its own address";
  EXPECT_TRUE(register_as(workers, decode_worker("tcp://10.9.9.8:5600")).accepted()) << "an allowed host";
  EXPECT_TRUE(register_as(workers, decode_worker("tcp://10.9.9.7:5600")).accepted()) << "an allowed endpoint";
  EXPECT_FALSE(register_as(workers, decode_worker("tcp://10.9.9.7:5601")).accepted()) << "not the allowed port";
}

// #18 item 11: [scheduler] kv_endpoint_allow reloads on SIGHUP with the key allow-lists: tandem
// up re-reads it from its config file (into the file the scheduler's --kv-endpoint-allow-file
// names) and passes the signal on. A newly listed host is taken at the next registration; a
// decode worker registered under a host no longer listed is fenced (its next message is answered
// "register first"); a config that no longer parses keeps the list in force.
TEST(Registration, KvEndpointAllowReloadsOnSighupFromTheConfigFile) {
  const std::string config = temp_dir() + "/deploy.toml";
  auto write_config = [&](const std::string& text) { std::ofstream(config) << text; };
  write_config("[scheduler]\nkv_endpoint_allow = \"10.9.9.8\"\n");
  const std::string workers = "tcp://127.0.0.1:" + std::to_string(free_port());
  Deployment d({"--config", config, "--workers", "1", "--threads", "1", "--worker-endpoint", workers});
  ASSERT_TRUE(d.ok());
  // A decode worker on the listed host, registered and staying connected.
  FakeWorker held(workers);
  const v1::RegisterReply accepted = held.register_as(decode_worker("tcp://10.9.9.8:5600"));
  ASSERT_TRUE(accepted.accepted()) << accepted.error_message();
  EXPECT_FALSE(register_as(workers, decode_worker("tcp://10.9.9.6:5600")).accepted()) << "not listed yet";

  write_config("[scheduler]\nkv_endpoint_allow = \"10.9.9.6\"  # 10.9.9.8 no longer\n");
  ASSERT_EQ(signal_one(d.pid(), SIGHUP), 0);
  bool taken = false;
  for (int i = 0; i < 50 && !taken; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    taken = register_as(workers, decode_worker("tcp://10.9.9.6:5600")).accepted();
  }
  EXPECT_TRUE(taken) << "the host added to kv_endpoint_allow was not taken after SIGHUP\n" << d.output();
  // Fenced: its next message is answered "register first".
  const v1::RegisterReply fenced = held.ask([](v1::WorkerMessage& m) { m.mutable_heartbeat(); });
  EXPECT_EQ(fenced.reason(), v1::REFUSAL_REASON_UNKNOWN_WORKER) << fenced.DebugString();
  EXPECT_FALSE(register_as(workers, decode_worker("tcp://10.9.9.8:5600")).accepted()) << "no longer listed";

  write_config("[scheduler\nkv_endpoint_allow = \"10.9.9.5\"\n");
  ASSERT_EQ(signal_one(d.pid(), SIGHUP), 0);
  std::string err;
  for (int i = 0; i < 50 && err.find("allow-list in force stays") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    err = slurp(d.dir() + "/up.out.err");
  }
  EXPECT_NE(err.find("the kv_endpoint allow-list in force stays"), std::string::npos) << err;
  EXPECT_TRUE(register_as(workers, decode_worker("tcp://10.9.9.6:5600")).accepted()) << "the list in force";
  EXPECT_FALSE(greedy_tokens(d).empty()) << "the deployment serves on";
}

// tandem up on a tcp:// worker endpoint gives its decode workers ipc:// KV sockets and allows
// them at the scheduler: the split still hands KV over.
TEST(Registration, TandemUpOnTcpAllowsItsOwnKvSockets) {
  const std::string workers = "tcp://127.0.0.1:" + std::to_string(free_port());
  Deployment d(
      {"--prefill", "1", "--decode", "1", "--threads", "1", "--kv-memory", "67108864", "--worker-endpoint", workers});
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(greedy_tokens(d).empty());
  ClientOptions o;
  o.endpoint = d.endpoint();
  auto client = Client::connect(o);
  ASSERT_TRUE(client);
  EXPECT_GE((*client)->status(std::chrono::seconds(5)).value().handoffs, 1u);
}

// The resident memory of the scheduler `tandem up` started (pid `up`), in bytes.
uint64_t scheduler_rss(pid_t up) {
  DIR* proc = opendir("/proc");
  uint64_t rss = 0;
  while (dirent* e = proc ? readdir(proc) : nullptr) {
    const std::string pid = e->d_name;
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = slurp("/proc/" + pid + "/stat"), cmd = slurp("/proc/" + pid + "/cmdline");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || std::stoi(stat.substr(paren + 4)) != up) continue;
    const size_t arg1 = cmd.find('\0') + 1;  // `tandem scheduler ...`, not a worker's --scheduler
    if (cmd.compare(arg1, 10, std::string("scheduler") + '\0') != 0) continue;
    std::ifstream status("/proc/" + pid + "/status");
    for (std::string line; std::getline(status, line);)
      if (line.rfind("VmRSS:", 0) == 0) rss = std::stoull(line.substr(6)) * 1024;
  }
  if (proc) closedir(proc);
  return rss;
}

// #18 item 1: one Register of 2^24 blocks made the scheduler allocate ~0.5 GB for their
// accounting, and the declared pool was not bounded by anything a worker could hold. Now a pool
// over --max-worker-kv-bytes (default: this host's MemTotal) or of blocks smaller than the
// model's KV is refused, and a claim within bounds costs memory only as blocks are used.
TEST(Registration, AKvPoolIsBoundedAndAHugeClaimCostsTheSchedulerLittle) {
  Deployment d({"--workers", "1", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  v1::Register r = decode_worker("ipc://" + d.dir() + "/kv.sock");
  r.set_role(v1::WORKER_ROLE_BOTH);
  r.set_kv_blocks(1u << 24);
  // 2^24 blocks of 4-bit codes' size (64 bytes per token; rotated 3-bit codes take 48):
  // 16 GiB, within the host's memory here or refused; either way the scheduler stays small.
  r.set_block_bytes(16 * 64);
  const uint64_t before = scheduler_rss(d.pid());
  ASSERT_GT(before, 0u);
  const v1::RegisterReply claim = register_as(d.worker_endpoint(), r);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const uint64_t after = scheduler_rss(d.pid());
  std::cerr << "scheduler RSS " << before << " -> " << after << "\n";
  EXPECT_LT(after, before + (uint64_t{32} << 20))
      << "the scheduler grew from " << before << " to " << after << " bytes on a 2^24-block claim ("
      << (claim.accepted() ? "accepted" : "refused") << ")";

  r.set_block_bytes(uint64_t{1} << 40);  // 2^64 bytes in all: more than any host
  const v1::RegisterReply huge = register_as(d.worker_endpoint(), r);
  EXPECT_FALSE(huge.accepted()) << "a worker claimed 2^64 bytes of KV";
  EXPECT_EQ(huge.reason(), v1::REFUSAL_REASON_KV_POOL);
  EXPECT_NE(huge.error_message().find("--max-worker-kv-bytes"), std::string::npos) << huge.error_message();
  r.set_block_bytes(1);  // a block the model's KV cannot fit in
  const v1::RegisterReply tiny = register_as(d.worker_endpoint(), r);
  EXPECT_FALSE(tiny.accepted()) << "a worker claimed 2^24 blocks of 1 byte";
  EXPECT_EQ(tiny.reason(), v1::REFUSAL_REASON_KV_POOL);
}

// #23: the KV code scheme is part of the registration. A worker whose scheme this scheduler does
// not know (a newer build's), or whose width the scheme does not take, is refused, typed as a
// KV format refusal and named; a rotated 4-bit worker is accepted.
TEST(Registration, AKvSchemeTheSchedulerDoesNotKnowIsRefused) {
  Deployment d({"--workers", "1", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  v1::Register r = decode_worker("ipc://" + d.dir() + "/kv.sock");
  r.set_role(v1::WORKER_ROLE_BOTH);
  r.set_kv_quant_scheme(static_cast<v1::KvQuantScheme>(7));
  r.set_kv_bits(4);
  const v1::RegisterReply unknown = register_as(d.worker_endpoint(), r);
  EXPECT_FALSE(unknown.accepted());
  EXPECT_EQ(unknown.reason(), v1::REFUSAL_REASON_KV_FORMAT);
  EXPECT_NE(unknown.error_message().find("KV quantization scheme 7 is not one this scheduler knows"), std::string::npos)
      << unknown.error_message();
  r.set_kv_quant_scheme(v1::KV_QUANT_SCHEME_ROTATED);
  r.set_kv_bits(8);
  const v1::RegisterReply wide = register_as(d.worker_endpoint(), r);
  EXPECT_FALSE(wide.accepted());
  EXPECT_EQ(wide.reason(), v1::REFUSAL_REASON_KV_FORMAT);
  EXPECT_NE(wide.error_message().find("the rotated scheme takes 4 or 3"), std::string::npos) << wide.error_message();
  r.set_kv_bits(4);
  r.set_kv_rotation_seed(1);
  EXPECT_TRUE(register_as(d.worker_endpoint(), r).accepted());
}

// #23 rings across a handoff: prefill and decode workers hand KV over as raw blocks, so they must
// agree on rings too. A decode worker registering with rings beside a prefill and a decode worker
// without is refused as a KV format, the refusal naming the rings and the other worker's format;
// the same worker without rings is accepted.
TEST(Registration, PrefillAndDecodeWorkersMustAgreeOnRings) {
  Deployment d({"--prefill", "1", "--decode", "1", "--threads", "1"});
  ASSERT_TRUE(d.ok());
  auto file = model::GgufFile::open(model_file("tiny", 1));
  v1::Register r = decode_worker("ipc://" + d.dir() + "/kv.sock");
  r.set_block_bytes(engine::KvPool::bytes_per_block(model::read_model_config(**file).value()));
  r.set_kv_ring_blocks(16);
  r.set_kv_ring_block_bytes(4096);
  r.set_kv_ring_window(32);
  const v1::RegisterReply ringed = register_as(d.worker_endpoint(), r);
  EXPECT_FALSE(ringed.accepted());
  EXPECT_EQ(ringed.reason(), v1::REFUSAL_REASON_KV_FORMAT);
  EXPECT_NE(ringed.error_message().find("windowed layers in rings of window 32 (--kv-rings)"), std::string::npos)
      << ringed.error_message();
  EXPECT_NE(ringed.error_message().find("differs from registered worker"), std::string::npos) << ringed.error_message();
  r.set_kv_ring_blocks(0);
  r.set_kv_ring_block_bytes(0);
  r.set_kv_ring_window(0);
  const v1::RegisterReply plain = register_as(d.worker_endpoint(), r);
  EXPECT_TRUE(plain.accepted()) << plain.error_message();
}

}  // namespace
}  // namespace tandem::test
