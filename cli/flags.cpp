#include "cli/flags.h"

#include <cstdint>

namespace tandem::cli {

namespace {

using T = FlagType;
using S = Section;

constexpr int64_t kI32Max = INT32_MAX, kI32Min = INT32_MIN, kU32Max = UINT32_MAX, kI64Max = INT64_MAX;
constexpr uint32_t kTandem = kMakeModel | kRun | kGenerate | kStatus | kBench | kUp | kDrain | kKeys | kProbe |
                             kScheduler | kWorker;
constexpr uint32_t kServing = kUp | kScheduler | kWorker;
constexpr uint32_t kSchedulerSetting = kScheduler | kUp;    // [scheduler], forwarded by `tandem up`
constexpr uint32_t kWorkerSetting = kWorker | kUp;          // [[workers]], forwarded by `tandem up`
constexpr uint32_t kEngine = kRun | kWorker | kUp;          // how a model is computed, in-process or served
constexpr uint32_t kClients = kGenerate | kStatus | kProbe | kDrain;

// Order: the order --help lists them in.
constexpr Flag kFlags[] = {
    // Inputs and targets.
    {.name = "config", .type = T::kText, .commands = kUp, .help = "a deployment file (see deploy/local.toml); flags override it",
     .value = "FILE"},
    {.name = "model", .type = T::kText, .commands = kServing | kRun, .help = "the GGUF model file", .value = "FILE",
     .section = S::kTop, .toml_key = "model"},
    {.name = "model", .type = T::kText, .commands = kEngineBench | kServeBench | kDisaggBench,
     .help = "the GGUF model file (the small preset is written there when missing)", .value = "FILE",
     .fallback = "models/small-1.gguf"},
    {.name = "model", .type = T::kText, .commands = kBench, .help = "the \"model\" field sent to an OpenAI-compatible server",
     .value = "NAME"},
    {.name = "endpoint", .type = T::kText, .commands = kClients | kBench,
     .help = "the scheduler's client endpoint (ipc://... or tcp://...)", .value = "E"},
    {.name = "endpoint", .type = T::kText, .commands = kUp,
     .help = "where clients connect (tcp://:5555 binds 127.0.0.1); default ipc:// in the runtime folder", .value = "E",
     .section = S::kTop, .toml_key = "endpoint"},
    {.name = "client-endpoint", .type = T::kText, .commands = kScheduler, .help = "where clients connect", .value = "E",
     .set_by_up = true},
    {.name = "worker-endpoint", .type = T::kText, .commands = kScheduler | kUp,
     .help = "where workers connect; default (tandem up) ipc:// in the runtime folder", .value = "E", .section = S::kTop,
     .toml_key = "worker_endpoint"},
    {.name = "scheduler", .type = T::kText, .commands = kWorker, .help = "the scheduler's worker endpoint", .value = "E",
     .set_by_up = true},
    {.name = "openai-url", .type = T::kText, .commands = kBench,
     .help = "an OpenAI-compatible server, http://host:port (POST /v1/completions, SSE)", .value = "URL"},
    {.name = "token-prompts", .type = T::kSwitch, .commands = kBench,
     .help = "send prompts as token-id arrays (vLLM, llama.cpp); else as text"},
    {.name = "tandem", .type = T::kText, .commands = kServeBench | kDisaggBench, .help = "the tandem binary to start",
     .value = "PATH", .fallback = "../cli/tandem beside this binary"},
    {.name = "preset", .type = T::kText, .commands = kMakeModel, .help = "the model's shape: tiny or small",
     .value = "tiny|small", .fallback = "tiny"},
    {.name = "seed", .type = T::kInt, .commands = kMakeModel, .help = "the weights' seed", .lo = 0, .hi = kI64Max,
     .fallback = "1"},
    {.name = "dtype", .type = T::kChoice, .commands = kMakeModel,
     .help = "f16: matrices and embeddings in half precision (norms stay F32)", .choices = "f32|f16", .fallback = "f32"},
    {.name = "tied", .type = T::kSwitch, .commands = kMakeModel,
     .help = "no output.weight: the LM head reuses token_embd.weight"},
    {.name = "out", .type = T::kText, .commands = kMakeModel, .help = "the GGUF file to write", .value = "FILE"},
    {.name = "out", .type = T::kText, .commands = kKeys, .help = "the folder for server.key and server.pub", .value = "DIR"},

    // One request (run, generate).
    {.name = "prompt", .type = T::kText, .commands = kRun | kGenerate, .help = "the prompt as text", .value = "TEXT"},
    {.name = "tokens", .type = T::kIntList, .commands = kRun | kGenerate, .help = "the prompt as token ids",
     .value = "1,2,3", .lo = kI32Min, .hi = kI32Max},
    {.name = "max-tokens", .type = T::kInt, .commands = kRun, .help = "tokens to generate", .lo = 1, .hi = 1 << 20,
     .fallback = "32"},
    {.name = "max-tokens", .type = T::kInt, .commands = kGenerate, .help = "tokens to generate", .lo = 1, .hi = kU32Max,
     .fallback = "16"},
    // Sampling: one definition for run and generate.
    {.name = "temperature", .type = T::kReal, .commands = kRun | kGenerate, .help = "0 = greedy", .value = "T",
     .fallback = "0"},
    {.name = "top-k", .type = T::kInt, .commands = kRun | kGenerate, .help = "sample among the K most likely (0 = all)",
     .value = "K", .lo = 0, .hi = kI32Max, .fallback = "0"},
    {.name = "top-p", .type = T::kReal, .commands = kRun | kGenerate, .help = "nucleus sampling", .value = "P",
     .fallback = "1"},
    {.name = "min-p", .type = T::kReal, .commands = kRun | kGenerate,
     .help = "drop tokens below P x the most likely one's probability", .value = "P", .fallback = "0"},
    {.name = "repetition-penalty", .type = T::kReal, .commands = kRun | kGenerate,
     .help = "over the last 64 tokens, as llama.cpp", .value = "R", .fallback = "1"},
    {.name = "seed", .type = T::kInt, .commands = kRun | kGenerate, .help = "the sampler's seed", .value = "S", .lo = 0,
     .hi = kI64Max, .fallback = "0"},
    {.name = "stop", .type = T::kRepeat, .commands = kGenerate, .help = "stop string (repeatable)", .value = "STR"},
    {.name = "include-stop-string", .type = T::kSwitch, .commands = kGenerate,
     .help = "keep the matched stop string in the text"},
    {.name = "ignore-eos", .type = T::kSwitch, .commands = kRun | kGenerate | kBench,
     .help = "keep going past the end-of-sequence token (bench: generate exactly the output length)"},
    {.name = "no-bos", .type = T::kSwitch, .commands = kRun | kGenerate, .help = "do not prepend BOS to a text prompt"},
    {.name = "logprobs", .type = T::kSwitch, .commands = kGenerate,
     .help = "report each token's logprob (--top-logprobs N: the N best too)"},
    {.name = "top-logprobs", .type = T::kInt, .commands = kGenerate, .help = "report the N most likely tokens at each step",
     .lo = 0, .hi = 1024, .fallback = "0"},
    {.name = "priority", .type = T::kInt, .commands = kGenerate, .help = "higher runs first among waiting requests",
     .lo = kI32Min, .hi = kI32Max, .fallback = "0"},
    {.name = "timeout-ms", .type = T::kInt, .commands = kGenerate,
     .help = "deadline for the whole request (0: none)", .value = "MS", .lo = 0, .hi = kU32Max, .fallback = "0"},
    {.name = "timeout-ms", .type = T::kInt, .commands = kStatus | kProbe | kDrain, .help = "how long to wait for an answer",
     .value = "MS", .lo = 1, .hi = 3'600'000, .fallback = "2000"},
    {.name = "chunk", .type = T::kInt, .commands = kRun, .help = "prompt tokens per forward pass", .lo = 1,
     .hi = 1 << 20, .fallback = "512"},

    // How a model is computed: `tandem run`, and each worker ([[workers]]).
    {.name = "threads", .type = T::kInt, .commands = kEngine, .help = "compute threads (tandem up: per worker)",
     .lo = 1, .hi = 256, .fallback = "2; tandem up: 1", .section = S::kWorkers, .toml_key = "threads"},
    {.name = "gemm", .type = T::kChoice, .commands = kEngine, .help = "matrix kernels (packed: batch-invariant)",
     .choices = "packed|openblas", .fallback = "packed", .section = S::kWorkers, .toml_key = "gemm"},
    {.name = "kv-bits", .type = T::kInt, .commands = kEngine,
     .help = "KV cache storage: 0 = F32, 8 or 4 bits per element", .value = "0|8|4", .lo = 0, .hi = 8,
     .fallback = "0", .section = S::kWorkers, .toml_key = "kv_bits"},
    {.name = "kv-group-size", .type = T::kInt, .commands = kEngine,
     .help = "elements per scale/bias group of a head vector: 32, 64 or 128", .lo = 1, .hi = 4096, .fallback = "64",
     .section = S::kWorkers, .toml_key = "kv_group_size"},
    {.name = "kv-quant-skip-last-layer", .type = T::kSwitch, .commands = kEngine, .help = "keep the last layer's KV in F32",
     .section = S::kWorkers, .toml_key = "kv_quant_skip_last_layer"},
    {.name = "kv-f32-window", .type = T::kInt, .commands = kEngine,
     .help = "with 8 or 4 bits: keep each sequence's N most recent blocks also in F32, read by attention\n"
             "for the nearest keys (costs N F32 blocks per sequence)",
     .value = "0|1|2", .lo = 0, .hi = 2, .fallback = "2", .section = S::kWorkers, .toml_key = "kv_f32_window"},
    {.name = "kv-memory", .type = T::kInt, .commands = kWorkerSetting, .help = "bytes of KV cache per worker",
     .value = "BYTES", .lo = 1 << 20, .hi = int64_t{1} << 40, .fallback = "1073741824", .section = S::kWorkers,
     .toml_key = "kv_memory"},
    // 0 is the worker's "size the pool from --kv-memory", in a file as on the command line.
    {.name = "kv-blocks", .type = T::kInt, .commands = kWorkerSetting,
     .help = "KV blocks per worker (0: as many as --kv-memory holds)", .lo = 0, .hi = 1 << 24, .fallback = "0",
     .section = S::kWorkers, .toml_key = "kv_blocks"},
    {.name = "block-tokens", .type = T::kInt, .commands = kWorkerSetting, .help = "tokens per KV block", .lo = 16,
     .hi = 4096, .fallback = "16", .section = S::kWorkers, .toml_key = "block_tokens"},
    {.name = "role", .type = T::kChoice, .commands = kWorker,
     .help = "prefill: prompts only, KV handed to a decode worker (tandem up: --prefill / --decode)",
     .choices = "both|prefill|decode", .fallback = "both", .section = S::kWorkers, .toml_key = "role"},
    {.name = "kv-endpoint", .type = T::kText, .commands = kWorkerSetting,
     .help = "decode workers: where prefill workers push KV (tandem up: a socket in the runtime folder)", .value = "E",
     .fallback = "tcp://127.0.0.1:*", .section = S::kWorkers, .toml_key = "kv_endpoint"},
    {.name = "name", .type = T::kText, .commands = kWorker, .help = "the worker's name in logs", .value = "NAME",
     .fallback = "worker-<pid>", .set_by_up = true},
    // [[workers]] keys with no flag of their own: `tandem up --workers N` / --prefill P / --decode D
    // say how many workers of a role; pinning is per worker table.
    {.name = "", .type = T::kInt, .commands = 0, .help = "workers of this table", .lo = 0, .hi = 256, .fallback = "1",
     .section = S::kWorkers, .toml_key = "count"},
    {.name = "", .type = T::kIntList, .commands = 0, .help = "CPUs to pin to: worker k gets cpus[k*threads .. (k+1)*threads)",
     .lo = 0, .hi = 4095, .section = S::kWorkers, .toml_key = "cpus"},
    {.name = "workers", .type = T::kInt, .commands = kUp, .help = "workers of role both", .lo = 0, .hi = 256,
     .fallback = "1"},
    {.name = "prefill", .type = T::kInt, .commands = kUp, .help = "prefill workers (with --decode D)", .value = "P",
     .lo = 0, .hi = 256},
    {.name = "decode", .type = T::kInt, .commands = kUp, .help = "decode workers (with --prefill P)", .value = "D",
     .lo = 0, .hi = 256},
    {.name = "oversubscribe", .type = T::kSwitch, .commands = kUp, .help = "allow more worker threads than cores",
     .section = S::kTop, .toml_key = "oversubscribe"},

    // The scheduler ([scheduler]).
    {.name = "max-batch-tokens", .type = T::kInt, .commands = kSchedulerSetting,
     .help = "token budget of one step (a decode counts one)", .lo = 1, .hi = 1 << 20, .fallback = "512",
     .section = S::kScheduler, .toml_key = "max_batch_tokens"},
    {.name = "prefill-chunk", .type = T::kInt, .commands = kSchedulerSetting,
     .help = "prompt tokens of one sequence per step", .lo = 1, .hi = 1 << 20, .fallback = "256",
     .section = S::kScheduler, .toml_key = "prefill_chunk"},
    {.name = "max-queue", .type = T::kInt, .commands = kSchedulerSetting,
     .help = "waiting requests; past it a submit gets OVERLOADED", .lo = 1, .hi = 1 << 24, .fallback = "4096",
     .section = S::kScheduler, .toml_key = "max_queue"},
    {.name = "max-running", .type = T::kInt, .commands = kSchedulerSetting, .help = "sequences per worker", .lo = 1,
     .hi = 1 << 16, .fallback = "256", .section = S::kScheduler, .toml_key = "max_running"},
    {.name = "pipeline-depth", .type = T::kInt, .commands = kSchedulerSetting, .help = "step plans in flight per worker",
     .lo = 1, .hi = 8, .fallback = "2", .section = S::kScheduler, .toml_key = "pipeline_depth"},
    {.name = "heartbeat-ms", .type = T::kInt, .commands = kSchedulerSetting,
     .help = "heartbeat period of the scheduler and its workers", .value = "MS", .lo = 10, .hi = 60000,
     .fallback = "1000", .section = S::kScheduler, .toml_key = "heartbeat_ms"},
    {.name = "worker-liveness", .type = T::kInt, .commands = kSchedulerSetting,
     .help = "a worker silent this many heartbeats is dead; its sequences move", .lo = 1, .hi = 100, .fallback = "3",
     .section = S::kScheduler, .toml_key = "worker_liveness"},
    {.name = "client-timeout-ms", .type = T::kInt, .commands = kSchedulerSetting,
     .help = "a client with live requests silent this long is gone", .value = "MS", .lo = 100, .hi = 3'600'000,
     .fallback = "5000", .section = S::kScheduler, .toml_key = "client_timeout_ms"},
    {.name = "prefix-cache", .type = T::kChoice, .commands = kSchedulerSetting,
     .help = "reuse the KV of prompt prefixes seen before", .choices = "on|off", .fallback = "on",
     .section = S::kScheduler, .toml_key = "prefix_cache"},
    {.name = "handoff-timeout-ms", .type = T::kInt, .commands = kSchedulerSetting,
     .help = "a KV handoff not acknowledged by then is recomputed elsewhere", .value = "MS", .lo = 10,
     .hi = 3'600'000, .fallback = "5000", .section = S::kScheduler, .toml_key = "handoff_timeout_ms"},
    {.name = "client-send-queue", .type = T::kInt, .commands = kSchedulerSetting,
     .help = "messages queued to a client before its requests are cancelled", .lo = 16, .hi = 10'000'000,
     .fallback = "10000", .section = S::kScheduler, .toml_key = "client_send_queue"},

    // Supervision ([supervisor]); the drain timeout is also the scheduler's.
    {.name = "drain-timeout-ms", .type = T::kInt, .commands = kScheduler | kUp,
     .help = "draining: running requests get this long to finish, then are cancelled", .value = "MS", .lo = 0,
     .hi = 86'400'000, .fallback = "30000", .section = S::kSupervisor, .toml_key = "drain_timeout_ms"},
    {.name = "drain-timeout-ms", .type = T::kInt, .commands = kDrain,
     .help = "running requests get this long (0: the scheduler's --drain-timeout-ms)", .value = "MS", .lo = 0,
     .hi = 86'400'000, .fallback = "0"},
    {.name = "max-restarts", .type = T::kInt, .commands = kUp,
     .help = "crashes in a row before a worker is given up (a crash loop)", .lo = 0, .hi = 1000, .fallback = "5",
     .section = S::kSupervisor, .toml_key = "max_restarts"},
    {.name = "restart-backoff-ms", .type = T::kInt, .commands = kUp,
     .help = "first restart delay, doubled per crash in a row", .value = "MS", .lo = 0, .hi = 3'600'000,
     .fallback = "500", .section = S::kSupervisor, .toml_key = "restart_backoff_ms"},
    {.name = "restart-backoff-max-ms", .type = T::kInt, .commands = kUp, .help = "the longest restart delay",
     .value = "MS", .lo = 0, .hi = 3'600'000, .fallback = "10000", .section = S::kSupervisor,
     .toml_key = "restart_backoff_max_ms"},
    {.name = "healthy-after-ms", .type = T::kInt, .commands = kUp,
     .help = "a worker up this long starts counting its crashes afresh", .value = "MS", .lo = 0, .hi = 86'400'000,
     .fallback = "30000", .section = S::kSupervisor, .toml_key = "healthy_after_ms"},
    {.name = "stop-timeout-ms", .type = T::kInt, .commands = kUp,
     .help = "each process gets this long after SIGTERM before SIGKILL", .value = "MS", .lo = 100, .hi = 600'000,
     .fallback = "5000", .section = S::kSupervisor, .toml_key = "stop_timeout_ms"},
    {.name = "ready-timeout-ms", .type = T::kInt, .commands = kUp,
     .help = "every worker registered within this, or the deployment stops", .value = "MS", .lo = 100,
     .hi = 3'600'000, .fallback = "120000", .section = S::kSupervisor, .toml_key = "ready_timeout_ms"},

    // Processes: folders, logs, keys.
    {.name = "runtime-dir", .type = T::kText, .commands = kUp,
     .help = "folder of the ipc:// sockets (mode 0700)", .value = "DIR",
     .fallback = "$XDG_RUNTIME_DIR (or /tmp)/tandem-<uid>-<pid>", .section = S::kTop, .toml_key = "runtime_dir"},
    {.name = "log-dir", .type = T::kText, .commands = kUp,
     .help = "one rotating log file per process (scheduler.log, worker-0.log, ...); default stderr", .value = "DIR",
     .section = S::kTop, .toml_key = "log_dir"},
    {.name = "log-file", .type = T::kText, .commands = kScheduler | kWorker,
     .help = "log to a rotating file instead of stderr", .value = "FILE", .set_by_up = true},
    {.name = "log-level", .type = T::kChoice, .commands = kServing, .help = "log verbosity",
     .choices = "trace|debug|info|warn|error|off", .fallback = "info", .section = S::kTop, .toml_key = "log_level"},
    {.name = "curve-keys", .type = T::kText, .commands = kServing | kClients,
     .help = "CurveZMQ keys from tandem keys --out DIR (server.key where a scheduler runs, server.pub elsewhere)",
     .value = "DIR", .section = S::kTop, .toml_key = "curve_keys"},

    // Other commands.
    {.name = "ready", .type = T::kSwitch, .commands = kProbe,
     .help = "readiness: a worker of every needed role and not draining"},
    {.name = "quiet", .type = T::kSwitch, .commands = kProbe, .help = "print nothing; the exit status says it"},
    {.name = "wait", .type = T::kSwitch, .commands = kDrain, .help = "return once the scheduler has stopped answering"},
    {.name = "rate", .type = T::kReal, .commands = kBench, .help = "open loop: R requests/s (Poisson arrivals)",
     .value = "R"},
    {.name = "burstiness", .type = T::kReal, .commands = kBench,
     .help = "gamma shape of the arrival gaps (1 = Poisson; < 1 burstier)", .value = "B", .fallback = "1"},
    {.name = "concurrency", .type = T::kInt, .commands = kBench, .help = "closed loop / cap: at most C requests in flight",
     .value = "C", .lo = 0, .hi = 1'000'000},
    {.name = "num-requests", .type = T::kInt, .commands = kBench, .help = "measured requests", .lo = 0, .hi = kI64Max},
    {.name = "duration", .type = T::kReal, .commands = kBench, .help = "stop sending after S seconds", .value = "S"},
    {.name = "warmup", .type = T::kInt, .commands = kBench, .help = "requests run first and not counted", .lo = 0,
     .hi = 1'000'000, .fallback = "0"},
    {.name = "seed", .type = T::kInt, .commands = kBench, .help = "workload and arrival seed", .value = "S", .lo = 0,
     .hi = kI64Max, .fallback = "0"},
    {.name = "drain-timeout", .type = T::kReal, .commands = kBench,
     .help = "wait at most S s for requests in flight at the end", .value = "S", .fallback = "120"},
    {.name = "input-len", .type = T::kText, .commands = kBench,
     .help = "prompt tokens, fixed or uniform; synthetic prompts use token ids in [3, 259),\n"
             "present in every byte-level vocabulary",
     .value = "N|A:B", .fallback = "128"},
    {.name = "output-len", .type = T::kText, .commands = kBench, .help = "max tokens per request", .value = "N|A:B",
     .fallback = "128"},
    {.name = "shared-prefix", .type = T::kInt, .commands = kBench,
     .help = "each prompt's first LEN tokens (of --input-len) are one of --prefix-groups shared prefixes",
     .value = "LEN", .lo = 0, .hi = 1'000'000, .fallback = "0"},
    {.name = "prefix-groups", .type = T::kInt, .commands = kBench, .help = "shared prefixes", .value = "G", .lo = 1,
     .hi = 1'000'000, .fallback = "1"},
    {.name = "dataset", .type = T::kText, .commands = kBench,
     .help = "one request per line: \"prompt\" or \"prompt_tokens\", \"output_len\"", .value = "FILE.jsonl"},
    {.name = "cancel-fraction", .type = T::kReal, .commands = kBench,
     .help = "share of requests cancelled after --cancel-after K tokens", .value = "F", .fallback = "0"},
    {.name = "cancel-after", .type = T::kInt, .commands = kBench, .help = "tokens before a cancellation", .value = "K",
     .lo = 1, .hi = 10'000'000, .fallback = "1"},
    {.name = "slo-ttft-ms", .type = T::kReal, .commands = kBench,
     .help = "goodput: completed requests within this time to first token, per second", .value = "MS"},
    {.name = "slo-tpot-ms", .type = T::kReal, .commands = kBench,
     .help = "goodput: and within this time per output token", .value = "MS"},
    {.name = "out", .type = T::kText, .commands = kBench, .help = "summary and per-request records", .value = "FILE.json"},
    {.name = "sweep-concurrency", .type = T::kText, .commands = kBench, .help = "one run per point, one JSON",
     .value = "c1,c2,..."},
    {.name = "sweep-rate", .type = T::kText, .commands = kBench, .help = "one run per point, one JSON",
     .value = "r1,r2,..."},
    {.name = "plot", .type = T::kText, .commands = kBench,
     .help = "TTFT/ITL distributions and throughput (needs gnuplot on PATH)", .value = "FILE.png"},
    {.name = "json", .type = T::kSwitch, .commands = kRun | kGenerate | kStatus,
     .help = "JSON output (run: one line {\"tokens\":[...],\"logprobs\":[...]}; generate: one object per event)"},

    // The benches.
    {.name = "kv", .type = T::kSwitch, .commands = kEngineBench, .help = "run only the KV section"},
    {.name = "kv-threads", .type = T::kInt, .commands = kEngineBench, .help = "threads of the KV section", .lo = 1,
     .hi = 256, .fallback = "2"},
    {.name = "kv-rounds", .type = T::kInt, .commands = kEngineBench, .help = "rounds of the KV section", .lo = 1,
     .hi = 1'000'000, .fallback = "40"},
    {.name = "streams", .type = T::kIntList, .commands = kServeBench, .help = "concurrent streams, one run each",
     .value = "1,4,16,32", .lo = 1, .hi = 1'000'000, .fallback = "1,4,16,32"},
    {.name = "prompt", .type = T::kInt, .commands = kServeBench, .help = "prompt tokens", .lo = 1, .hi = 1 << 20,
     .fallback = "128"},
    {.name = "output", .type = T::kInt, .commands = kServeBench, .help = "output tokens", .lo = 1, .hi = 1 << 20,
     .fallback = "128"},
    {.name = "threads", .type = T::kInt, .commands = kServeBench, .help = "compute threads", .lo = 1, .hi = 256,
     .fallback = "2"},
    {.name = "tiny-streams", .type = T::kInt, .commands = kServeBench, .help = "streams of the tiny-preset run", .lo = 1,
     .hi = 1'000'000, .fallback = "64"},
    {.name = "positions", .type = T::kInt, .commands = kDisaggBench, .help = "KV positions per transfer", .lo = 1,
     .hi = 1 << 20, .fallback = "1024"},
    {.name = "reps", .type = T::kInt, .commands = kDisaggBench, .help = "transfers measured", .lo = 1, .hi = 1'000'000,
     .fallback = "5"},
    {.name = "steady", .type = T::kInt, .commands = kDisaggBench, .help = "steady streams decoding", .lo = 1,
     .hi = 100'000, .fallback = "8"},
    {.name = "long", .type = T::kInt, .commands = kDisaggBench, .help = "long prompts arriving", .lo = 0, .hi = 100'000,
     .fallback = "4"},
    {.name = "long-len", .type = T::kInt, .commands = kDisaggBench, .help = "tokens of a long prompt", .lo = 1,
     .hi = 1 << 20, .fallback = "1024"},
    {.name = "gap-ms", .type = T::kInt, .commands = kDisaggBench, .help = "between long prompts", .value = "MS", .lo = 0,
     .hi = 3'600'000, .fallback = "3000"},
    {.name = "skip-mixed", .type = T::kSwitch, .commands = kDisaggBench, .help = "only the transfer throughput"},

    // Tests only.
    {.name = "test-step-delay-ms", .type = T::kInt, .commands = kWorkerSetting,
     .help = "tests only: sleep before each step, as a slower machine", .value = "MS", .lo = 0, .hi = 10000,
     .fallback = "0", .section = S::kWorkers, .toml_key = "test_step_delay_ms", .test_only = true},

    {.name = "help", .type = T::kSwitch, .commands = kTandem, .help = "this text"},
};

std::string placeholder(const Flag& f) {
  if (!f.value.empty()) return std::string(f.value);
  switch (f.type) {
    case FlagType::kChoice: return std::string(f.choices);
    case FlagType::kInt: return "N";
    case FlagType::kReal: return "X";
    case FlagType::kIntList: return "N,N,...";
    case FlagType::kSwitch: return "";
    default: return "S";
  }
}

}  // namespace

std::span<const Flag> flag_table() { return kFlags; }

const Flag* find_flag(std::string_view name, Command command) {
  if (name.empty()) return nullptr;
  for (const Flag& f : kFlags)
    if (f.name == name && (f.commands & command)) return &f;
  return nullptr;
}

const Flag* find_toml_key(Section section, std::string_view key) {
  for (const Flag& f : kFlags)
    if (f.section == section && f.toml_key == key) return &f;
  return nullptr;
}

std::string choices_text(std::string_view choices) {
  std::string out;
  size_t count = 0;
  for (char c : choices) count += c == '|';
  size_t seen = 0;
  for (char c : choices) {
    if (c != '|') {
      out += c;
    } else {
      out += ++seen == count ? " or " : ", ";
    }
  }
  return out;
}

std::string_view section_name(Section section) {
  switch (section) {
    case Section::kScheduler: return "scheduler";
    case Section::kSupervisor: return "supervisor";
    case Section::kWorkers: return "workers";
    default: return "";
  }
}

std::string help_text(Command command, std::string_view usage, std::string_view notes) {
  std::string out(usage);
  if (!out.empty() && out.back() != '\n') out += '\n';
  for (bool test_only : {false, true}) {
    for (const Flag& f : kFlags) {
      if (!(f.commands & command) || f.test_only != test_only) continue;
      std::string line = "  --" + std::string(f.name);
      if (f.type != FlagType::kSwitch) line += " " + placeholder(f);
      if (line.size() < 28) line.resize(28, ' ');
      else line += "\n" + std::string(28, ' ');
      std::string help(f.help);
      if (!f.fallback.empty()) help += (help.empty() ? "default " : " (default ") + std::string(f.fallback) + (help.empty() ? "" : ")");
      for (size_t at; (at = help.find('\n')) != std::string::npos;) {
        line += help.substr(0, at) + "\n" + std::string(28, ' ');
        help.erase(0, at + 1);
      }
      out += line + help + "\n";
    }
  }
  out += notes;
  if (!notes.empty() && out.back() != '\n') out += '\n';
  return out;
}

}  // namespace tandem::cli
