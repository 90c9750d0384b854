// tandem make-model: deterministic random GGUF files (llama, qwen2, qwen3) for tests and benchmarks.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "model/make_model.h"

namespace tandem::cli {

namespace {

// --rope-scaling: "linear:F", "yarn:F[:N]" set the config's rope.scaling keys; "llama3[:F[:N]]"
// asks for rope_freqs.weight. Leaves both untouched on error.
Status apply_rope_scaling(const std::string& spec, model::ModelConfig& c, std::optional<model::Llama3Rope>& llama3) {
  std::vector<std::string> parts;
  for (size_t from = 0;;) {
    const size_t colon = spec.find(':', from);
    parts.push_back(spec.substr(from, colon - from));
    if (colon == std::string::npos) break;
    from = colon + 1;
  }
  auto bad = [&] {
    return Status::invalid(
        "--rope-scaling: '" + spec +
        "' is not linear:FACTOR, yarn:FACTOR[:ORIGINAL_CONTEXT] or llama3[:FACTOR[:ORIGINAL_CONTEXT]]");
  };
  double factor = 0;
  uint64_t original = 0;
  if (parts.size() > 1) {
    char* end = nullptr;
    factor = std::strtod(parts[1].c_str(), &end);
    if (parts[1].empty() || *end != '\0' || !(factor > 0) || factor > 1e6) return bad();
  }
  if (parts.size() > 2) {
    char* end = nullptr;
    original = std::strtoull(parts[2].c_str(), &end, 10);
    if (parts[2].empty() || *end != '\0' || original == 0 || original > (1u << 24)) return bad();
  }
  const std::string& kind = parts[0];
  if (parts.size() > 3 || ((kind == "linear" || kind == "yarn") && parts.size() < 2)) return bad();
  if (kind == "linear" && parts.size() == 2) {
    c.rope_scaling = model::RopeScaling::kLinear;
  } else if (kind == "yarn") {
    c.rope_scaling = model::RopeScaling::kYarn;
    c.rope_original_context = static_cast<uint32_t>(original);
  } else if (kind == "llama3") {
    llama3.emplace();
    if (factor > 0) llama3->factor = factor;
    if (original > 0) llama3->original_context = static_cast<uint32_t>(original);
    return Status::ok();
  } else {
    return bad();
  }
  c.rope_scaling_factor = static_cast<float>(factor);
  return Status::ok();
}

// The preset's shape with --arch, --context, --head-dim and --rope-scaling laid over it.
Status apply_shape_flags(const Args& args, model::ModelConfig& c, std::optional<model::Llama3Rope>& llama3) {
  auto arch = args.choice("arch", "llama");
  if (!arch) return arch.status();
  c.arch = model::find_architecture(*arch);
  auto context = args.integer("context", c.context_length);
  if (!context) return context.status();
  c.context_length = static_cast<uint32_t>(*context);
  const int64_t natural = c.dim / c.n_heads;
  auto head_dim = args.integer("head-dim", c.arch->norm == model::NormVariant::kRmsQkNorm ? 2 * natural : natural);
  if (!head_dim) return head_dim.status();
  if (*head_dim != natural || c.dim % c.n_heads != 0) c.key_length = static_cast<uint32_t>(*head_dim);
  if (auto spec = args.str("rope-scaling")) return apply_rope_scaling(*spec, c, llama3);
  return Status::ok();
}

}  // namespace

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
  std::optional<model::Llama3Rope> llama3;
  if (Status st = apply_shape_flags(*args, *config, llama3); !st) return fail("make-model", st);
  const auto type = dtype == "f16" ? model::TensorType::kF16 : model::TensorType::kF32;
  if (Status st = model::make_model(*config, static_cast<uint64_t>(*seed), *out, type, llama3); !st)
    return fail("make-model", st);
  std::fprintf(stderr, "tandem make-model: wrote %s (%s, %s, seed %lld)\n", out->c_str(), config->name.c_str(),
               std::string(config->arch->name).c_str(), static_cast<long long>(*seed));
  return 0;
}

}  // namespace tandem::cli
