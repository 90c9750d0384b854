// tandem run: the engine in-process, no service. How a user checks a model file, and the
// reference the service's streams are compared with.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/args.h"
#include "cli/chat_prompt.h"
#include "cli/commands.h"
#include "cli/kv_format_flags.h"
#include "cli/sampling_flags.h"
#include "runtime/utf8.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"
#include "workers/draft_model.h"
#include "workers/speculation.h"

namespace tandem::cli {

namespace {

constexpr const char* kUsage =
    "usage: tandem run --model FILE (--prompt TEXT | --tokens 1,2,3) [flags]\n"
    "       tandem run --model FILE --chat [--system TEXT] --prompt TEXT [flags]";

// The generation and engine options the flags give.
Status options_from_flags(const Args& args, engine::GenerateOptions& opt, engine::EngineOptions& eopt,
                          std::string& draft_model) {
  auto max_tokens = args.integer("max-tokens", 32);
  auto threads = args.integer("threads", 2);
  auto chunk = args.integer("chunk", 512);
  auto sampling = sampling_from_flags(args);
  for (const Status* st : {&max_tokens.status(), &threads.status(), &chunk.status(), &sampling.status()})
    if (!st->is_ok()) return *st;
  opt.max_tokens = static_cast<uint32_t>(*max_tokens);
  opt.prefill_chunk = static_cast<uint32_t>(*chunk);
  opt.ignore_eos = args.has("ignore-eos");
  opt.rings = args.has("kv-rings");
  auto kv_format = kv_format_from_flags(args);
  if (!kv_format) return kv_format.status();
  opt.kv_format = *kv_format;
  auto spec = spec_from_flags(args);
  if (!spec) return spec.status();
  opt.spec_tokens = spec->spec_tokens;
  draft_model = spec->draft_model;
  opt.sampling = std::move(sampling.value());
  TANDEM_RETURN_IF_ERROR(engine::validate(opt.sampling));
  eopt.threads = static_cast<uint32_t>(*threads);
  auto gemm = gemm_from_flags(args);
  if (!gemm) return gemm.status();
  eopt.gemm = *gemm;
  return Status::ok();
}

// The prompt's token ids: --tokens, --prompt encoded, or --chat's rendered conversation.
Result<std::vector<int32_t>> prompt_from_flags(const Args& args, const engine::Engine& e, const std::string& model) {
  if (args.has("chat")) return chat_prompt_from_flags(args, model);
  if (auto text = args.str("prompt")) return e.tokenizer().encode(*text, !args.has("no-bos"));
  return args.int_list("tokens");
}

}  // namespace

int run_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, kRun);
  if (!args) return fail("run", args.status());
  if (args->has("help")) {
    std::fputs(help_text(kRun, kUsage).c_str(), stdout);
    return 0;
  }
  auto model = args->str("model");
  if (!model) return fail("run", Status::invalid("--model FILE is required"));
  if (args->has("prompt") == args->has("tokens"))
    return fail("run", Status::invalid("give exactly one of --prompt or --tokens"));

  if (Status st = check_chat_flags(*args); !st) return fail("run", st);
  engine::GenerateOptions opt;
  engine::EngineOptions eopt;
  std::string draft_path;
  if (Status st = options_from_flags(*args, opt, eopt, draft_path); !st) return fail("run", st);

  auto eng = engine::Engine::load(*model, eopt);
  if (!eng) return fail("run", eng.status());
  engine::Engine& e = **eng;
  if (Status st = model::validate_logit_bias_ids(opt.sampling, e.config().vocab_size); !st) return fail("run", st);

  auto prompt_ids = prompt_from_flags(*args, e, *model);
  if (!prompt_ids) return fail("run", prompt_ids.status());
  const std::vector<int32_t> prompt = std::move(prompt_ids.value());

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
  workers::NgramDrafter ngram(std::max(opt.spec_tokens, 1u));
  std::unique_ptr<workers::DraftModel> draft_model;
  std::unique_ptr<workers::ModelDrafter> model_drafter;
  if (!draft_path.empty()) {
    auto loaded = workers::DraftModel::load(draft_path, eopt, e);
    if (!loaded) return fail("run", loaded.status());
    draft_model = std::move(loaded.value());
    const uint32_t context = e.config().context_length;
    if (Status st = draft_model->make_pool((context + 15) / 16, 16); !st) return fail("run", st);
    model_drafter = std::make_unique<workers::ModelDrafter>(*draft_model, opt.spec_tokens, context);
    model_drafter->set_sampling(&opt.sampling, static_cast<uint32_t>(prompt.size()));
  }
  if (opt.spec_tokens > 0) opt.drafter = model_drafter ? static_cast<engine::Drafter*>(model_drafter.get()) : &ngram;
  auto gen = engine::generate(e, prompt, opt, on_token);
  if (!gen) return fail("run", gen.status());

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
  std::fprintf(stderr,
               "tandem run: %zu prompt tokens in %.3f s (%.1f tokens/s), %zu generated, decode %.1f tokens/s, %s\n",
               prompt.size(), gen->prefill_seconds, prompt.size() / gen->prefill_seconds, gen->tokens.size(),
               decode_tps, gen->stopped_by_eos ? "stopped at end of generation" : "reached max tokens");
  if (opt.drafter && gen->decode_steps > 0)
    std::fprintf(stderr, "tandem run: speculation: %.2f tokens per decode step\n",
                 double(gen->tokens.size() - 1) / gen->decode_steps);
  return 0;
}

}  // namespace tandem::cli
