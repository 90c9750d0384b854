#include "cli/supervisor.h"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "cli/flags.h"
#include "cli/spawn.h"
#include "runtime/security.h"
#include "tandem/client.h"

namespace tandem::cli {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

volatile sig_atomic_t g_signals = 0;  // SIGTERM/SIGINT deliveries
volatile sig_atomic_t g_last_signal = 0;
volatile sig_atomic_t g_hangups = 0;  // SIGHUP deliveries: passed on to the scheduler
void on_signal(int sig) {
  if (sig == SIGHUP) {
    g_hangups = g_hangups + 1;
    return;
  }
  g_last_signal = sig;
  g_signals = g_signals + 1;
}

__attribute__((format(printf, 1, 2))) void say(const char* fmt, ...);
void say(const char* fmt, ...) {
  std::printf("tandem: ");
  va_list args;
  va_start(args, fmt);
  std::vprintf(fmt, args);
  va_end(args);
  std::printf("\n");
  std::fflush(stdout);
}

std::string describe(int status) {
  if (WIFSIGNALED(status))
    return "signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "status " + std::to_string(WEXITSTATUS(status));
}

pid_t start(const ChildSpec& spec) { return spawn({spec.argv, spec.cpus, "", /*supervised=*/true}); }

struct Child {
  ChildSpec spec;
  pid_t pid = -1;
  Clock::time_point started;
  uint32_t crashes = 0;  // consecutive
  Clock::time_point restart_at;
  bool given_up = false;
  bool stopped = false;    // exited cleanly on request: not restarted
  bool registered = true;  // false after a restart until the scheduler lists its pid
};

std::string cpus_text(const std::vector<int>& cpus) {
  std::string s;
  for (int c : cpus) s += (s.empty() ? "" : ",") + std::to_string(c);
  return s;
}

// Adds `endpoints` to the scheduler's --kv-endpoint-allow (the configured list, if any, kept).
void allow_kv_endpoints(std::vector<std::string>& argv, const std::vector<std::string>& endpoints) {
  auto it = std::find(argv.begin(), argv.end(), "--kv-endpoint-allow");
  if (it == argv.end()) it = argv.insert(argv.end(), {"--kv-endpoint-allow", ""});
  std::string& list = *(it + 1);
  for (const std::string& e : endpoints) list += (list.empty() ? "" : ",") + e;
}

}  // namespace

std::vector<ChildSpec> plan_children(const DeployConfig& c, const Endpoints& ep, const std::string& exe) {
  auto log_flags = [&](std::vector<std::string>& argv, const std::string& name) {
    argv.insert(argv.end(), {"--log-level", c.log_level});
    if (!c.log_dir.empty()) argv.insert(argv.end(), {"--log-file", c.log_dir + "/" + name + ".log"});
    if (!c.curve_keys.empty()) argv.insert(argv.end(), {"--curve-keys", c.curve_keys});
  };
  std::vector<ChildSpec> out;
  ChildSpec s{"scheduler",
              {exe, "scheduler", "--model", c.model, "--client-endpoint", ep.client, "--worker-endpoint", ep.worker,
               "--admin-endpoint", ep.admin, "--drain-timeout-ms", std::to_string(c.supervision.drain_timeout_ms)},
              {}};
  log_flags(s.argv, s.name);
  // The settings, in the flag table's order: [scheduler] rows, then [[workers]] rows.
  for (const Flag& f : flag_table())
    if (f.section == Section::kScheduler)
      if (auto it = c.scheduler.find(std::string(f.name)); it != c.scheduler.end())
        s.argv.insert(s.argv.end(), {"--" + it->first, it->second});
  out.push_back(std::move(s));
  uint32_t index = 0, host_workers = 0;
  for (const WorkerGroup& g : c.workers) host_workers += g.count;
  std::vector<std::string> kv_sockets;  // the decode workers' KV sockets chosen here
  for (const WorkerGroup& g : c.workers) {
    for (uint32_t k = 0; k < g.count; ++k) {
      ChildSpec w{
          "worker-" + std::to_string(index++), {exe, "worker", "--model", c.model, "--scheduler", ep.worker}, {}};
      w.argv.insert(w.argv.end(), {"--name", w.name, "--threads", std::to_string(g.threads)});
      // All of them run on this host: with --kv-memory 0 they split its memory.
      w.argv.insert(w.argv.end(), {"--host-workers", std::to_string(host_workers)});
      // Role `both` is every worker's default: the flag is passed only for the others.
      if (g.role != "both") w.argv.insert(w.argv.end(), {"--role", g.role});
      // A decode worker receives KV from prefill workers: on one host, a socket in the
      // private runtime folder (across hosts, give kv_endpoint / --kv-endpoint yourself).
      if (g.role == "decode" && !g.flags.count("kv-endpoint")) {
        w.argv.insert(w.argv.end(), {"--kv-endpoint", "ipc://" + ep.runtime_dir + "/kv-" + w.name + ".sock"});
        kv_sockets.push_back(w.argv.back());
      }
      log_flags(w.argv, w.name);
      if (!c.worker_key.empty()) w.argv.insert(w.argv.end(), {"--worker-key", c.worker_key});
      for (const Flag& f : flag_table()) {
        if (f.section != Section::kWorkers) continue;
        auto it = g.flags.find(std::string(f.name));
        if (it == g.flags.end()) continue;
        w.argv.push_back("--" + it->first);
        if (f.type != FlagType::kSwitch) w.argv.push_back(it->second);
      }
      if (!g.cpus.empty()) w.cpus.assign(g.cpus.begin() + k * g.threads, g.cpus.begin() + (k + 1) * g.threads);
      out.push_back(std::move(w));
    }
  }
  // A worker on a tcp:// worker endpoint may name an ipc:// kv_endpoint only if the scheduler
  // allows it (scheduler/registration.h): these are tandem up's own.
  if (!kv_sockets.empty() && ep.worker.rfind("ipc://", 0) != 0) allow_kv_endpoints(out[0].argv, kv_sockets);
  out[0].worker = false;
  if (c.gateway.count("http")) {
    // A client of the scheduler like any other; restarted as a worker is when it exits.
    ChildSpec g{"gateway", {exe, "gateway", "--endpoint", ep.client, "--model", c.model}, {}, /*worker=*/false};
    log_flags(g.argv, g.name);
    for (const Flag& f : flag_table())
      if (f.section == Section::kGateway)
        if (auto it = c.gateway.find(std::string(f.name)); it != c.gateway.end())
          g.argv.insert(g.argv.end(), {it->first == "http" ? "--listen" : "--" + it->first, it->second});
    out.push_back(std::move(g));
  }
  return out;
}

namespace {

// The running deployment: its children and where the drain stands. One loop step reads
// signals, reaps exits, restarts crashed workers and follows readiness.
class Supervisor {
 public:
  Supervisor(const DeployConfig& config, const Endpoints& ep, std::vector<ChildSpec> specs,
             std::function<void()> on_hangup)
      : config_(config), sv_(config.supervision), ep_(ep), on_hangup_(std::move(on_hangup)) {
    for (ChildSpec& s : specs) {
      children_.emplace_back();
      children_.back().spec = std::move(s);
    }
  }

  int run() {
    say("endpoint %s", ep_.client.c_str());
    say("admin endpoint %s (tandem drain)", ep_.admin.c_str());
    for (Child& c : children_)
      if (!launch(c)) return stop_all(1);
    // Status queries go to the admin endpoint: the client endpoint may take listed keys only.
    ClientOptions co;
    co.endpoint = ep_.admin;
    if (!config_.curve_keys.empty())
      co.curve_server_key = runtime::load_curve_keys(config_.curve_keys, false)->server_public;
    auto client = Client::connect(co);
    if (!client) {
      say("cannot query the scheduler: %s", client.status().to_string().c_str());
      return stop_all(1);
    }
    client_ = std::move(client.value());
    ready_deadline_ = Clock::now() + milliseconds(sv_.ready_timeout_ms);
    for (;;) {
      if (auto code = on_signals()) return *code;
      if (auto code = reap()) return *code;
      restart_due();
      if (ready_ && !drain_deadline_) note_reregistered();
      if (!ready_ && !drain_deadline_) {
        if (auto code = check_ready()) return *code;
      } else {
        std::this_thread::sleep_for(milliseconds(50));
      }
    }
  }

 private:
  Child& scheduler() { return children_.front(); }

  bool launch(Child& c) {
    c.pid = start(c.spec);
    c.started = Clock::now();
    if (c.pid < 0) {
      say("cannot start %s (%s): %s", c.spec.name.c_str(), c.spec.argv[0].c_str(), strerror(errno));
      return false;
    }
    say("started %s (pid %d%s%s)", c.spec.name.c_str(), c.pid, c.spec.cpus.empty() ? "" : ", cpus ",
        cpus_text(c.spec.cpus).c_str());
    return true;
  }

  // Every exit path stops what still runs: SIGQUIT for the scheduler (stop without
  // draining) and SIGTERM for the workers, then SIGKILL after stop_timeout_ms.
  int stop_all(int code) {
    for (Child& c : children_)
      if (c.pid > 0) kill(c.pid, &c == &scheduler() ? SIGQUIT : SIGTERM);
    const auto deadline = Clock::now() + milliseconds(sv_.stop_timeout_ms);
    for (Child& c : children_) {
      if (c.pid <= 0) continue;
      int status = 0;
      while (waitpid(c.pid, &status, WNOHANG) == 0) {
        if (Clock::now() > deadline) {
          say("%s (pid %d) did not stop within %u ms: killing it", c.spec.name.c_str(), c.pid, sv_.stop_timeout_ms);
          kill(c.pid, SIGKILL);
          waitpid(c.pid, &status, 0);
          break;
        }
        std::this_thread::sleep_for(milliseconds(20));
      }
      c.pid = -1;
    }
    say("stopped (exit %d)", code);
    return code;
  }

  // The first signal drains, a second stops at once; a drain past its time stops too.
  std::optional<int> on_signals() {
    if (g_hangups > handled_hangups_) {
      handled_hangups_ = g_hangups;
      if (on_hangup_) on_hangup_();
      say("SIGHUP: the scheduler re-reads its allow-lists");
      if (scheduler().pid > 0) kill(scheduler().pid, SIGHUP);
    }
    if (g_signals > handled_signals_) {
      handled_signals_ = g_signals;
      if (handled_signals_ == 1) {
        say("%s: draining (no new requests; running ones get %u ms, then are cancelled)",
            g_last_signal == SIGINT ? "SIGINT" : "SIGTERM", sv_.drain_timeout_ms);
        kill(scheduler().pid, SIGTERM);
        drain_deadline_ = Clock::now() + milliseconds(sv_.drain_timeout_ms + sv_.stop_timeout_ms);
      } else {
        say("second signal: stopping at once");
        return stop_all(0);
      }
    }
    if (drain_deadline_ && Clock::now() > *drain_deadline_) {
      say("the scheduler did not finish draining in time: stopping");
      return stop_all(1);
    }
    return std::nullopt;
  }

  // Exits: the scheduler's ends the deployment; a worker's is a clean stop, a restart with
  // backoff, or (a crash loop) given up. Workers all stopped or given up, at least one given
  // up, is a failure; workers that stopped cleanly (the scheduler told them to) are not.
  std::optional<int> reap() {
    int status = 0;
    for (pid_t pid; (pid = waitpid(-1, &status, WNOHANG)) > 0;) {
      auto it = std::find_if(children_.begin(), children_.end(), [&](const Child& c) { return c.pid == pid; });
      if (it == children_.end()) continue;
      Child& c = *it;
      c.pid = -1;
      const double ran_s = std::chrono::duration<double>(Clock::now() - c.started).count();
      if (&c == &scheduler()) {
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
          say("the scheduler exited after draining; stopping the workers");
          return stop_all(0);
        }
        say("the scheduler (pid %d) died (%s) after %.1f s: stopping the deployment (clients get UNAVAILABLE)", pid,
            describe(status).c_str(), ran_s);
        return stop_all(1);
      }
      worker_exited(c, pid, status, ran_s);
    }
    auto done = [](const Child& c) { return !c.spec.worker || c.given_up || c.stopped; };
    auto lost = [](const Child& c) { return c.spec.worker && c.given_up; };
    if (!drain_deadline_ && std::all_of(children_.begin(), children_.end(), done) &&
        std::any_of(children_.begin(), children_.end(), lost)) {
      say("no worker left to run: stopping the deployment");
      return stop_all(1);
    }
    return std::nullopt;
  }

  void worker_exited(Child& c, pid_t pid, int status, double ran_s) {
    if (drain_deadline_ || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      say("%s (pid %d) stopped (%s)", c.spec.name.c_str(), pid, describe(status).c_str());
      c.stopped = true;
      return;
    }
    c.crashes = ran_s * 1000 >= sv_.healthy_after_ms ? 1 : c.crashes + 1;
    if (c.crashes > sv_.max_restarts) {
      say("%s (pid %d) exited (%s) after %.1f s: %u crashes in a row, a crash loop: not restarting it",
          c.spec.name.c_str(), pid, describe(status).c_str(), ran_s, c.crashes);
      c.given_up = true;
      return;
    }
    const uint64_t backoff = std::min<uint64_t>(uint64_t{sv_.restart_backoff_ms} << std::min(c.crashes - 1, 20u),
                                                sv_.restart_backoff_max_ms);
    c.restart_at = Clock::now() + milliseconds(backoff);
    say("%s (pid %d) exited (%s) after %.1f s: restart %u of %u in %llu ms", c.spec.name.c_str(), pid,
        describe(status).c_str(), ran_s, c.crashes, sv_.max_restarts, static_cast<unsigned long long>(backoff));
  }

  void restart_due() {
    for (Child& c : children_) {
      if (drain_deadline_ || c.pid >= 0 || c.given_up || c.stopped || &c == &scheduler() || Clock::now() < c.restart_at)
        continue;
      c.registered = !c.spec.worker;  // only workers register with the scheduler
      if (!launch(c)) c.given_up = true;
    }
  }

  // A restarted worker is back once the scheduler lists its pid.
  void note_reregistered() {
    if (std::none_of(children_.begin(), children_.end(), [](const Child& c) { return c.pid > 0 && !c.registered; }))
      return;
    auto st = client_->status(milliseconds(200));
    if (!st) return;
    for (Child& c : children_)
      for (const WorkerInfo& w : st->workers)
        if (c.pid > 0 && !c.registered && w.pid == static_cast<uint32_t>(c.pid)) {
          c.registered = true;
          say("%s (pid %d) registered again as worker %u", c.spec.name.c_str(), c.pid, w.id);
        }
  }

  std::optional<int> check_ready() {
    const size_t want = config_.worker_count();
    auto st = client_->status(milliseconds(200));
    if (st && st->workers.size() >= want) {
      ready_ = true;
      say("ready: %zu workers, endpoint %s", st->workers.size(), ep_.client.c_str());
    } else if (Clock::now() > ready_deadline_) {
      say("not ready after %u ms (%zu of %zu workers registered): stopping", sv_.ready_timeout_ms,
          st ? st->workers.size() : size_t{0}, want);
      return stop_all(1);
    }
    return std::nullopt;
  }

  const DeployConfig& config_;
  const Supervision& sv_;
  const Endpoints& ep_;
  const std::function<void()> on_hangup_;
  std::vector<Child> children_;  // the scheduler first
  std::unique_ptr<Client> client_;
  Clock::time_point ready_deadline_;
  bool ready_ = false;
  int handled_signals_ = 0, handled_hangups_ = 0;
  std::optional<Clock::time_point> drain_deadline_;
};

}  // namespace

int supervise(const DeployConfig& config, const Endpoints& ep, std::vector<ChildSpec> specs,
              std::function<void()> on_hangup) {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  return Supervisor(config, ep, std::move(specs), std::move(on_hangup)).run();
}

}  // namespace tandem::cli
