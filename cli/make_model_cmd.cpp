// tandem make-model: deterministic random Llama GGUF files for tests and benchmarks.
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "model/make_model.h"

namespace tandem::cli {

int make_model_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {"preset", "seed", "out", "dtype"}, {"tied", "help"});
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "tandem make-model: %s\n", st.to_string().c_str());
    return st.code() == Code::kInvalidArgument ? 2 : 1;
  };
  if (!args) return fail(args.status());
  if (args->has("help")) {
    std::puts("usage: tandem make-model --preset tiny|small [--seed N] [--dtype f32|f16] [--tied] --out FILE\n"
              "  --dtype f16  matrices and embeddings in half precision (norms stay F32)\n"
              "  --tied       no output.weight: the LM head reuses token_embd.weight");
    return 0;
  }
  auto out = args->str("out");
  if (!out) return fail(Status::invalid("--out FILE is required"));
  auto seed = args->integer("seed", 1, 0, INT64_MAX);
  if (!seed) return fail(seed.status());
  auto config = model::preset_config(args->str("preset").value_or("tiny"));
  if (!config) return fail(config.status());
  const std::string dtype = args->str("dtype").value_or("f32");
  if (dtype != "f32" && dtype != "f16") return fail(Status::invalid("--dtype must be f32 or f16, got '" + dtype + "'"));
  config->tied_embeddings = args->has("tied");
  const auto type = dtype == "f16" ? model::TensorType::kF16 : model::TensorType::kF32;
  if (Status st = model::make_model(*config, static_cast<uint64_t>(*seed), *out, type); !st) return fail(st);
  std::fprintf(stderr, "tandem make-model: wrote %s (%s, seed %lld)\n", out->c_str(), config->name.c_str(),
               static_cast<long long>(*seed));
  return 0;
}

}  // namespace tandem::cli
