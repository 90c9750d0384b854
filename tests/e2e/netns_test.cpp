// Many hosts, simulated: the scheduler and two workers in three network namespaces joined
// by veth pairs, over tcp:// with CurveZMQ, must serve 64 greedy streams exactly as the
// engine alone. Needs root (ip netns); skipped with a message where that is not permitted.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tandem/client.h"
#include "tests/e2e/deployment.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

// Three namespaces: <prefix>-s (scheduler, 10.77.1.1 and 10.77.2.1), <prefix>-a (worker,
// 10.77.1.2) and <prefix>-b (worker, 10.77.2.2); deleted (with their veths) on destruction.
class Hosts {
 public:
  Hosts() : prefix_("tandem-" + std::to_string(getpid())) {
    if (getuid() != 0) return;
    remove_stale();
    if (sh("ip netns add " + ns("s")) != 0) return;
    created_ = {"s"};
    ok_ = sh("ip netns add " + ns("a")) == 0 && (created_.push_back("a"), true) && sh("ip netns add " + ns("b")) == 0 &&
          (created_.push_back("b"), true) && link("a", "1") && link("b", "2") &&
          sh("ip -n " + ns("s") + " link set lo up") == 0;
  }
  ~Hosts() {
    for (const std::string& n : created_) sh("ip netns del " + ns(n));
  }
  bool ok() const { return ok_; }
  std::string ns(const std::string& n) const { return prefix_ + "-" + n; }
  // argv run inside host n's namespace.
  std::vector<std::string> in(const std::string& n, std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {"/usr/sbin/ip", "netns", "exec", ns(n)});
    return argv;
  }
  // Hosts a and b reach each other through s (a router): for KV sent between two workers.
  bool route() const {
    return sh("ip netns exec " + ns("s") + " sysctl -w net.ipv4.ip_forward=1") == 0 &&
           sh("ip -n " + ns("a") + " route add 10.77.2.0/24 via 10.77.1.1") == 0 &&
           sh("ip -n " + ns("b") + " route add 10.77.1.0/24 via 10.77.2.1") == 0;
  }

 private:
  // Namespaces of an earlier run that was killed before its destructor ran (its pid is gone).
  static void remove_stale() {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/var/run/netns", ec)) {
      const std::string name = e.path().filename().string();
      int pid = 0;
      char role = 0;
      if (std::sscanf(name.c_str(), "tandem-%d-%c", &pid, &role) == 2 && pid > 0 && test::signal_one(pid, 0) != 0 &&
          errno == ESRCH)
        sh("ip netns del " + name);
    }
  }
  // A veth pair scheduler <-> worker `w` on 10.77.<net>.0/24.
  bool link(const std::string& w, const std::string& net) {
    const std::string s = ns("s"), o = ns(w);
    return sh("ip link add v" + w + " netns " + s + " type veth peer name v0 netns " + o) == 0 &&
           sh("ip -n " + s + " addr add 10.77." + net + ".1/24 dev v" + w) == 0 &&
           sh("ip -n " + o + " addr add 10.77." + net + ".2/24 dev v0") == 0 &&
           sh("ip -n " + s + " link set v" + w + " up") == 0 && sh("ip -n " + o + " link set v0 up") == 0 &&
           sh("ip -n " + o + " link set lo up") == 0;
  }
  std::string prefix_;
  std::vector<std::string> created_;
  bool ok_ = false;
};

// From a thread inside network namespace `ns` (threads and the ZeroMQ I/O threads they start
// inherit it): waits for `workers_wanted` workers, then serves `n` greedy streams of varied prompts
// through tcp://127.0.0.1:5555 with CurveZMQ, each exactly as the engine alone computes it.
void serve_from(const std::string& ns, const std::string& pub, const std::string& model, const std::string& dir,
                uint32_t n, size_t workers_wanted, StatusInfo* status = nullptr) {
  std::thread client_host([&] {
    const int fd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(setns(fd, CLONE_NEWNET), 0);
    close(fd);
    ClientOptions o;
    o.endpoint = "tcp://127.0.0.1:5555";
    o.curve_server_key = pub;
    auto client = Client::connect(o).value();
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    size_t workers = 0;
    while (workers < workers_wanted && std::chrono::steady_clock::now() < deadline) {
      auto st = client->status(1s);
      workers = st ? st->workers.size() : 0;
      if (workers < workers_wanted) std::this_thread::sleep_for(100ms);
    }
    ASSERT_EQ(workers, workers_wanted) << "the workers in the other namespaces did not register: "
                                       << test::slurp(dir + "/worker-a.out.err")
                                       << test::slurp(dir + "/worker-b.out.err");

    auto engine = engine::Engine::load(model, {1, engine::GemmBackend::kPacked}).value();
    std::vector<std::shared_ptr<Stream>> streams;
    std::vector<std::vector<int32_t>> want;
    for (uint32_t i = 0; i < n; ++i) {
      GenerateRequest r;
      for (uint32_t k = 0; k < 1 + (i * 13) % 150; ++k)
        r.prompt_tokens.push_back(3 + static_cast<int32_t>((k * 31 + i * 17) % 500));
      r.max_tokens = 8 + i % 24;
      r.ignore_eos = true;
      engine::GenerateOptions opt;
      opt.max_tokens = r.max_tokens;
      opt.ignore_eos = true;
      want.push_back(engine::generate(*engine, r.prompt_tokens, opt).value().tokens);
      streams.push_back(client->generate(r));
    }
    for (uint32_t i = 0; i < n; ++i) {
      std::vector<int32_t> got;
      std::optional<Event> ev;
      for (int k = 0; k < 600 && !(ev && ev->final); ++k)
        if ((ev = streams[i]->next_for(100ms)) && !ev->final) got.push_back(ev->token.id);
      ASSERT_TRUE(ev && ev->final) << "stream " << i << " hung";
      EXPECT_EQ(ev->fin.reason, FinishReason::kLength) << ev->fin.error_message;
      EXPECT_EQ(got, want[i]) << "stream " << i;
    }
    const StatusInfo after = client->status(5s).value();
    for (const WorkerInfo& w : after.workers) EXPECT_GT(w.steps, 0u) << "both hosts take sequences";
    if (status) *status = after;
  });
  client_host.join();
}

TEST(ManyHosts, SixtyFourStreamsAcrossThreeNetworkNamespacesWithCurve) {
  Hosts hosts;
  if (!hosts.ok()) GTEST_SKIP() << "needs root and `ip netns` (network namespaces + veth), not permitted here";
  const std::string dir = test::temp_dir(), keys = dir + "/keys", model = test::model_file("tiny", 1);
  ASSERT_EQ(test::wait_for(test::spawn({TANDEM_TANDEM_BIN, "keys", "--out", keys}, dir + "/keys.out"), 30s), 0);
  std::string pub;
  std::ifstream(keys + "/server.pub") >> pub;

  std::vector<pid_t> procs;
  procs.push_back(test::spawn(
      hosts.in("s", {TANDEM_TANDEM_BIN, "scheduler", "--model", model, "--client-endpoint", "tcp://127.0.0.1:5555",
                     "--worker-endpoint", "tcp://*:5556", "--curve-keys", keys, "--log-level", "warn"}),
      dir + "/scheduler.out"));
  for (auto [n, addr] : {std::pair{"a", "10.77.1.1"}, {"b", "10.77.2.1"}})
    procs.push_back(test::spawn(hosts.in(n, {TANDEM_TANDEM_BIN, "worker", "--model", model, "--scheduler",
                                             std::string("tcp://") + addr + ":5556", "--threads", "1", "--kv-memory",
                                             "67108864", "--curve-keys", keys, "--log-level", "warn"}),
                                dir + "/worker-" + n + ".out"));

  serve_from(hosts.ns("s"), pub, model, dir, 64, 2);
  for (pid_t p : procs) test::signal_one(p, SIGTERM);
  for (pid_t p : procs) test::wait_for(p, 10s);
}

// #18 item 4 across hosts: a prefill worker on host a hands KV over tcp:// with CurveZMQ to a
// decode worker on host b, each with its own worker key on the scheduler's allow-list; the
// decode worker's kv_endpoint is its own address (as the scheduler sees it), and it takes KV
// only from the prefill worker the scheduler names.
TEST(ManyHosts, PrefillAndDecodeWorkersOnTwoHostsHandKvOverWithWorkerKeys) {
  Hosts hosts;
  if (!hosts.ok()) GTEST_SKIP() << "needs root and `ip netns` (network namespaces + veth), not permitted here";
  ASSERT_TRUE(hosts.route());
  const std::string dir = test::temp_dir(), keys = dir + "/keys", model = test::model_file("tiny", 1);
  ASSERT_EQ(test::wait_for(test::spawn({TANDEM_TANDEM_BIN, "keys", "--out", keys}, dir + "/keys.out"), 30s), 0);
  for (const char* name : {"wa", "wb"}) {
    ASSERT_EQ(test::wait_for(test::spawn({TANDEM_TANDEM_BIN, "keys", "--out", keys, "--name", name},
                                         dir + "/keys-" + name + ".out"),
                             30s),
              0);
    std::ofstream(keys + "/workers.allow", std::ios::app) << test::slurp(dir + "/keys-" + name + ".out");
  }
  std::string pub;
  std::ifstream(keys + "/server.pub") >> pub;
  std::vector<pid_t> procs;
  procs.push_back(
      test::spawn(hosts.in("s", {TANDEM_TANDEM_BIN, "scheduler", "--model", model, "--client-endpoint",
                                 "tcp://127.0.0.1:5555", "--worker-endpoint", "tcp://*:5556", "--curve-keys", keys,
                                 "--worker-keys", keys + "/workers.allow", "--handoff-timeout-ms", "20000"}),
                  dir + "/scheduler.out"));
  const std::vector<std::string> common = {"--model",     model,      "--threads",    "1",
                                           "--kv-memory", "67108864", "--curve-keys", keys};
  std::vector<std::string> a = {TANDEM_TANDEM_BIN, "worker",  "--scheduler",  "tcp://10.77.1.1:5556",
                                "--role",          "prefill", "--worker-key", keys + "/wa.key"};
  std::vector<std::string> b = {
      TANDEM_TANDEM_BIN, "worker",       "--scheduler",    "tcp://10.77.2.1:5556", "--role",
      "decode",          "--worker-key", keys + "/wb.key", "--kv-endpoint",        "tcp://10.77.2.2:5600"};
  a.insert(a.end(), common.begin(), common.end());
  b.insert(b.end(), common.begin(), common.end());
  procs.push_back(test::spawn(hosts.in("a", a), dir + "/worker-a.out"));
  procs.push_back(test::spawn(hosts.in("b", b), dir + "/worker-b.out"));

  StatusInfo status;
  serve_from(hosts.ns("s"), pub, model, dir, 16, 2, &status);
  EXPECT_GE(status.handoffs, 16u) << "every stream's KV went from host a to host b";
  EXPECT_GT(status.handoff_bytes, 0u);
  EXPECT_EQ(status.handoff_failures, 0u);
  const std::string logs = test::slurp(dir + "/scheduler.out.err") + test::slurp(dir + "/worker-a.out.err") +
                           test::slurp(dir + "/worker-b.out.err");
  EXPECT_EQ(logs.find("dropped a KV transfer"), std::string::npos) << logs;
  EXPECT_EQ(logs.find("refused"), std::string::npos) << logs;
  for (pid_t p : procs) test::signal_one(p, SIGTERM);
  for (pid_t p : procs) test::wait_for(p, 10s);
}

}  // namespace
}  // namespace tandem
