// tandem run: the engine in-process, no service. How a user checks a model file, and the
// reference the service's streams are compared with.
#include <cstdio>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/kv_format_flags.h"
#include "runtime/utf8.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"

namespace tandem::cli {

namespace {

constexpr const char* kHelp =
    "usage: tandem run --model FILE (--prompt TEXT | --tokens 1,2,3) [flags]\n"
    "  --max-tokens N         tokens to generate (default 32)\n"
    "  --temperature T        0 = greedy (default 0)\n"
    "  --top-k K --top-p P --min-p P --repetition-penalty R --seed S\n"
    "  --ignore-eos           keep going past the end-of-sequence token\n"
    "  --no-bos               do not prepend BOS to a text prompt\n"
    "  --threads N            compute threads (default 2)\n"
    "  --gemm packed|openblas matrix kernels (default packed: batch-invariant)\n"
    "  --chunk N              prompt tokens per forward pass (default 512)\n"
    "  --json                 print one line {\"tokens\":[...],\"logprobs\":[...]}\n";

int fail(const Status& st) {
  std::fprintf(stderr, "tandem run: %s\n", st.to_string().c_str());
  return st.code() == Code::kInvalidArgument ? 2 : 1;
}

}  // namespace

int run_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv,
                          {"model", "prompt", "tokens", "max-tokens", "temperature", "top-k", "top-p", "min-p",
                           "repetition-penalty", "seed", "threads", "gemm", "chunk", "kv-bits", "kv-group-size",
                           "kv-f32-window"},
                          {"ignore-eos", "json", "no-bos", "help", "kv-quant-skip-last-layer"});
  if (!args) return fail(args.status());
  if (args->has("help")) {
    std::fputs(kHelp, stdout);
    std::fputs(kKvFormatHelp, stdout);
    return 0;
  }
  auto model = args->str("model");
  if (!model) return fail(Status::invalid("--model FILE is required"));
  if (args->has("prompt") == args->has("tokens")) return fail(Status::invalid("give exactly one of --prompt or --tokens"));

  engine::GenerateOptions opt;
  engine::EngineOptions eopt;
  auto max_tokens = args->integer("max-tokens", 32, 1, 1 << 20);
  auto top_k = args->integer("top-k", 0, 0, 1 << 30);
  auto seed = args->integer("seed", 0, 0, INT64_MAX);
  auto threads = args->integer("threads", 2, 1, 256);
  auto chunk = args->integer("chunk", 512, 1, 1 << 20);
  auto temperature = args->real("temperature", 0.0);
  auto top_p = args->real("top-p", 1.0);
  auto min_p = args->real("min-p", 0.0);
  auto penalty = args->real("repetition-penalty", 1.0);
  for (const Status* st : {&max_tokens.status(), &top_k.status(), &seed.status(), &threads.status(), &chunk.status(),
                           &temperature.status(), &top_p.status(), &min_p.status(), &penalty.status()})
    if (!st->is_ok()) return fail(*st);
  opt.max_tokens = static_cast<uint32_t>(*max_tokens);
  opt.prefill_chunk = static_cast<uint32_t>(*chunk);
  opt.ignore_eos = args->has("ignore-eos");
  auto kv_format = kv_format_from_flags(*args);
  if (!kv_format) return fail(kv_format.status());
  opt.kv_format = *kv_format;
  opt.sampling.temperature = static_cast<float>(*temperature);
  opt.sampling.top_k = static_cast<int32_t>(*top_k);
  opt.sampling.top_p = static_cast<float>(*top_p);
  opt.sampling.min_p = static_cast<float>(*min_p);
  opt.sampling.repetition_penalty = static_cast<float>(*penalty);
  opt.sampling.seed = static_cast<uint64_t>(*seed);
  if (Status st = engine::validate(opt.sampling); !st) return fail(st);
  eopt.threads = static_cast<uint32_t>(*threads);
  const std::string gemm = args->str("gemm").value_or("packed");
  if (gemm == "openblas") {
    eopt.gemm = engine::GemmBackend::kOpenBlas;
  } else if (gemm != "packed") {
    return fail(Status::invalid("--gemm must be packed or openblas, got '" + gemm + "'"));
  }

  auto eng = engine::Engine::load(*model, eopt);
  if (!eng) return fail(eng.status());
  engine::Engine& e = **eng;

  std::vector<int32_t> prompt;
  if (auto text = args->str("prompt")) {
    auto ids = e.tokenizer().encode(*text, !args->has("no-bos"));
    if (!ids) return fail(ids.status());
    prompt = std::move(ids.value());
  } else {
    auto ids = args->int_list("tokens");
    if (!ids) return fail(ids.status());
    prompt = std::move(ids.value());
  }

  const bool json = args->has("json");
  std::string pending;  // bytes not yet printed: an incomplete UTF-8 character stays here
  auto on_token = [&](int32_t token, float) {
    if (json) return;
    e.tokenizer().append_token_bytes(token, pending);
    // Hold back a trailing incomplete UTF-8 character until its last byte arrives.
    const size_t cut = runtime::utf8_releasable_prefix(pending);
    std::fwrite(pending.data(), 1, cut, stdout);
    std::fflush(stdout);
    pending.erase(0, cut);
  };
  auto gen = engine::generate(e, prompt, opt, on_token);
  if (!gen) return fail(gen.status());

  if (json) {
    std::string out = "{\"tokens\":[";
    for (size_t i = 0; i < gen->tokens.size(); ++i) out += (i ? "," : "") + std::to_string(gen->tokens[i]);
    out += "],\"logprobs\":[";
    char buf[32];
    for (size_t i = 0; i < gen->logprobs.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%s%.6g", i ? "," : "", gen->logprobs[i]);
      out += buf;
    }
    out += "]}\n";
    std::fputs(out.c_str(), stdout);
  } else {
    std::fwrite(pending.data(), 1, pending.size(), stdout);
    std::fputs("\n", stdout);
  }
  const double decode_tps = gen->tokens.size() > 1 ? (gen->tokens.size() - 1) / gen->decode_seconds : 0.0;
  std::fprintf(stderr, "tandem run: %zu prompt tokens in %.3f s (%.1f tokens/s), %zu generated, decode %.1f tokens/s, %s\n",
               prompt.size(), gen->prefill_seconds, prompt.size() / gen->prefill_seconds, gen->tokens.size(),
               decode_tps, gen->stopped_by_eos ? "stopped at EOS" : "reached max tokens");
  return 0;
}

}  // namespace tandem::cli
