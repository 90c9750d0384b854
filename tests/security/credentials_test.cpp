// #18 items 1, 3, 7 and 11: credentials. Every client held server.pub and so could connect to the
// worker endpoint and register as a worker; a decode worker took KV from any CURVE key. Now a ZAP
// handler checks each peer's key against the scheduler's allow-lists (--worker-keys,
// --client-keys, re-read on SIGHUP), a client key's priority range is enforced, and a decode
// worker takes a transfer only from the prefill worker the scheduler named in KvExpect.
// Real processes over tcp:// on loopback with CurveZMQ.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "model/gguf.h"
#include "model/model_config.h"
#include "runtime/wire.h"
#include "tandem/client.h"
#include "tandem/v1/worker.pb.h"
#include "tests/e2e/deployment.h"

namespace tandem::test {
namespace {

using namespace std::chrono_literals;

std::string first_word(const std::string& path) {
  std::string w;
  std::ifstream(path) >> w;
  return w;
}

struct KeyPair {
  std::string pub, secret;
};

// A folder of keys: the server's and, by name, workers' and clients' (tandem keys --name).
class Keys {
 public:
  Keys() : dir_(temp_dir() + "/keys") {
    EXPECT_EQ(wait_for(spawn({TANDEM_TANDEM_BIN, "keys", "--out", dir_}, dir_ + ".out"), 30s), 0);
  }
  // Makes NAME's key pair; its allow-list line is what `tandem keys` printed.
  std::string make(const std::string& name) {
    const std::string out = temp_dir() + "/" + name + ".line";
    EXPECT_EQ(wait_for(spawn({TANDEM_TANDEM_BIN, "keys", "--out", dir_, "--name", name}, out), 30s), 0)
        << slurp(out + ".err");
    std::string line = slurp(out);
    while (!line.empty() && line.back() == '\n') line.pop_back();
    return line;
  }
  KeyPair pair(const std::string& name) const {
    return {first_word(path(name) + ".pub"), first_word(path(name) + ".key")};
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  const std::string& dir() const { return dir_; }
  std::string server_pub() const { return first_word(dir_ + "/server.pub"); }

 private:
  std::string dir_;
};

// `tandem scheduler` on tcp:// with CurveZMQ and allow-lists, stopped when the test ends.
class Scheduler {
 public:
  // `extra` flags come last (a flag given again takes its last value).
  Scheduler(const Keys& keys, const std::string& worker_list, const std::string& client_list = "",
            const std::vector<std::string>& extra = {})
      : client_("tcp://127.0.0.1:" + std::to_string(free_port())),
        worker_("tcp://127.0.0.1:" + std::to_string(free_port())),
        log_(temp_dir() + "/scheduler.out") {
    std::vector<std::string> argv = {TANDEM_TANDEM_BIN,   "scheduler",    "--model",           model_file("tiny", 1),
                                     "--client-endpoint", client_,        "--worker-endpoint", worker_,
                                     "--curve-keys",      keys.dir(),     "--worker-keys",     worker_list,
                                     "--heartbeat-ms",    kQuickHeartbeat};
    if (!client_list.empty()) argv.insert(argv.end(), {"--client-keys", client_list});
    argv.insert(argv.end(), extra.begin(), extra.end());
    pid_ = spawn(argv, log_);
  }
  ~Scheduler() {
    signal_one(pid_, SIGQUIT);
    wait_for(pid_, 10s);
  }
  pid_t pid() const { return pid_; }
  const std::string& client_endpoint() const { return client_; }
  const std::string& worker_endpoint() const { return worker_; }
  std::string log() const { return slurp(log_) + slurp(log_ + ".err"); }

 private:
  std::string client_, worker_, log_;
  pid_t pid_;
};

// A `tandem worker` process with its own key (or none), stopped when the test ends.
class Worker {
 public:
  Worker(const Scheduler& s, const Keys& keys, const std::string& key_name) : out_(temp_dir() + "/" + key_name) {
    std::vector<std::string> argv = {TANDEM_TANDEM_BIN, "worker",
                                     "--model",         model_file("tiny", 1),
                                     "--scheduler",     s.worker_endpoint(),
                                     "--threads",       "1",
                                     "--curve-keys",    keys.dir(),
                                     "--name",          key_name};
    if (!key_name.empty()) argv.insert(argv.end(), {"--worker-key", keys.path(key_name) + ".key"});
    pid_ = spawn(argv, out_ + ".worker.out");
  }
  ~Worker() {
    if (pid_ <= 0) return;
    signal_one(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }
  // Its exit code once it exits within `limit`; -1 if it is still running (then killed).
  int exit_code(std::chrono::milliseconds limit) {
    const int code = wait_for(pid_, limit);
    pid_ = -1;
    return code;
  }

 private:
  std::string out_;
  pid_t pid_;
};

std::unique_ptr<Client> client_of(const Scheduler& s, const Keys& keys, const KeyPair& own = {}) {
  ClientOptions o;
  o.endpoint = s.client_endpoint();
  o.curve_server_key = keys.server_pub();
  o.curve_public_key = own.pub;
  o.curve_secret_key = own.secret;
  o.liveness_timeout = 1000ms;
  auto c = Client::connect(o);
  EXPECT_TRUE(c) << c.status().to_string();
  return c ? std::move(c.value()) : nullptr;
}

// The pids of the registered workers, once `want` of them are (or after `limit`).
std::vector<uint32_t> registered(Client& c, size_t want, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<uint32_t> pids;
  do {
    pids.clear();
    if (auto st = c.status(1s))
      for (const WorkerInfo& w : st->workers) pids.push_back(w.pid);
    if (pids.size() == want) return pids;
    std::this_thread::sleep_for(100ms);
  } while (std::chrono::steady_clock::now() < deadline);
  return pids;
}

GenerateRequest request(int32_t priority, const std::string& principal = "") {
  GenerateRequest r;
  r.prompt_tokens = {5, 6, 7};
  r.max_tokens = 4;
  r.priority = priority;
  r.principal = principal;
  return r;
}

FinalEvent finish(Stream& s) {
  Event ev;
  for (int i = 0; i < 64 && s.next(ev) && !ev.final; ++i) {
  }
  return ev.fin;
}

FinalEvent generate(Client& c, int32_t priority = 0, const std::string& principal = "") {
  return finish(*c.generate(request(priority, principal)));
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(Credentials, AClientKeyCannotRegisterAsAWorkerAndTheClientEndpointStillServes) {
  Keys keys;
  const std::string w1 = keys.make("w1");
  keys.make("client1");
  const std::string list = temp_dir() + "/workers.allow";
  write_file(list, "# the workers\n" + w1 + "\n");
  Scheduler s(keys, list);
  Worker listed(s, keys, "w1");
  auto client = client_of(s, keys);
  ASSERT_EQ(registered(*client, 1, 30s).size(), 1u) << s.log();

  // A peer with the client's key pair and the right model fingerprint tries to register.
  auto file = model::GgufFile::open(model_file("tiny", 1));
  ASSERT_TRUE(file);
  const std::string fingerprint = model::model_fingerprint(**file, model::read_model_config(**file).value());
  const KeyPair own = keys.pair("client1");
  zmq::context_t ctx;
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvtimeo, 3000);
  dealer.set(zmq::sockopt::curve_serverkey, keys.server_pub());
  dealer.set(zmq::sockopt::curve_publickey, own.pub);
  dealer.set(zmq::sockopt::curve_secretkey, own.secret);
  dealer.connect(s.worker_endpoint());
  v1::WorkerMessage reg;
  reg.set_version(v1::PROTOCOL_VERSION_CURRENT);
  v1::Register* r = reg.mutable_register_();
  r->set_role(v1::WORKER_ROLE_BOTH);
  r->set_model_fingerprint(fingerprint);
  r->set_kv_blocks(64);
  r->set_block_tokens(16);
  r->set_block_bytes(4096);
  r->set_name("impostor");
  ASSERT_TRUE(dealer.send(runtime::to_frame(reg), zmq::send_flags::none));
  zmq::message_t frame;
  const bool answered = dealer.recv(frame).has_value();
  EXPECT_FALSE(answered) << "the scheduler answered a worker holding a client's key";
  if (answered) {
    v1::SchedulerCommand c;
    ASSERT_TRUE(runtime::parse_frame(frame, c).is_ok());
    EXPECT_FALSE(c.register_reply().accepted()) << "a client's key registered as a worker";
  }
  EXPECT_EQ(registered(*client, 1, 1s).size(), 1u);
  EXPECT_EQ(generate(*client).reason, FinishReason::kLength);
  const std::string log = s.log();
  EXPECT_NE(log.find("not on the allow-list"), std::string::npos) << log;
  EXPECT_EQ(log.find(w1.substr(0, 40)), std::string::npos) << "the log gives a listed key: " << log;
}

TEST(Credentials, AListedWorkerServesAnAddedKeyRegistersOnSighupAndARemovedOneIsFenced) {
  Keys keys;
  const std::string w1 = keys.make("w1"), w2 = keys.make("w2");
  const std::string list = temp_dir() + "/workers.allow";
  write_file(list, w1 + "\n");
  Scheduler s(keys, list);
  Worker first(s, keys, "w1");
  Worker second(s, keys, "w2");
  auto client = client_of(s, keys);
  const std::vector<uint32_t> one = registered(*client, 1, 30s);
  ASSERT_EQ(one.size(), 1u) << s.log();
  EXPECT_EQ(one[0], static_cast<uint32_t>(first.pid()));
  EXPECT_EQ(generate(*client).reason, FinishReason::kLength);
  std::this_thread::sleep_for(2s);  // w2 has been trying all along
  EXPECT_EQ(registered(*client, 1, 1s).size(), 1u) << "an unlisted worker registered";

  // A file that does not parse keeps the list in force.
  write_file(list, w1 + "\nnot-a-key w3\n");
  ASSERT_EQ(signal_one(s.pid(), SIGHUP), 0);
  std::this_thread::sleep_for(500ms);
  EXPECT_NE(s.log().find("the allow-lists in force stay"), std::string::npos) << s.log();
  EXPECT_EQ(registered(*client, 1, 1s).size(), 1u);

  write_file(list, w1 + "\n" + w2 + "\n");
  ASSERT_EQ(signal_one(s.pid(), SIGHUP), 0);
  EXPECT_EQ(registered(*client, 2, 30s).size(), 2u) << "the added key did not register after SIGHUP:\n" << s.log();
  EXPECT_NE(s.log().find("2 worker keys"), std::string::npos) << s.log();

  write_file(list, w2 + "\n");
  ASSERT_EQ(signal_one(s.pid(), SIGHUP), 0);
  const std::vector<uint32_t> after = registered(*client, 1, 10s);
  ASSERT_EQ(after.size(), 1u) << s.log();
  EXPECT_EQ(after[0], static_cast<uint32_t>(second.pid())) << "the removed key's worker was not fenced";
  EXPECT_NE(first.exit_code(10s), 0) << "the fenced worker was let back in";
  EXPECT_EQ(generate(*client).reason, FinishReason::kLength);
}

TEST(Credentials, APriorityOutsideTheClientKeysRangeIsRefusedAndAnUnlistedClientCannotConnect) {
  Keys keys;
  const std::string w1 = keys.make("w1"), c1 = keys.make("c1");
  keys.make("stranger");
  const std::string workers = temp_dir() + "/workers.allow", clients = temp_dir() + "/clients.allow";
  write_file(workers, w1 + "\n");
  write_file(clients, c1 + " priority=0..5\n");
  Scheduler s(keys, workers, clients);
  Worker w(s, keys, "w1");
  auto client = client_of(s, keys, keys.pair("c1"));
  ASSERT_EQ(registered(*client, 1, 30s).size(), 1u) << s.log();
  EXPECT_EQ(generate(*client, 5).reason, FinishReason::kLength);
  const FinalEvent high = generate(*client, 9);
  EXPECT_EQ(high.reason, FinishReason::kError);
  EXPECT_EQ(high.code, Code::kInvalidArgument);
  EXPECT_NE(high.error_message.find("0..5"), std::string::npos) << high.error_message;
  EXPECT_EQ(generate(*client, -1).code, Code::kInvalidArgument);

  auto stranger = client_of(s, keys, keys.pair("stranger"));
  EXPECT_FALSE(stranger->status(1s)) << "a client whose key is not listed was answered";
  auto anonymous = client_of(s, keys);
  EXPECT_FALSE(anonymous->status(1s)) << "a client without a key of its own was answered";
}

// Issue #17: a gateway is one client to the scheduler, so a key listed with `proxy` names, per
// request, whom it sends it for (Submit.principal). max_client_requests counts per principal
// (the proxy's own requests count as its own), a principal's `principal NAME priority=LO..HI`
// line narrows the proxy key's range, and a key without `proxy` may not name one. The worker is
// stopped (SIGSTOP) while requests are submitted, so that admitted ones stay live; a long
// heartbeat keeps the scheduler from declaring it dead meanwhile.
TEST(Credentials, AProxyKeysPrincipalsHaveEachTheClientLimitAndTheirOwnPriorityRange) {
  Keys keys;
  const std::string w1 = keys.make("w1"), gw = keys.make("gw"), c1 = keys.make("c1");
  const std::string workers = temp_dir() + "/workers.allow", clients = temp_dir() + "/clients.allow";
  write_file(workers, w1 + "\n");
  write_file(clients, gw + " proxy priority=0..5\n" + c1 + "\nprincipal slow priority=0..1  # batch jobs\n");
  Scheduler s(keys, workers, clients, {"--max-client-requests", "2", "--heartbeat-ms", "4000"});
  Worker w(s, keys, "w1");
  auto proxy = client_of(s, keys, keys.pair("gw"));
  auto plain = client_of(s, keys, keys.pair("c1"));
  ASSERT_EQ(registered(*proxy, 1, 30s).size(), 1u) << s.log();
  EXPECT_EQ(generate(*proxy, 0, "alice").reason, FinishReason::kLength);

  ASSERT_EQ(signal_one(w.pid(), SIGSTOP), 0);
  std::vector<std::shared_ptr<Stream>> live;
  for (const char* principal : {"alice", "alice", "", ""}) live.push_back(proxy->generate(request(0, principal)));
  // Each refusal: its code, and what its message says.
  auto expect_refused = [](const FinalEvent& f, Code code, const std::string& says, const char* why = "") {
    EXPECT_EQ(f.code, code) << why << ": " << f.error_message;
    EXPECT_NE(f.error_message.find(says), std::string::npos) << f.error_message;
  };
  expect_refused(generate(*proxy, 0, "alice"), Code::kOverloaded, "principal 'alice' has 2 live requests");
  expect_refused(generate(*proxy), Code::kOverloaded, "this client has 2 live requests",
                 "the proxy's own requests count as its own");
  live.push_back(proxy->generate(request(0, "bob")));  // another principal through the same connection
  live.push_back(proxy->generate(request(1, "slow")));
  expect_refused(generate(*proxy, 2, "slow"), Code::kInvalidArgument,
                 "outside the range principal 'slow' allows: 0..1");
  expect_refused(generate(*proxy, 9, "bob"), Code::kInvalidArgument, "this client's key allows: 0..5");
  expect_refused(generate(*plain, 0, "alice"), Code::kPermissionDenied,
                 "only a proxy may send requests for a principal");
  expect_refused(generate(*proxy, 0, "tab\there"), Code::kInvalidArgument,
                 "principal: byte 9 at position 3 is not printable ASCII");
  for (auto& stream : live)
    EXPECT_FALSE(stream->next_for(0ms).has_value()) << "an admitted request ended while it was live";

  ASSERT_EQ(signal_one(w.pid(), SIGCONT), 0);
  for (auto& stream : live) EXPECT_EQ(finish(*stream).reason, FinishReason::kLength) << s.log();
  EXPECT_EQ(generate(*proxy, 0, "alice").reason, FinishReason::kLength) << "the limit is per live request";

  // SIGHUP re-reads `proxy` and the principal lines with the keys.
  write_file(clients, gw + " priority=0..5\n" + c1 + "\n");
  ASSERT_EQ(signal_one(s.pid(), SIGHUP), 0);
  for (int i = 0; i < 100 && s.log().find("2 client keys, 0 principal ranges") == std::string::npos; ++i)
    std::this_thread::sleep_for(50ms);
  expect_refused(generate(*proxy, 0, "alice"), Code::kPermissionDenied, "only a proxy may send");
  EXPECT_EQ(generate(*proxy, 2).reason, FinishReason::kLength);
}

// The test plays the scheduler for one decode worker: it announces a transfer whose sender is
// `real`, then pushes it from another key (dropped) and from `real` (taken).
TEST(Credentials, ADecodeWorkerTakesKvOnlyFromTheSenderTheSchedulerNamed) {
  Keys keys;
  keys.make("real");
  keys.make("forger");
  zmq::context_t ctx;
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::curve_server, true);
  router.set(zmq::sockopt::curve_secretkey, first_word(keys.dir() + "/server.key"));
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(free_port());
  router.bind(endpoint);
  const std::string dir = temp_dir();
  const pid_t worker =
      spawn({TANDEM_TANDEM_BIN, "worker", "--model", model_file("tiny", 1), "--scheduler", endpoint, "--threads", "1",
             "--role", "decode", "--curve-keys", keys.dir(), "--kv-memory", "16777216"},
            dir + "/decode.out");
  struct Reap {  // the worker dies with the test, whichever assertion ends it
    pid_t pid;
    ~Reap() {
      signal_one(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } reap{worker};
  // Reads worker messages for up to `limit`, skipping heartbeats; the first other one.
  auto next = [&](std::chrono::milliseconds limit) -> std::optional<v1::WorkerMessage> {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, 100ms) <= 0) continue;
      std::vector<zmq::message_t> frames;
      (void)zmq::recv_multipart(router, std::back_inserter(frames));
      v1::WorkerMessage m;
      if (frames.size() == 2 && runtime::parse_frame(frames[1], m).is_ok() && !m.has_heartbeat()) return m;
    }
    return std::nullopt;
  };
  std::string identity;
  v1::Register reg;
  {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (identity.empty() && std::chrono::steady_clock::now() < deadline) {
      zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, 100ms) <= 0) continue;
      std::vector<zmq::message_t> frames;
      (void)zmq::recv_multipart(router, std::back_inserter(frames));
      v1::WorkerMessage m;
      if (frames.size() == 2 && runtime::parse_frame(frames[1], m).is_ok() && m.has_register_()) {
        identity = frames[0].to_string();
        reg = m.register_();
      }
    }
  }
  ASSERT_FALSE(identity.empty()) << slurp(dir + "/decode.out.err");
  ASSERT_EQ(reg.kv_public_key().size(), 40u);
  auto send = [&](const v1::SchedulerCommand& c) {
    std::vector<zmq::message_t> frames;
    frames.emplace_back(identity.data(), identity.size());
    frames.push_back(runtime::to_frame(c));
    ASSERT_TRUE(zmq::send_multipart(router, frames));
  };
  v1::SchedulerCommand accept;
  accept.set_version(v1::PROTOCOL_VERSION_CURRENT);
  accept.mutable_register_reply()->set_accepted(true);
  accept.mutable_register_reply()->set_worker_id(1);
  accept.mutable_register_reply()->set_epoch(1);
  send(accept);
  const KeyPair real = keys.pair("real"), forger = keys.pair("forger");
  v1::SchedulerCommand expect;
  expect.set_version(v1::PROTOCOL_VERSION_CURRENT);
  v1::KvExpect* e = expect.mutable_kv_expect();
  e->set_transfer_id(1);
  e->set_seq_id(7);
  e->set_nonce(0x5eed);
  e->set_positions(0);
  e->set_sender_public_key(real.pub);
  e->set_epoch(1);
  send(expect);
  std::this_thread::sleep_for(300ms);

  auto push_from = [&](const KeyPair& own) {
    zmq::socket_t push(ctx, zmq::socket_type::push);
    push.set(zmq::sockopt::linger, 2000);
    push.set(zmq::sockopt::curve_serverkey, reg.kv_public_key());
    push.set(zmq::sockopt::curve_publickey, own.pub);
    push.set(zmq::sockopt::curve_secretkey, own.secret);
    push.connect(reg.kv_endpoint());
    v1::KvTransfer t;  // everything the announcement says: only the sender differs
    t.set_version(v1::PROTOCOL_VERSION_CURRENT);
    t.set_transfer_id(1);
    t.set_nonce(0x5eed);
    t.set_dest_seq_id(7);
    t.set_positions(0);
    ASSERT_TRUE(push.send(runtime::to_frame(t), zmq::send_flags::none));
  };
  push_from(forger);
  const auto forged = next(3s);
  EXPECT_FALSE(forged && forged->has_kv_received()) << "the decode worker took KV from a key the scheduler never named";
  push_from(real);
  const auto taken = next(10s);
  ASSERT_TRUE(taken && taken->has_kv_received()) << "the named sender's transfer was not taken";
  EXPECT_EQ(taken->kv_received().transfer_id(), 1u);
}

// `tandem up --curve-keys DIR` works out of the box (it makes DIR/worker.key and lists it in
// DIR/workers.allow for its workers), and passes SIGHUP on to the scheduler instead of dying of it.
TEST(Credentials, TandemUpMakesItsWorkersKeyAndPassesSighupOn) {
  Keys keys;
  Deployment d({"--workers", "1", "--threads", "1", "--curve-keys", keys.dir()});
  ASSERT_TRUE(d.ok());
  const std::string pub = first_word(keys.dir() + "/worker.pub");
  ASSERT_EQ(pub.size(), 40u) << "tandem up made no worker key";
  EXPECT_NE(slurp(keys.dir() + "/workers.allow").find(pub + " worker"), std::string::npos);
  ASSERT_EQ(signal_one(d.pid(), SIGHUP), 0);
  std::this_thread::sleep_for(500ms);
  EXPECT_NE(d.output().find("SIGHUP: the scheduler re-reads its allow-lists"), std::string::npos) << d.output();
  ClientOptions o;
  o.endpoint = d.endpoint();
  o.curve_server_key = keys.server_pub();
  auto client = Client::connect(o);
  ASSERT_TRUE(client);
  EXPECT_EQ(registered(**client, 1, 5s).size(), 1u) << "the deployment did not survive SIGHUP";
}

}  // namespace
}  // namespace tandem::test
