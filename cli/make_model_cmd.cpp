// tandem make-model: deterministic random GGUF files (llama, qwen2, qwen3, qwen35) for tests and benchmarks,
// in any type tandem writes, with the byte-level vocabulary or (--vocab-from) a real one; or (--from)
// an existing F32/F16/BF16 GGUF quantized as llama-quantize does.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "model/make_model.h"
#include "model/quantize.h"

namespace tandem::cli {

namespace {

constexpr const char* kUsage =
    "usage: tandem make-model --preset tiny|small [flags] --out FILE\n"
    "       tandem make-model --vocab-from VOCAB.gguf|tokenizer.json [--pre NAME] [flags] --out FILE\n"
    "       tandem make-model --from IN.gguf --dtype TYPE --out FILE   (as llama-quantize IN FILE TYPE)\n"
    "       tandem make-model --vocab-from VOCAB --script-file TEXT [--script-after TEXT] --out FILE   (a test\n"
    "         fixture whose greedy output is TEXT's text: model/make_model.h)";

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
  const int64_t preset_head = c.key_length ? c.key_length : natural;  // a hybrid preset sets its own
  auto head_dim = args.integer(
      "head-dim", c.arch->norm == model::NormVariant::kRmsQkNorm && !c.key_length ? 2 * natural : preset_head);
  if (!head_dim) return head_dim.status();
  if (*head_dim != natural || c.dim % c.n_heads != 0) c.key_length = static_cast<uint32_t>(*head_dim);
  if (args.has("sliding-window")) {
    if (c.arch->swa_pattern == 0)
      return Status::invalid("--sliding-window: architecture '" + *arch + "' has no sliding-window layers");
    auto window = args.integer("sliding-window", c.sliding_window);
    if (!window) return window.status();
    c.sliding_window = static_cast<uint32_t>(*window);
  }
  if (auto spec = args.str("rope-scaling")) return apply_rope_scaling(*spec, c, llama3);
  return Status::ok();
}

// --vocab-from FILE (with --tokenizer-config and --pre for a tokenizer.json): the real
// vocabulary the model gets instead of the byte-level one; nullopt without --vocab-from.
Result<std::optional<model::VocabularyKeys>> vocabulary_flags(const Args& args) {
  auto from = args.str("vocab-from");
  if (!from) {
    if (args.has("pre") || args.has("tokenizer-config"))
      return Status::invalid("--pre and --tokenizer-config go with --vocab-from tokenizer.json");
    return std::optional<model::VocabularyKeys>();
  }
  auto keys = model::read_vocabulary({*from, args.str("tokenizer-config").value_or(""), args.str("pre").value_or("")});
  if (!keys) return keys.status();
  return std::optional<model::VocabularyKeys>(std::move(*keys));
}

// --script-file: the tiny preset's shape (one layer, --arch, --context, default 4096) with the
// scripted weights of model/make_model.h for --vocab-from's vocabulary. The vocabulary's tokenizer
// is read back from a metadata-only file beside `out` to spell the script.
Status write_scripted(const Args& args, const std::string& out, model::FileType type) {
  if (type != model::FileType::kF16 && type != model::FileType::kF32)
    return Status::invalid("--script-file writes F16 matrices; it takes no --dtype");
  auto vocab = vocabulary_flags(args);
  if (!vocab) return vocab.status();
  if (!*vocab) return Status::invalid("--script-file needs --vocab-from (a real vocabulary to spell the script with)");
  const std::string script_path = *args.str("script-file");
  std::ifstream in(script_path, std::ios::binary);
  if (!in) return Status::invalid("--script-file: cannot read " + script_path);
  const std::string script((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string vocab_file = out + ".vocab.tmp." + std::to_string(getpid());
  model::GgufWriter w;
  for (const auto& [key, value] : (*vocab)->keys) w.add_value(key, value);
  Status st = w.write(vocab_file);
  auto file = st ? model::GgufFile::open(vocab_file) : Result<std::unique_ptr<model::GgufFile>>(st);
  std::remove(vocab_file.c_str());
  if (!file) return file.status();
  auto tokenizer = model::Tokenizer::from_gguf(**file);
  if (!tokenizer) return tokenizer.status();
  const std::string after = args.str("script-after").value_or("<|im_start|>assistant\n");
  auto avoid = tokenizer->encode(after, model::EncodeOptions{.add_special = false, .parse_special = true});
  if (!avoid) return avoid.status();
  auto chain = model::spell_without_repeats(*tokenizer, script, *avoid);
  if (!chain) return chain.status();
  if (tokenizer->eos_id() < 0) return Status::invalid("--script-file: the vocabulary has no end token");
  chain->push_back(tokenizer->eos_id());
  auto config = model::preset_config("tiny");
  if (!config) return config.status();
  config->n_layers = 1;
  config->context_length = 4096;
  std::optional<model::Llama3Rope> llama3;
  TANDEM_RETURN_IF_ERROR(apply_shape_flags(args, *config, llama3));
  config->name = "tandem-scripted";
  return model::make_scripted_model(*config, *chain, out, **vocab);
}

// A preset's random weights: written directly as F32 or F16; any other type is the F32 file
// quantized as llama-quantize would (through a temporary file beside `out`).
Status write_preset(const Args& args, const std::string& out, model::FileType type) {
  auto seed = args.integer("seed", 1);
  if (!seed) return seed.status();
  auto arch = args.choice("arch", "llama");
  if (!arch) return arch.status();
  auto config = model::preset_config(args.str("preset").value_or("tiny"), *arch);
  if (!config) return config.status();
  config->tied_embeddings = config->tied_embeddings || args.has("tied");  // Gemma presets are tied
  std::optional<model::Llama3Rope> llama3;
  TANDEM_RETURN_IF_ERROR(apply_shape_flags(args, *config, llama3));
  auto vocab = vocabulary_flags(args);
  if (!vocab) return vocab.status();
  const model::VocabularyKeys* keys = *vocab ? &**vocab : nullptr;
  if (keys != nullptr) config->vocab_size = keys->size;
  if (type == model::FileType::kF32 || type == model::FileType::kF16) {
    const auto weights = type == model::FileType::kF16 ? model::TensorType::kF16 : model::TensorType::kF32;
    return model::make_model(*config, static_cast<uint64_t>(*seed), out, weights, llama3, keys);
  }
  const std::string f32 = out + ".f32.tmp." + std::to_string(getpid());
  Status st = model::make_model(*config, static_cast<uint64_t>(*seed), f32, model::TensorType::kF32, llama3, keys);
  if (st) st = model::quantize_model(f32, out, type);
  std::remove(f32.c_str());
  return st;
}

// With --split-max-tensors N: `written` (a complete file) split into parts named after `out`
// (NAME.gguf: NAME-00001-of-0000K.gguf ...), then removed; prints the parts. The summary line
// after it still names --out, the split model's name.
Status split_output(const Args& args, const std::string& written, const std::string& out) {
  auto max_tensors = args.integer("split-max-tensors", 0);
  if (!max_tensors) return max_tensors.status();
  std::string prefix = out;
  if (prefix.size() > 5 && prefix.compare(prefix.size() - 5, 5, ".gguf") == 0) prefix.resize(prefix.size() - 5);
  auto parts = model::split_gguf(written, prefix, static_cast<uint64_t>(*max_tensors));
  std::remove(written.c_str());
  if (!parts) return parts.status();
  for (const std::string& part : *parts) std::fprintf(stderr, "tandem make-model: wrote part %s\n", part.c_str());
  return Status::ok();
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
  const bool split = args->has("split-max-tensors");
  const std::string written = split ? *out + ".whole.tmp." + std::to_string(getpid()) : *out;
  if (auto from = args->str("from")) {
    if (args->has("preset") || args->has("seed") || args->has("tied") || args->has("arch") || args->has("context") ||
        args->has("head-dim") || args->has("rope-scaling") || args->has("vocab-from")) {
      return fail("make-model", Status::invalid("--from quantizes a file: it takes no --preset, --seed, --tied, --arch,"
                                                " --context, --head-dim, --rope-scaling or --vocab-from"));
    }
    if (Status st = model::quantize_model(*from, written, type); !st) return fail("make-model", st);
    if (Status st = split ? split_output(*args, written, *out) : Status::ok(); !st) return fail("make-model", st);
    std::fprintf(stderr, "tandem make-model: wrote %s (%s as %s)\n", out->c_str(), from->c_str(), dtype->c_str());
    return 0;
  }
  const bool scripted = args->has("script-file");
  if (Status st = scripted ? write_scripted(*args, written, type) : write_preset(*args, written, type); !st)
    return fail("make-model", st);
  if (Status st = split ? split_output(*args, written, *out) : Status::ok(); !st) return fail("make-model", st);
  if (scripted) {
    std::fprintf(stderr, "tandem make-model: wrote %s (scripted: %s)\n", out->c_str(),
                 args->str("script-file")->c_str());
  } else {
    std::fprintf(stderr, "tandem make-model: wrote %s (%s, %s, seed %s)\n", out->c_str(),
                 args->str("preset").value_or("tiny").c_str(), dtype->c_str(), args->str("seed").value_or("1").c_str());
  }
  return 0;
}

}  // namespace tandem::cli
