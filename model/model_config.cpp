#include "model/model_config.h"

#include <algorithm>
#include <cstdio>

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

namespace tandem::model {

namespace {

// Hyper-parameters above these are not a model tandem can run on a CPU: a bound that
// catches garbage (and keeps later products like dim * vocab far from overflow).
constexpr uint64_t kMaxSize = (uint64_t{1} << 20) - 1;
constexpr uint64_t kMaxContext = uint64_t{1} << 24;

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

  // The tensor exists, is F32 or F16 with element-aligned data, and has exactly `dims`.
  Status check_tensor(const std::string& name, const std::vector<uint64_t>& dims) const {
    const GgufTensor* t = file_.tensor(name);
    if (!t) return fail("missing tensor " + name);
    if (t->type != static_cast<uint32_t>(TensorType::kF32) && t->type != static_cast<uint32_t>(TensorType::kF16)) {
      return fail("tensor " + name + " has unsupported type " + ggml_type_name(t->type) +
                  " (tandem loads F32 and F16)");
    }
    if (t->dims != dims) {
      return fail("tensor " + name + " has shape " + shape(t->dims) + ", expected " + shape(dims));
    }
    const uintptr_t elem = t->type == static_cast<uint32_t>(TensorType::kF32) ? 4 : 2;
    if (reinterpret_cast<uintptr_t>(t->data) % elem != 0) {
      return fail("tensor " + name + " data is not aligned to its " + std::to_string(elem) + "-byte elements");
    }
    return Status::ok();
  }

 private:
  const GgufFile& file_;
};

}  // namespace

std::string layer_tensor(uint32_t layer, const char* what) {
  return "blk." + std::to_string(layer) + "." + what + ".weight";
}

Result<ModelConfig> read_model_config(const GgufFile& file) {
  Checker c(file);
  ModelConfig cfg;

  const GgufValue* arch_value = file.find("general.architecture");
  if (!arch_value) return c.fail("missing key general.architecture");
  std::optional<std::string> arch = file.get_string("general.architecture");
  if (!arch) return c.fail("key general.architecture is not a string");
  if (*arch != "llama") return c.fail("unsupported architecture '" + *arch + "' (tandem runs 'llama')");

  if (std::optional<std::string> name = file.get_string("general.name"); name && !name->empty()) {
    cfg.name = *name;
  } else {
    const std::string& p = file.path();
    size_t slash = p.find_last_of('/');
    cfg.name = slash == std::string::npos ? p : p.substr(slash + 1);
  }

  TANDEM_RETURN_IF_ERROR(c.read_uint("llama.context_length", kMaxContext, cfg.context_length));
  TANDEM_RETURN_IF_ERROR(c.read_uint("llama.embedding_length", kMaxSize, cfg.dim));
  TANDEM_RETURN_IF_ERROR(c.read_uint("llama.block_count", kMaxSize, cfg.n_layers));
  TANDEM_RETURN_IF_ERROR(c.read_uint("llama.feed_forward_length", kMaxSize, cfg.ffn_dim));
  TANDEM_RETURN_IF_ERROR(c.read_uint("llama.attention.head_count", kMaxSize, cfg.n_heads));
  TANDEM_RETURN_IF_ERROR(c.read_uint("llama.attention.head_count_kv", kMaxSize, cfg.n_kv_heads, cfg.n_heads));
  TANDEM_RETURN_IF_ERROR(c.read_float("llama.rope.freq_base", 10000.0f, cfg.rope_freq_base));
  TANDEM_RETURN_IF_ERROR(c.read_float("llama.attention.layer_norm_rms_epsilon", 1e-5f, cfg.rms_eps));
  if (cfg.rms_eps >= 1.0f) {
    return c.fail("llama.attention.layer_norm_rms_epsilon " + std::to_string(cfg.rms_eps) + " is not below 1");
  }

  if (cfg.dim % cfg.n_heads != 0) {
    return c.fail("head_count " + std::to_string(cfg.n_heads) + " does not divide embedding_length " +
                  std::to_string(cfg.dim));
  }
  if (cfg.n_heads % cfg.n_kv_heads != 0) {
    return c.fail("head_count_kv " + std::to_string(cfg.n_kv_heads) + " does not divide head_count " +
                  std::to_string(cfg.n_heads));
  }
  const uint32_t head_dim = cfg.head_dim();
  if (head_dim % 2 != 0) {
    return c.fail("head_dim " + std::to_string(head_dim) + " (embedding_length " + std::to_string(cfg.dim) +
                  " / head_count " + std::to_string(cfg.n_heads) + ") is odd; rope needs pairs");
  }
  if (file.find("llama.rope.dimension_count")) {
    std::optional<uint64_t> rope_dims = file.get_uint("llama.rope.dimension_count");
    if (!rope_dims) return c.fail("key llama.rope.dimension_count is not a non-negative integer");
    if (*rope_dims != head_dim) {
      return c.fail("llama.rope.dimension_count " + std::to_string(*rope_dims) + " differs from head_dim " +
                    std::to_string(head_dim) + " (tandem applies rope to the whole head)");
    }
  }

  // The vocabulary size is the embedding's row count.
  const GgufTensor* embd = file.tensor("token_embd.weight");
  if (!embd) return c.fail("missing tensor token_embd.weight");
  if (embd->dims.size() != 2 || embd->dims[0] != cfg.dim || embd->dims[1] == 0 || embd->dims[1] > kMaxSize) {
    return c.fail("tensor token_embd.weight has shape " + Checker::shape(embd->dims) + ", expected [" +
                  std::to_string(cfg.dim) + ", vocab_size] with vocab_size 1 to " + std::to_string(kMaxSize));
  }
  cfg.vocab_size = static_cast<uint32_t>(embd->dims[1]);

  const uint64_t dim = cfg.dim, kv_dim = cfg.kv_dim(), ffn = cfg.ffn_dim, vocab = cfg.vocab_size;
  TANDEM_RETURN_IF_ERROR(c.check_tensor("token_embd.weight", {dim, vocab}));
  for (uint32_t i = 0; i < cfg.n_layers; ++i) {
    TANDEM_RETURN_IF_ERROR(c.check_tensor(layer_tensor(i, "attn_norm"), {dim}));
    TANDEM_RETURN_IF_ERROR(c.check_tensor(layer_tensor(i, "attn_q"), {dim, dim}));
    TANDEM_RETURN_IF_ERROR(c.check_tensor(layer_tensor(i, "attn_k"), {dim, kv_dim}));
    TANDEM_RETURN_IF_ERROR(c.check_tensor(layer_tensor(i, "attn_v"), {dim, kv_dim}));
    TANDEM_RETURN_IF_ERROR(c.check_tensor(layer_tensor(i, "attn_output"), {dim, dim}));
    TANDEM_RETURN_IF_ERROR(c.check_tensor(layer_tensor(i, "ffn_norm"), {dim}));
    TANDEM_RETURN_IF_ERROR(c.check_tensor(layer_tensor(i, "ffn_gate"), {dim, ffn}));
    TANDEM_RETURN_IF_ERROR(c.check_tensor(layer_tensor(i, "ffn_up"), {dim, ffn}));
    TANDEM_RETURN_IF_ERROR(c.check_tensor(layer_tensor(i, "ffn_down"), {ffn, dim}));
  }
  TANDEM_RETURN_IF_ERROR(c.check_tensor("output_norm.weight", {dim}));
  cfg.tied_embeddings = file.tensor("output.weight") == nullptr;
  if (!cfg.tied_embeddings) TANDEM_RETURN_IF_ERROR(c.check_tensor("output.weight", {dim, vocab}));
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
  for (uint32_t v : {c.vocab_size, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.ffn_dim, c.context_length}) f.pod(v);
  f.pod(c.rope_freq_base);
  f.pod(c.rms_eps);
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
