// Operating a running service: `tandem probe` (liveness / readiness for scripts and
// orchestrators: exit 0 or 1) and `tandem drain` (stop admitting, finish, exit).
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/curve_flag.h"
#include "runtime/event_loop.h"
#include "runtime/wire.h"
#include "tandem/client.h"
#include "tandem/v1/client.pb.h"

namespace tandem::cli {

namespace {

Result<StatusInfo> query(const Args& args, const std::string& endpoint, std::chrono::milliseconds timeout) {
  ClientOptions o;
  o.endpoint = endpoint;
  TANDEM_RETURN_IF_ERROR(apply_curve_flag(args, o));
  auto client = Client::connect(o);
  if (!client) return client.status();
  return (*client)->status(timeout);
}

// Sends one Drain message and waits for the scheduler's StatusReply.
Result<v1::StatusReply> send_drain(const Args& args, const std::string& endpoint, uint32_t drain_ms,
                                   std::chrono::milliseconds timeout) {
  const runtime::SocketLimits limits;
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::maxmsgsize, limits.max_message_bytes);
  s.set(zmq::sockopt::sndhwm, limits.send_hwm);
  s.set(zmq::sockopt::rcvhwm, limits.recv_hwm);
  if (auto dir = args.str("curve-keys")) {
    auto keys = runtime::load_curve_keys(*dir, /*need_secret=*/false);
    if (!keys) return keys.status();
    TANDEM_RETURN_IF_ERROR(runtime::apply_curve(s.handle(), *keys));
  }
  try {
    s.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return Status::invalid("--endpoint " + endpoint + ": " + e.what());
  }
  v1::ClientMessage m;
  m.set_version(v1::PROTOCOL_VERSION_CURRENT);
  m.mutable_drain()->set_timeout_ms(drain_ms);
  s.send(runtime::to_frame(m), zmq::send_flags::dontwait);
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  zmq::message_t reply;
  if (zmq::poll(&item, 1, timeout) <= 0 || !s.recv(reply, zmq::recv_flags::dontwait))
    return Status::error(Code::kUnavailable,
                         "no answer from " + endpoint + " within " + std::to_string(timeout.count()) + " ms");
  v1::SchedulerReply r;
  if (Status st = runtime::parse_frame(reply, r); !st) return st;
  if (r.has_error())
    return Status::error(
        r.error().code() == v1::ERROR_CODE_PERMISSION_DENIED ? Code::kPermissionDenied : Code::kInternal,
        endpoint + " refused the drain: " + r.error().message());
  if (!r.has_status()) return Status::error(Code::kInternal, "unexpected reply to drain from " + endpoint);
  return r.status();
}

}  // namespace

int probe_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, kProbe);
  if (!args) return fail("probe", args.status());
  if (args->has("help")) {
    std::fputs(help_text(kProbe, "usage: tandem probe --endpoint E [flags]",
                         "Exit 0 when the scheduler answers within the timeout (liveness), 1 otherwise. With --ready,\n"
                         "exit 0 only when it also has a worker of every needed role and is not draining (readiness).")
                   .c_str(),
               stdout);
    return 0;
  }
  auto endpoint = args->str("endpoint");
  if (!endpoint) return fail("probe", Status::invalid("--endpoint E is required"));
  auto timeout = args->integer("timeout-ms", 2000);
  if (!timeout) return fail("probe", timeout.status());
  auto info = query(*args, *endpoint, std::chrono::milliseconds(*timeout));
  const bool quiet = args->has("quiet");
  if (!info) {
    if (info.status().code() == Code::kInvalidArgument) return fail("probe", info.status());
    if (!quiet) std::printf("not live: %s\n", info.status().message().c_str());
    return 1;
  }
  if (args->has("ready")) {
    const char* why = info->draining ? "draining" : !info->ready ? "no worker registered" : nullptr;
    if (why) {
      if (!quiet) std::printf("not ready: %s\n", why);
      return 1;
    }
    if (!quiet) std::printf("ready: %zu workers\n", info->workers.size());
    return 0;
  }
  if (!quiet) std::printf("live\n");
  return 0;
}

int drain_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, kDrain);
  if (!args) return fail("drain", args.status());
  if (args->has("help")) {
    std::fputs(
        help_text(kDrain, "usage: tandem drain --endpoint ADMIN_E [flags]",
                  "E: the scheduler's admin endpoint (tandem up prints it: ipc://RUNTIME_DIR/admin.sock).\n"
                  "Tells the scheduler to drain: new requests get UNAVAILABLE, running ones finish within the drain\n"
                  "timeout (default: the scheduler's --drain-timeout-ms), the rest are cancelled, then it exits.\n"
                  "--wait returns only once the scheduler has stopped answering (exit 1 if it still answers after\n"
                  "the drain timeout plus 30 s).")
            .c_str(),
        stdout);
    return 0;
  }
  auto endpoint = args->str("endpoint");
  if (!endpoint) return fail("drain", Status::invalid("--endpoint E is required"));
  auto drain_ms = args->integer("drain-timeout-ms", 0);
  auto timeout = args->integer("timeout-ms", 2000);
  if (!drain_ms) return fail("drain", drain_ms.status());
  if (!timeout) return fail("drain", timeout.status());
  auto st = send_drain(*args, *endpoint, static_cast<uint32_t>(*drain_ms), std::chrono::milliseconds(*timeout));
  if (!st) return fail("drain", st.status());
  std::printf("draining: %u queued, %u running\n", st->queued(), st->running());
  std::fflush(stdout);
  if (!args->has("wait")) return 0;
  const int64_t limit_ms = (*drain_ms ? *drain_ms : 30'000) + 30'000;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!query(*args, *endpoint, std::chrono::milliseconds(500))) {
      std::printf("drained: the scheduler has exited\n");
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return fail("drain", Status::error(Code::kUnavailable,
                                     "the scheduler still answers after " + std::to_string(limit_ms) + " ms"));
}

int keys_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, kKeys);
  if (!args) return fail("keys", args.status());
  if (args->has("help") || !args->has("out")) {
    std::fputs(
        help_text(kKeys, "usage: tandem keys --out DIR [--name NAME]",
                  "Writes a CurveZMQ key pair for a scheduler: DIR/server.key (secret, 0600: the scheduler's host\n"
                  "only) and DIR/server.pub (what workers and clients need to connect). Run tandem up / scheduler /\n"
                  "worker / status / generate with --curve-keys DIR.\n"
                  "With --name NAME: a worker's or a client's key pair DIR/NAME.key (its --worker-key / --client-key)\n"
                  "and DIR/NAME.pub, and the line to add to the scheduler's --worker-keys or --client-keys file.")
            .c_str(),
        stdout);
    return args->has("help") ? 0 : 2;
  }
  const std::string dir = *args->str("out");
  if (auto name = args->str("name")) {
    auto pub = runtime::write_named_key_pair(dir, *name);
    if (!pub) return fail("keys", pub.status());
    std::fprintf(stderr, "wrote %s/%s.key and %s/%s.pub; its allow-list line:\n", dir.c_str(), name->c_str(),
                 dir.c_str(), name->c_str());
    std::printf("%s %s\n", pub->c_str(), name->c_str());
    return 0;
  }
  if (Status st = runtime::write_curve_keys(dir); !st) return fail("keys", st);
  std::printf("wrote %s/server.key and %s/server.pub\n", args->str("out")->c_str(), args->str("out")->c_str());
  return 0;
}

}  // namespace tandem::cli
