#include "model/model_config.h"

#include <algorithm>
#include <cstdio>

#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace tandem::model {

namespace {

class Checker {
 public:
  explicit Checker(const GgufFile& file) : file_(file) {}

  Status fail(const std::string& problem) const { return Status::model_file(file_.path() + ": " + problem); }

  // A required (or, with fallback, optional) positive integer key no larger than max.
  Status read_uint(const std::string& key, uint64_t max, uint32_t& out,
                   std::optional<uint32_t> fallback = std::nullopt) const {
    const GgufValue* v = file_.find(key);
    if (!v) {
      if (fallback) {
        out = *fallback;
        return Status::ok();
      }
      return fail("missing key " + key);
    }
    std::optional<uint64_t> x = file_.get_uint(key);
    if (!x) return fail("key " + key + " is not a non-negative integer");
    if (*x == 0 || *x > max) {
      return fail(key + " " + std::to_string(*x) + " is out of range (1 to " + std::to_string(max) + ")");
    }
    out = static_cast<uint32_t>(*x);
    return Status::ok();
  }

  Status read_float(const std::string& key, float fallback, float& out) const {
    const GgufValue* v = file_.find(key);
    if (!v) {
      out = fallback;
      return Status::ok();
    }
    std::optional<double> x = file_.get_float(key);
    if (!x) return fail("key " + key + " is not a float");
    if (!std::isfinite(*x) || *x <= 0) return fail(key + " " + std::to_string(*x) + " must be positive");
    out = static_cast<float>(*x);
    return Status::ok();
  }

  static std::string shape(const std::vector<uint64_t>& dims) {
    std::string s = "[";
    for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "]";
  }

  // The tensor exists, has a type the engine computes on (readable_type_names()) with rows
  // of whole blocks and block-aligned data, and has exactly `dims`.
  Status check_tensor(const std::string& name, const std::vector<uint64_t>& dims) const {
    const GgufTensor* t = file_.tensor(name);
    if (!t) return fail("missing tensor " + name);
    const TypeTraits* traits = type_traits(t->type);
    if (!engine_type(t->type) || !traits || !traits->dequantize) {
      return fail("tensor " + name + " has unsupported type " + ggml_type_name(t->type) + " (tandem loads " +
                  readable_type_names() + ")");
    }
    if (t->dims != dims) {
      return fail("tensor " + name + " has shape " + shape(t->dims) + ", expected " + shape(dims));
    }
    if (t->dims[0] % traits->block_elems != 0) {
      return fail("tensor " + name + " of type " + traits->name + " has rows of " + std::to_string(t->dims[0]) +
                  " elements, not a multiple of its block of " + std::to_string(traits->block_elems));
    }
    const uintptr_t align = traits->block_align;
    if (reinterpret_cast<uintptr_t>(t->data) % align != 0) {
      return fail("tensor " + name + " data is not aligned to its " + std::to_string(align) + "-byte blocks");
    }
    return Status::ok();
  }

  // The types whose kernels the engine has (model/quant.h readable_type_names()).
  static bool engine_type(uint32_t type) {
    switch (static_cast<TensorType>(type)) {
      case TensorType::kF32:
      case TensorType::kF16:
      case TensorType::kBF16:
      case TensorType::kQ4_0:
      case TensorType::kQ4_1:
      case TensorType::kQ5_0:
      case TensorType::kQ5_1:
      case TensorType::kQ8_0:
      case TensorType::kQ4_K:
      case TensorType::kQ5_K:
      case TensorType::kQ6_K: return true;
      default: return false;
    }
  }

 private:
  const GgufFile& file_;
};

// general.architecture's row of the table, and general.name (or the file's name).
Result<const Architecture*> read_identity(const GgufFile& file, const Checker& c, ModelConfig& cfg) {
  if (!file.find("general.architecture")) return c.fail("missing key general.architecture");
  std::optional<std::string> name = file.get_string("general.architecture");
  if (!name) return c.fail("key general.architecture is not a string");
  const Architecture* arch = find_architecture(*name);
  if (!arch) return c.fail("unsupported architecture '" + *name + "' (tandem runs " + architecture_names() + ")");
  if (std::optional<std::string> model = file.get_string("general.name"); model && !model->empty()) {
    cfg.name = *model;
  } else {
    const std::string& p = file.path();
    size_t slash = p.find_last_of('/');
    cfg.name = slash == std::string::npos ? p : p.substr(slash + 1);
  }
  return arch;
}

// `{arch}.rope.scaling.*`, as llama.cpp's llama_model_base::load_hparams reads them for every
// architecture: the type defaults to linear and a factor of 1 (absent, or 0) scales nothing.
// llama.cpp reads the yarn_beta_fast/slow, yarn_ext_factor and yarn_attn_factor keys only for
// other architectures (grok, mistral3): for these it uses 32, 1, 1 and 1 whatever the file says.
Status read_rope_scaling(const GgufFile& file, const Checker& c, ModelConfig& cfg) {
  const Architecture& a = *cfg.arch;
  TANDEM_RETURN_IF_ERROR(
      c.read_uint(a.key("rope.scaling.original_context_length"), uint64_t{1} << 24, cfg.rope_original_context, 0u));
  TANDEM_RETURN_IF_ERROR(c.read_float(a.key("rope.scaling.attn_factor"), 1.0f, cfg.rope_attn_factor));
  const std::string type_key = a.key("rope.scaling.type");
  std::string type = "linear";
  if (file.find(type_key)) {
    std::optional<std::string> t = file.get_string(type_key);
    if (!t) return c.fail("key " + type_key + " is not a string");
    type = *t;
  }
  std::string factor_key = a.key("rope.scaling.factor");
  if (!file.find(factor_key) && file.find(a.key("rope.scale_linear"))) factor_key = a.key("rope.scale_linear");
  double factor = 0.0;
  if (file.find(factor_key)) {
    std::optional<double> f = file.get_float(factor_key);
    if (!f) return c.fail("key " + factor_key + " is not a float");
    if (!std::isfinite(*f) || *f < 0) return c.fail(factor_key + " " + std::to_string(*f) + " must not be negative");
    factor = *f;
  }
  cfg.rope_scaling_factor = factor == 0.0 ? 1.0f : static_cast<float>(factor);
  if (type == "none") {
    cfg.rope_scaling = RopeScaling::kNone;
    cfg.rope_scaling_factor = 1.0f;
  } else if (type == "linear") {
    cfg.rope_scaling = cfg.rope_scaling_factor == 1.0f ? RopeScaling::kNone : RopeScaling::kLinear;
  } else if (type == "yarn") {
    cfg.rope_scaling = RopeScaling::kYarn;
  } else {
    return c.fail(type_key + " '" + type + "' is not supported (tandem applies none, linear, yarn)");
  }
  return Status::ok();
}

// The head dimension: attention.key_length, else embedding_length / head_count; the value
// heads must be as long, and RoPE must cover the whole head.
Status check_head_dim(const GgufFile& file, const Checker& c, const ModelConfig& cfg) {
  const Architecture& a = *cfg.arch;
  if (cfg.key_length == 0 && cfg.dim % cfg.n_heads != 0) {
    return c.fail("head_count " + std::to_string(cfg.n_heads) + " does not divide embedding_length " +
                  std::to_string(cfg.dim) + " (and " + a.key("attention.key_length") + " is absent)");
  }
  const uint32_t head_dim = cfg.head_dim();
  if (head_dim % 2 != 0) {
    const std::string from =
        cfg.key_length ? a.key("attention.key_length")
                       : "embedding_length " + std::to_string(cfg.dim) + " / head_count " + std::to_string(cfg.n_heads);
    return c.fail("head_dim " + std::to_string(head_dim) + " (" + from + ") is odd; rope needs pairs");
  }
  const std::pair<const char*, const char*> must_equal_head_dim[] = {
      {"attention.value_length", "tandem needs value heads as long as key heads"},
      {"rope.dimension_count", "tandem applies rope to the whole head"},
  };
  for (const auto& [suffix, why] : must_equal_head_dim) {
    if (a.hybrid() && std::string_view(suffix) == "rope.dimension_count") continue;  // partial: read_hybrid
    const std::string key = a.key(suffix);
    if (!file.find(key)) continue;
    std::optional<uint64_t> n = file.get_uint(key);
    if (!n) return c.fail("key " + key + " is not a non-negative integer");
    if (*n != head_dim) {
      return c.fail(key + " " + std::to_string(*n) + " differs from head_dim " + std::to_string(head_dim) + " (" + why +
                    ")");
    }
  }
  return Status::ok();
}

// A non-negative integer array key (GGUF integer or bool elements); nullopt when absent.
Result<std::optional<std::vector<int64_t>>> read_int_array(const GgufFile& file, const Checker& c,
                                                           const std::string& key) {
  const GgufValue* v = file.find(key);
  if (!v) return std::optional<std::vector<int64_t>>();
  const auto* ints = std::get_if<std::vector<int64_t>>(&v->value);
  if (v->type != GgufValueType::kArray || !ints) return c.fail("key " + key + " is not an integer or bool array");
  return std::optional<std::vector<int64_t>>(*ints);
}

// IMROPE for text is NEOX RoPE on rope.dimension_count dims when every rotated pair reads the
// t, h or w section (ggml_mrope_cache_init); llama.cpp gives an uncovered pair position 0 (no
// rotation) where Hugging Face rotates it, so such files are refused (docs/HYBRID.md).
Status check_rope_sections(const GgufFile& file, const Checker& c, const ModelConfig& cfg) {
  const std::string key = cfg.arch->key("rope.dimension_sections");
  auto sections = read_int_array(file, c, key);
  if (!sections) return sections.status();
  if (!*sections)
    return c.fail("missing key " + key + " (llama.cpp requires it for " + std::string(cfg.arch->name) + ")");
  std::vector<int64_t> s = **sections;
  s.resize(4, 0);
  const int64_t total = s[0] + s[1] + s[2] + s[3];
  if (total <= 0 || s[0] < 0 || s[1] < 0 || s[2] < 0 || s[3] < 0)
    return c.fail(key + " must be non-negative with a positive sum");
  for (uint32_t pair = 0; pair < cfg.rope_dim() / 2; ++pair) {
    const int64_t at = pair % total;
    bool covered = false;
    for (int64_t part = 0; part < 3; ++part) covered = covered || (at % 3 == part && at < 3 * s[part]);
    if (!covered)
      return c.fail(key + ": rotated pair " + std::to_string(pair) +
                    " falls outside the text sections (llama.cpp and Hugging Face would disagree)");
  }
  return Status::ok();
}

// A hybrid's own keys (docs/HYBRID.md): partial RoPE and its sections, the delta net's shape,
// the layer pattern (attention.recurrent_layers, else full_attention_interval), MTP layers.
Status read_hybrid(const GgufFile& file, const Checker& c, ModelConfig& cfg) {
  const Architecture& a = *cfg.arch;
  const uint32_t hd = cfg.head_dim();
  uint32_t n_rot = hd;
  TANDEM_RETURN_IF_ERROR(c.read_uint(a.key("rope.dimension_count"), hd, n_rot, hd));
  if (n_rot % 2 != 0) return c.fail(a.key("rope.dimension_count") + " " + std::to_string(n_rot) + " is odd");
  cfg.rope_dims = n_rot == hd ? 0 : n_rot;
  TANDEM_RETURN_IF_ERROR(check_rope_sections(file, c, cfg));
  if (cfg.rope_scaling != RopeScaling::kNone)
    return c.fail(a.key("rope.scaling.type") + ": tandem runs " + std::string(a.name) + " without RoPE scaling");
  if (cfg.ssm_inner_size != uint64_t{cfg.ssm_time_step_rank} * cfg.ssm_state_size)
    return c.fail(a.key("ssm.inner_size") + " " + std::to_string(cfg.ssm_inner_size) + " is not time_step_rank " +
                  std::to_string(cfg.ssm_time_step_rank) + " x state_size " + std::to_string(cfg.ssm_state_size));
  if (cfg.ssm_time_step_rank % cfg.ssm_group_count != 0)
    return c.fail(a.key("ssm.group_count") + " " + std::to_string(cfg.ssm_group_count) +
                  " does not divide time_step_rank " + std::to_string(cfg.ssm_time_step_rank));
  if (cfg.ssm_conv_kernel < 2) return c.fail(a.key("ssm.conv_kernel") + " must be at least 2");
  uint32_t mtp = 0;
  TANDEM_RETURN_IF_ERROR(c.read_uint(a.key("nextn_predict_layers"), kMaxHyperParameter, mtp, 0u));
  if (mtp >= cfg.n_layers)
    return c.fail(a.key("nextn_predict_layers") + " " + std::to_string(mtp) + " leaves no trunk layer");
  const uint32_t blocks = cfg.n_layers;
  cfg.n_layers -= mtp;  // MTP blocks follow the trunk; not run (docs/HYBRID.md)
  auto explicit_layers = read_int_array(file, c, a.key("attention.recurrent_layers"));
  if (!explicit_layers) return explicit_layers.status();
  cfg.recurrent.assign(cfg.n_layers, false);
  if (*explicit_layers && (*explicit_layers)->size() < cfg.n_layers)
    return c.fail(a.key("attention.recurrent_layers") + " has " + std::to_string((*explicit_layers)->size()) +
                  " entries for " + std::to_string(blocks) + " blocks");
  for (uint32_t i = 0; i < cfg.n_layers; ++i)
    cfg.recurrent[i] = *explicit_layers ? (**explicit_layers)[i] != 0 : (i + 1) % cfg.full_attention_interval != 0;
  return Status::ok();
}

// Which layers are windowed (docs/WINDOWS.md), as llama.cpp's load_swa_pattern: the per-layer
// bool array attention.sliding_window_pattern, else its integer n (default the row's): layer l
// is windowed iff n == 0 or l % n < n - 1. No window (Gemma 3 without the key): none is.
Status read_windows(const GgufFile& file, const Checker& c, ModelConfig& cfg) {
  const Architecture& a = *cfg.arch;
  if (cfg.rope_freq_base_swa == 0) cfg.rope_freq_base_swa = cfg.rope_freq_base;
  cfg.swa_layers.assign(cfg.n_layers, false);
  if (cfg.sliding_window == 0) return Status::ok();
  const std::string key = a.key("attention.sliding_window_pattern");
  const GgufValue* v = file.find(key);
  if (v && v->type == GgufValueType::kArray) {
    auto layers = read_int_array(file, c, key);
    if (!layers) return layers.status();
    if ((*layers)->size() < cfg.n_layers)
      return c.fail(key + " has " + std::to_string((*layers)->size()) + " entries for " + std::to_string(cfg.n_layers) +
                    " blocks");
    for (uint32_t l = 0; l < cfg.n_layers; ++l) cfg.swa_layers[l] = (**layers)[l] != 0;
    return Status::ok();
  }
  uint32_t n = a.swa_pattern;
  if (v) {
    std::optional<uint64_t> x = file.get_uint(key);
    if (!x || *x > kMaxHyperParameter) return c.fail("key " + key + " is not a layer count or a bool array");
    n = static_cast<uint32_t>(*x);
  }
  cfg.swa_pattern = n;
  for (uint32_t l = 0; l < cfg.n_layers; ++l) cfg.swa_layers[l] = n == 0 || l % n < n - 1;
  return Status::ok();
}

}  // namespace

float gemma_query_scale(const ModelConfig& c) {
  const std::string_view arch = c.arch->name;
  const bool is_27b = (arch == "gemma2" && c.n_layers == 46) || (arch == "gemma3" && c.n_layers == 62);
  return is_27b && c.n_heads > 0 ? 1.0f / std::sqrt(float(c.dim / c.n_heads)) : 0.0f;
}

namespace {

// The architecture's keys, then what they must satisfy together.
Status read_hyper_parameters(const GgufFile& file, const Checker& c, ModelConfig& cfg) {
  const Architecture& a = *cfg.arch;
  for (const UintParam& p : a.uints) {
    std::optional<uint32_t> fallback;
    if (p.fallback) fallback = p.fallback(cfg);
    TANDEM_RETURN_IF_ERROR(c.read_uint(a.key(p.key), p.max, cfg.*p.field, fallback));
  }
  for (const FloatParam& p : a.floats) TANDEM_RETURN_IF_ERROR(c.read_float(a.key(p.key), p.fallback, cfg.*p.field));
  if (cfg.rms_eps >= 1.0f) {
    return c.fail(a.key("attention.layer_norm_rms_epsilon") + " " + std::to_string(cfg.rms_eps) + " is not below 1");
  }
  TANDEM_RETURN_IF_ERROR(check_head_dim(file, c, cfg));
  if (cfg.n_heads % cfg.n_kv_heads != 0) {
    return c.fail("head_count_kv " + std::to_string(cfg.n_kv_heads) + " does not divide head_count " +
                  std::to_string(cfg.n_heads));
  }
  TANDEM_RETURN_IF_ERROR(read_rope_scaling(file, c, cfg));
  if (a.swa_pattern != 0) TANDEM_RETURN_IF_ERROR(read_windows(file, c, cfg));
  cfg.query_scale = gemma_query_scale(cfg);
  return a.hybrid() ? read_hybrid(file, c, cfg) : Status::ok();
}

// llama.cpp adds every bias it finds for these architectures (attn_output, the FFN's, Qwen2's
// output.bias): a file with one the row does not list would compute something else here,
// so it is refused, naming the tensor.
Status check_no_other_biases(const GgufFile& file, const Checker& c, const ModelConfig& cfg) {
  for (const GgufTensor& t : file.tensors()) {
    if (!t.name.ends_with(".bias")) continue;
    bool listed = false;
    for (std::span<const TensorSpec> specs : {cfg.arch->layer_tensors, cfg.arch->recurrent_tensors})
      for (const TensorSpec& spec : specs) {
        if (tensor_kind(spec.role) != "bias") continue;
        const std::string suffix = "." + std::string(tensor_name(spec.role)) + ".bias";
        listed = listed || (t.name.starts_with("blk.") && t.name.ends_with(suffix));
      }
    if (!listed) return c.fail("tensor " + t.name + " is not supported (tandem adds no such bias)");
  }
  return Status::ok();
}

// Every tensor the architecture names, in the shape the hyper-parameters imply.
Status check_tensors(const GgufFile& file, const Checker& c, ModelConfig& cfg) {
  // The vocabulary size is the embedding's row count.
  const std::string embd_name(kTokenEmbd);
  const GgufTensor* embd = file.tensor(embd_name);
  if (!embd) return c.fail("missing tensor " + embd_name);
  if (embd->dims.size() != 2 || embd->dims[0] != cfg.dim || embd->dims[1] == 0 || embd->dims[1] > kMaxHyperParameter) {
    return c.fail("tensor " + embd_name + " has shape " + Checker::shape(embd->dims) + ", expected [" +
                  std::to_string(cfg.dim) + ", vocab_size] with vocab_size 1 to " + std::to_string(kMaxHyperParameter));
  }
  cfg.vocab_size = static_cast<uint32_t>(embd->dims[1]);

  const uint64_t dim = cfg.dim, vocab = cfg.vocab_size;
  TANDEM_RETURN_IF_ERROR(c.check_tensor(embd_name, {dim, vocab}));
  for (uint32_t i = 0; i < cfg.n_layers; ++i) {
    for (const TensorSpec& t : layer_tensors(cfg, i)) {
      const std::string name = layer_tensor(i, t.role);
      if (t.presence != Presence::kRequired && !file.tensor(name)) continue;
      std::vector<uint64_t> dims = {dim_size(t.in, cfg)};
      if (!t.vector) dims.push_back(dim_size(t.out, cfg));
      TANDEM_RETURN_IF_ERROR(c.check_tensor(name, dims));
    }
  }
  TANDEM_RETURN_IF_ERROR(c.check_tensor(std::string(kOutputNorm), {dim}));
  const std::string freqs(kRopeFreqs);
  cfg.rope_freqs = cfg.arch->rope_freqs && file.tensor(freqs) != nullptr;
  if (cfg.rope_freqs) {
    TANDEM_RETURN_IF_ERROR(c.check_tensor(freqs, {cfg.head_dim() / 2}));
    // ggml's rope takes its frequency factors as F32 only.
    if (file.tensor(freqs)->type != static_cast<uint32_t>(TensorType::kF32))
      return c.fail("tensor " + freqs + " must be F32 (as llama.cpp's rope reads it)");
  }
  cfg.tied_embeddings = file.tensor(std::string(kOutput)) == nullptr;
  if (!cfg.tied_embeddings) TANDEM_RETURN_IF_ERROR(c.check_tensor(std::string(kOutput), {dim, vocab}));
  return check_no_other_biases(file, c, cfg);
}

}  // namespace

Result<ModelConfig> read_model_config(const GgufFile& file) {
  Checker c(file);
  ModelConfig cfg;
  auto arch = read_identity(file, c, cfg);
  if (!arch) return arch.status();
  cfg.arch = *arch;
  TANDEM_RETURN_IF_ERROR(read_hyper_parameters(file, c, cfg));
  TANDEM_RETURN_IF_ERROR(check_tensors(file, c, cfg));
  return cfg;
}

namespace {
struct Fnv {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  }
  template <class T>
  void pod(const T& v) {
    bytes(&v, sizeof v);
  }
  void str(const std::string& s) {
    pod(s.size());
    bytes(s.data(), s.size());
  }
};
}  // namespace

std::string model_fingerprint(const GgufFile& file, const ModelConfig& c) {
  Fnv f;
  f.str(std::string(c.arch->name));
  for (uint32_t v : {c.vocab_size, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.ffn_dim, c.context_length}) f.pod(v);
  f.pod(c.rope_freq_base);
  f.pod(c.rms_eps);
  // Added after the first release of the fingerprint: only when they differ from what a file
  // without them means, so the fingerprints of existing files stay what they were.
  if (c.key_length != 0 || c.rope_scaling != RopeScaling::kNone || c.rope_original_context != 0 ||
      c.rope_attn_factor != 1.0f) {
    f.pod(c.head_dim());
    f.pod(c.rope_scaling);
    f.pod(c.rope_scaling_factor);
    f.pod(c.yarn_original_context());
    f.pod(c.rope_attn_factor);
  }
  if (c.arch->hybrid()) {
    for (uint32_t v : {c.head_dim(), c.rope_dim(), c.ssm_conv_kernel, c.ssm_state_size, c.ssm_group_count,
                       c.ssm_time_step_rank, c.ssm_inner_size})
      f.pod(v);
    for (bool r : c.recurrent) f.pod(r);
  }
  if (c.arch->swa_pattern != 0) {
    for (float v : {c.rope_freq_base_swa, c.attn_softcap, c.final_softcap, c.query_scale}) f.pod(v);
    for (uint32_t l = 0; l < c.n_layers; ++l) f.pod(c.window(l));
  }
  if (const GgufValue* tokens = file.find("tokenizer.ggml.tokens"))
    if (const auto* pieces = std::get_if<std::vector<std::string>>(&tokens->value))
      for (const std::string& p : *pieces) f.str(p);
  for (const GgufTensor& t : file.tensors()) {
    f.str(t.name);
    f.pod(t.type);
    for (uint64_t d : t.dims) f.pod(d);
    // The first and last 64 bytes of the data: different weights, different model.
    const size_t n = std::min<uint64_t>(64, t.nbytes);
    f.bytes(t.data, n);
    f.bytes(t.data + t.nbytes - n, n);
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(f.h));
  return buf;
}

}  // namespace tandem::model
