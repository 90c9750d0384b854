#include "cli/scheduler_cmd.h"

#include "cli/commands.h"
#include "cli/log_file.h"
#include "scheduler/registration.h"

#include <cstdio>

namespace tandem::cli {

Status scheduler_options_from(const Args& args, scheduler::ActorOptions& o) {
  auto get = [&](const char* flag, uint32_t& out) -> Status {
    auto v = args.integer(flag, out);
    if (!v) return v.status();
    out = static_cast<uint32_t>(*v);
    return Status::ok();
  };
  TANDEM_RETURN_IF_ERROR(get("max-batch-tokens", o.core.max_batch_tokens));
  TANDEM_RETURN_IF_ERROR(get("prefill-chunk", o.core.prefill_chunk));
  TANDEM_RETURN_IF_ERROR(get("target-step-ms", o.core.target_step_ms));
  TANDEM_RETURN_IF_ERROR(get("max-queue", o.core.max_queue));
  TANDEM_RETURN_IF_ERROR(get("max-client-requests", o.core.max_client_requests));
  TANDEM_RETURN_IF_ERROR(get("max-running", o.core.max_running));
  TANDEM_RETURN_IF_ERROR(get("pipeline-depth", o.core.pipeline_depth));
  TANDEM_RETURN_IF_ERROR(get("heartbeat-ms", o.heartbeat_ms));
  TANDEM_RETURN_IF_ERROR(get("client-timeout-ms", o.client_timeout_ms));
  TANDEM_RETURN_IF_ERROR(get("max-clients", o.max_clients));
  TANDEM_RETURN_IF_ERROR(get("handoff-timeout-ms", o.core.handoff_timeout_ms));
  TANDEM_RETURN_IF_ERROR(get("client-send-queue", o.client_send_queue));
  auto send_bytes = args.integer("client-send-bytes", static_cast<int64_t>(o.client_send_bytes));
  if (!send_bytes) return send_bytes.status();
  o.client_send_bytes = static_cast<uint64_t>(*send_bytes);
  auto cache = args.choice("prefix-cache", o.core.prefix_cache ? "on" : "off");
  if (!cache) return cache.status();
  o.core.prefix_cache = *cache == "on";
  TANDEM_RETURN_IF_ERROR(get("worker-liveness", o.worker_liveness));
  TANDEM_RETURN_IF_ERROR(get("drain-timeout-ms", o.drain_timeout_ms));
  TANDEM_RETURN_IF_ERROR(get("prompt-threads", o.prompt_threads));
  auto kv_bytes = args.integer("max-worker-kv-bytes", static_cast<int64_t>(o.max_worker_kv_bytes));
  if (!kv_bytes) return kv_bytes.status();
  o.max_worker_kv_bytes = static_cast<uint64_t>(*kv_bytes);
  if (auto allow = args.str("kv-endpoint-allow")) o.kv_endpoint_allow = scheduler::split_list(*allow);
  o.kv_endpoint_allow_file = args.str("kv-endpoint-allow-file").value_or("");
  return Status::ok();
}

int scheduler_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, kScheduler);
  if (!args) return fail("scheduler", args.status());
  if (args->has("help")) {
    std::fputs(
        help_text(kScheduler, "usage: tandem scheduler --model FILE --client-endpoint E --worker-endpoint E [flags]")
            .c_str(),
        stdout);
    return 0;
  }
  if (Status st = set_up_logging(*args, "scheduler"); !st) return fail("scheduler", st);
  scheduler::ActorOptions o;
  auto model = args->str("model"), ce = args->str("client-endpoint"), we = args->str("worker-endpoint");
  if (!model || !ce || !we)
    return fail("scheduler", Status::invalid("--model, --client-endpoint and --worker-endpoint are required"));
  o.model_path = *model;
  o.client_endpoint = *ce;
  o.worker_endpoint = *we;
  o.admin_endpoint = args->str("admin-endpoint").value_or("");
  o.curve_keys_dir = args->str("curve-keys").value_or("");
  o.worker_keys = args->str("worker-keys").value_or("");
  o.client_keys = args->str("client-keys").value_or("");
  if (Status st = scheduler_options_from(*args, o); !st) return fail("scheduler", st);
  if (Status st = scheduler::run_scheduler(o); !st) return fail("scheduler", st);
  return 0;
}

}  // namespace tandem::cli
