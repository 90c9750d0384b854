#include "cli/worker_cmd.h"

#include <cstdio>

#include "cli/commands.h"
#include "cli/kv_format_flags.h"
#include "cli/log_file.h"

namespace tandem::cli {

Status worker_options_from(const Args& args, worker::WorkerOptions& o) {
  auto threads = args.integer("threads", o.threads);
  auto blocks = args.integer("kv-blocks", o.kv_blocks);
  auto memory = args.integer("kv-memory", static_cast<int64_t>(o.kv_memory));
  auto block_tokens = args.integer("block-tokens", o.block_tokens);
  auto reserve = args.integer("memory-reserve", static_cast<int64_t>(o.memory_reserve));
  auto host_workers = args.integer("host-workers", o.host_workers);
  auto delay = args.integer("test-step-delay-ms", o.test_step_delay_ms);
  auto peer_idle = args.integer("kv-peer-idle-ms", o.kv_peer_idle_ms);
  auto state_slots = args.integer("state-slots", o.state_slots);
  auto checkpoints = args.integer("state-checkpoints", o.state_checkpoints);
  auto interval = args.integer("checkpoint-interval", o.checkpoint_interval);
  for (const Status* st : {&threads.status(), &blocks.status(), &memory.status(), &reserve.status(),
                           &host_workers.status(), &block_tokens.status(), &delay.status(), &peer_idle.status(),
                           &state_slots.status(), &checkpoints.status(), &interval.status()})
    if (!st->is_ok()) return *st;
  o.state_checkpoints = static_cast<uint32_t>(*checkpoints);
  o.checkpoint_interval = static_cast<uint32_t>(*interval);
  o.threads = static_cast<uint32_t>(*threads);
  o.kv_blocks = static_cast<uint32_t>(*blocks);
  o.state_slots = static_cast<uint32_t>(*state_slots);
  o.kv_memory = static_cast<uint64_t>(*memory);
  o.memory_reserve = static_cast<uint64_t>(*reserve);
  o.host_workers = static_cast<uint32_t>(*host_workers);
  o.block_tokens = static_cast<uint32_t>(*block_tokens);
  o.test_step_delay_ms = static_cast<uint32_t>(*delay);
  o.kv_peer_idle_ms = static_cast<uint32_t>(*peer_idle);
  if (auto role = args.str("role")) {
    auto r = worker::parse_role(*role);
    if (!r) return r.status();
    o.role = *r;
  }
  o.kv_rings = args.has("kv-rings");
  if (auto ep = args.str("kv-endpoint")) o.kv_endpoint = *ep;
  auto kv_format = kv_format_from_flags(args);
  if (!kv_format) return kv_format.status();
  o.kv_format = *kv_format;
  auto gemm = gemm_from_flags(args);
  if (!gemm) return gemm.status();
  o.gemm = *gemm;
  auto spec = spec_from_flags(args);
  if (!spec) return spec.status();
  o.spec_tokens = spec->spec_tokens;
  o.draft_model_path = spec->draft_model;
  return Status::ok();
}

int worker_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, kWorker);
  if (!args) return fail("worker", args.status());
  if (args->has("help")) {
    std::fputs(help_text(kWorker, "usage: tandem worker --model FILE --scheduler E [flags]").c_str(), stdout);
    return 0;
  }
  if (Status st = set_up_logging(*args, "worker"); !st) return fail("worker", st);
  worker::WorkerOptions o;
  auto model = args->str("model"), sched = args->str("scheduler");
  if (!model || !sched) return fail("worker", Status::invalid("--model and --scheduler are required"));
  o.model_path = *model;
  o.scheduler_endpoint = *sched;
  o.name = args->str("name").value_or("");
  o.curve_keys_dir = args->str("curve-keys").value_or("");
  o.worker_key = args->str("worker-key").value_or("");
  if (Status st = worker_options_from(*args, o); !st) return fail("worker", st);
  auto stop = worker::run_worker(o);
  if (!stop) return fail("worker", stop.status());
  // A signal from outside (not the scheduler's shutdown) is not a clean stop: tandem up and
  // systemd restart the worker (deploy/ lists 143 as a success only for `systemctl stop`).
  return stop->signal == 0 ? 0 : 128 + stop->signal;
}

}  // namespace tandem::cli
