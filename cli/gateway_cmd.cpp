// tandem gateway: the OpenAI-compatible HTTP gateway (gateway/server.h) in front of a running
// service, as a process of its own; `tandem up --http` starts it supervised.
#include <sys/resource.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/curve_flag.h"
#include "cli/gateway_cmd.h"
#include "cli/log_file.h"
#include "gateway/server.h"

namespace tandem::cli {

namespace {

constexpr const char* kUsage =
    "usage: tandem gateway --endpoint E --model FILE [--listen HOST:PORT] [--model-name NAME] [flags]";
constexpr const char* kNotes =
    "Serves POST /v1/completions, /v1/chat/completions (streaming with \"stream\": true), /tokenize, /detokenize,\n"
    "GET /v1/models, /health, /ready, /metrics (Prometheus). Prints \"tandem gateway: listening on URL\" once it\n"
    "accepts; SIGTERM stops it.\n";

// Lowers the gateway's priority by `n`: Linux applies nice per thread, so every thread there is
// now (a library's pool started before main) and, through the calling thread, every thread
// started later (the HTTP loop, the client library's, ZeroMQ's). The measurement behind the
// default is in bench/RESULTS.md (issue 17).
Status lower_priority(int64_t n) {
  if (n == 0) return Status::ok();
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const auto tid = static_cast<id_t>(std::stoul(task.path().filename().string()));
    errno = 0;
    const int now = getpriority(PRIO_PROCESS, tid);
    if (errno != 0 || setpriority(PRIO_PROCESS, tid, now + static_cast<int>(n)) != 0)
      return Status::invalid(std::string("--nice: cannot lower the priority: ") + std::strerror(errno));
  }
  if (ec) return Status::invalid("--nice: cannot list the threads in /proc/self/task: " + ec.message());
  return Status::ok();
}

}  // namespace

Status gateway_options_from(const Args& args, gateway::GatewayOptions& o) {
  auto endpoint = args.str("endpoint"), model = args.str("model");
  if (!endpoint || !model) return Status::invalid("--endpoint E and --model FILE are required");
  o.client.endpoint = *endpoint;
  TANDEM_RETURN_IF_ERROR(apply_curve_flag(args, o.client));
  o.model_path = *model;
  o.listen = args.str("listen").value_or(o.listen);
  TANDEM_RETURN_IF_ERROR(gateway::check_listen(o.listen));
  o.model_name = args.str("model-name").value_or("");
  o.api_key_file = args.str("api-key-file").value_or("");
  o.tls_cert = args.str("tls-cert").value_or("");
  o.tls_key = args.str("tls-key").value_or("");
  auto body = args.integer("max-body-bytes", static_cast<int64_t>(o.max_body_bytes));
  auto timeout = args.integer("read-timeout-ms", o.read_timeout.count());
  if (!body) return body.status();
  if (!timeout) return timeout.status();
  o.max_body_bytes = static_cast<size_t>(*body);
  o.read_timeout = std::chrono::milliseconds(*timeout);
  if (o.tls_cert.empty() != o.tls_key.empty()) return Status::invalid("--tls-cert and --tls-key go together");
  return Status::ok();
}

int gateway_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, kGateway);
  if (!args) return fail("gateway", args.status());
  if (args->has("help")) {
    std::fputs(help_text(kGateway, kUsage, kNotes).c_str(), stdout);
    return 0;
  }
  auto nice = args->integer("nice", 10);
  if (!nice) return fail("gateway", nice.status());
  if (Status st = lower_priority(*nice); !st) return fail("gateway", st);
  if (Status st = set_up_logging(*args, "gateway"); !st) return fail("gateway", st);
  gateway::GatewayOptions o;
  if (Status st = gateway_options_from(*args, o); !st) return fail("gateway", st);
  Status st = gateway::run_gateway(o, [](const std::string& url) {
    std::printf("tandem gateway: listening on %s\n", url.c_str());
    std::fflush(stdout);
  });
  if (!st) return fail("gateway", st);
  return 0;
}

}  // namespace tandem::cli
