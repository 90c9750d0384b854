// tandem make-model: deterministic random Llama GGUF files for tests and benchmarks.
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "model/make_model.h"

namespace tandem::cli {

int make_model_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, kMakeModel);
  if (!args) return fail("make-model", args.status());
  if (args->has("help")) {
    std::fputs(help_text(kMakeModel, "usage: tandem make-model --preset tiny|small [flags] --out FILE").c_str(),
               stdout);
    return 0;
  }
  auto out = args->str("out");
  if (!out) return fail("make-model", Status::invalid("--out FILE is required"));
  auto seed = args->integer("seed", 1);
  if (!seed) return fail("make-model", seed.status());
  auto config = model::preset_config(args->str("preset").value_or("tiny"));
  if (!config) return fail("make-model", config.status());
  auto dtype_flag = args->choice("dtype", "f32");
  if (!dtype_flag) return fail("make-model", dtype_flag.status());
  const std::string dtype = *dtype_flag;
  config->tied_embeddings = args->has("tied");
  const auto type = dtype == "f16" ? model::TensorType::kF16 : model::TensorType::kF32;
  if (Status st = model::make_model(*config, static_cast<uint64_t>(*seed), *out, type); !st)
    return fail("make-model", st);
  std::fprintf(stderr, "tandem make-model: wrote %s (%s, seed %lld)\n", out->c_str(), config->name.c_str(),
               static_cast<long long>(*seed));
  return 0;
}

}  // namespace tandem::cli
