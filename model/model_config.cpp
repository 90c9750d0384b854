#include "model/model_config.h"

#include <algorithm>
#include <cstdio>

#include <cmath>
#include <cstdint>
#include <optional>
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

// The architecture's keys, then what they must satisfy together.
Status read_hyper_parameters(const GgufFile& file, const Checker& c, ModelConfig& cfg) {
  const Architecture& a = *cfg.arch;
  for (const UintParam& p : a.uints) {
    std::optional<uint32_t> fallback;
    if (p.fallback) fallback = cfg.*p.fallback;
    TANDEM_RETURN_IF_ERROR(c.read_uint(a.key(p.key), p.max, cfg.*p.field, fallback));
  }
  for (const FloatParam& p : a.floats) TANDEM_RETURN_IF_ERROR(c.read_float(a.key(p.key), p.fallback, cfg.*p.field));
  if (cfg.rms_eps >= 1.0f) {
    return c.fail(a.key("attention.layer_norm_rms_epsilon") + " " + std::to_string(cfg.rms_eps) + " is not below 1");
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
  const std::string rope_dims_key = a.key("rope.dimension_count");
  if (file.find(rope_dims_key)) {
    std::optional<uint64_t> rope_dims = file.get_uint(rope_dims_key);
    if (!rope_dims) return c.fail("key " + rope_dims_key + " is not a non-negative integer");
    if (*rope_dims != head_dim) {
      return c.fail(rope_dims_key + " " + std::to_string(*rope_dims) + " differs from head_dim " +
                    std::to_string(head_dim) + " (tandem applies rope to the whole head)");
    }
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
    for (const TensorSpec& t : cfg.arch->layer_tensors) {
      std::vector<uint64_t> dims = {dim_size(t.in, cfg)};
      if (!t.vector) dims.push_back(dim_size(t.out, cfg));
      TANDEM_RETURN_IF_ERROR(c.check_tensor(layer_tensor(i, t.role), dims));
    }
  }
  TANDEM_RETURN_IF_ERROR(c.check_tensor(std::string(kOutputNorm), {dim}));
  cfg.tied_embeddings = file.tensor(std::string(kOutput)) == nullptr;
  if (!cfg.tied_embeddings) TANDEM_RETURN_IF_ERROR(c.check_tensor(std::string(kOutput), {dim, vocab}));
  return Status::ok();
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
