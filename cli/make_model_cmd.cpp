// tandem make-model: deterministic random Llama GGUF files for tests and benchmarks, in any type
// tandem writes; or (--from) an existing F32/F16/BF16 GGUF quantized as llama-quantize does.
#include <unistd.h>

#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "model/make_model.h"
#include "model/quantize.h"

namespace tandem::cli {

namespace {

constexpr const char* kUsage =
    "usage: tandem make-model --preset tiny|small [flags] --out FILE\n"
    "       tandem make-model --from IN.gguf --dtype TYPE --out FILE   (as llama-quantize IN FILE TYPE)";

// A preset's random weights: written directly as F32 or F16; any other type is the F32 file
// quantized as llama-quantize would (through a temporary file beside `out`).
Status write_preset(const Args& args, const std::string& out, model::FileType type) {
  auto seed = args.integer("seed", 1);
  if (!seed) return seed.status();
  auto config = model::preset_config(args.str("preset").value_or("tiny"));
  if (!config) return config.status();
  config->tied_embeddings = args.has("tied");
  if (type == model::FileType::kF32 || type == model::FileType::kF16) {
    const auto weights = type == model::FileType::kF16 ? model::TensorType::kF16 : model::TensorType::kF32;
    return model::make_model(*config, static_cast<uint64_t>(*seed), out, weights);
  }
  const std::string f32 = out + ".f32.tmp." + std::to_string(getpid());
  Status st = model::make_model(*config, static_cast<uint64_t>(*seed), f32, model::TensorType::kF32);
  if (st) st = model::quantize_model(f32, out, type);
  std::remove(f32.c_str());
  return st;
}

}  // namespace

int make_model_command(int argc, char** argv) {
  auto args = Args::parse(argc, argv, kMakeModel);
  if (!args) return fail("make-model", args.status());
  if (args->has("help")) {
    std::fputs(help_text(kMakeModel, kUsage).c_str(), stdout);
    return 0;
  }
  auto out = args->str("out");
  if (!out) return fail("make-model", Status::invalid("--out FILE is required"));
  auto dtype = args->choice("dtype", "f32");
  if (!dtype) return fail("make-model", dtype.status());
  const model::FileType type = *model::parse_file_type(*dtype);  // the flag's choices are the parser's names
  if (auto from = args->str("from")) {
    if (args->has("preset") || args->has("seed") || args->has("tied")) {
      return fail("make-model", Status::invalid("--from quantizes a file: it takes no --preset, --seed or --tied"));
    }
    if (Status st = model::quantize_model(*from, *out, type); !st) return fail("make-model", st);
    std::fprintf(stderr, "tandem make-model: wrote %s (%s as %s)\n", out->c_str(), from->c_str(), dtype->c_str());
    return 0;
  }
  if (Status st = write_preset(*args, *out, type); !st) return fail("make-model", st);
  std::fprintf(stderr, "tandem make-model: wrote %s (%s, %s, seed %s)\n", out->c_str(),
               args->str("preset").value_or("tiny").c_str(), dtype->c_str(), args->str("seed").value_or("1").c_str());
  return 0;
}

}  // namespace tandem::cli
