#include "model/make_model.h"

#include "model/half.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tandem::model {

namespace {

// Contracting a*b+c into an fma would change the last bits of the draws between
// machines with and without FMA: keep every operation separately rounded here (the
// engine's CMake target also passes -ffp-contract=off).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

// Portable random numbers: the same (seed, stream) gives the same doubles on every
// IEEE-754 machine. Only +, -, *, /, sqrt (all correctly rounded) and exact frexp are
// used — no libm log/sin/cos, whose last bits differ between C libraries, and no
// std::normal_distribution, whose algorithm is implementation-defined.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Natural log for s in (0, 1], from basic operations only: s = m * 2^e with m in
// [sqrt(1/2), sqrt(2)), ln m = 2 atanh(t), t = (m-1)/(m+1), |t| < 0.172, where the
// atanh series to t^23 is accurate to ~1e-19.
double portable_log(double s) {
  int e = 0;
  double m = std::frexp(s, &e);  // m in [0.5, 1)
  if (m < 0.70710678118654752440) {
    m *= 2.0;
    e -= 1;
  }
  const double t = (m - 1.0) / (m + 1.0);
  const double t2 = t * t;
  double series = 1.0 / 23.0;
  for (int k = 21; k >= 1; k -= 2) series = 1.0 / k + t2 * series;
  return 2.0 * t * series + e * 0.69314718055994530942;
}

// xoshiro256** with Marsaglia's polar method for standard normals.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream) {
    uint64_t sm = seed;
    const uint64_t a = splitmix64(sm);
    sm = stream ^ 0x5851F42D4C957F2Dull;
    uint64_t init = a ^ splitmix64(sm);
    for (uint64_t& w : s_) w = splitmix64(init);
  }

  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)

  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = 2.0 * uniform() - 1.0;
      v = 2.0 * uniform() - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = std::sqrt(-2.0 * portable_log(s) / s);
    spare_ = v * f;
    has_spare_ = true;
    return u * f;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
  double spare_ = 0;
  bool has_spare_ = false;
};

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

// `byte_level`: the file gets the byte-level vocabulary, which needs 259 tokens at least.
Status check_config(const ModelConfig& c, const std::optional<Llama3Rope>& llama3, bool byte_level) {
  auto bad = [](const std::string& m) { return Status::invalid("make-model: " + m); };
  if (c.dim == 0 || c.n_layers == 0 || c.n_heads == 0 || c.n_kv_heads == 0 || c.ffn_dim == 0 || c.context_length == 0) {
    return bad("dim, n_layers, n_heads, n_kv_heads, ffn_dim and context_length must be positive");
  }
  if (byte_level && c.vocab_size < 259) {
    return bad("vocab_size " + std::to_string(c.vocab_size) +
               " is too small for the byte-level vocabulary (needs at least 259)");
  }
  if (c.key_length == 0 && c.dim % c.n_heads != 0) {
    return bad("n_heads " + std::to_string(c.n_heads) + " does not divide dim " + std::to_string(c.dim));
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    return bad("n_kv_heads " + std::to_string(c.n_kv_heads) + " does not divide n_heads " + std::to_string(c.n_heads));
  }
  if (c.head_dim() % 2 != 0) return bad("head_dim " + std::to_string(c.head_dim()) + " is odd");
  if (!(c.rope_freq_base > 0) || !(c.rms_eps > 0)) return bad("rope_freq_base and rms_eps must be positive");
  if (c.arch == nullptr) return bad("no architecture");
  if (!(c.rope_scaling_factor > 0) || !(c.rope_attn_factor > 0))
    return bad("the rope scaling factor and attention factor must be positive");
  if (c.arch->hybrid()) {
    if (c.ssm_conv_kernel < 2 || c.ssm_state_size == 0 || c.ssm_group_count == 0 || c.ssm_time_step_rank == 0 ||
        c.ssm_time_step_rank % c.ssm_group_count != 0 || c.ssm_inner_size != c.ssm_time_step_rank * c.ssm_state_size ||
        c.recurrent.size() != c.n_layers || c.full_attention_interval == 0)
      return bad("the hybrid's delta-net shape is inconsistent");
    if (c.rope_dim() % 2 != 0 || c.rope_dim() > c.head_dim()) return bad("rope dims must be even and <= head_dim");
    if (c.rope_scaling != RopeScaling::kNone || llama3) return bad("tandem's qwen35 has no RoPE scaling");
  }
  if (llama3) {
    if (!c.arch->rope_freqs) return bad("architecture " + std::string(c.arch->name) + " has no rope_freqs.weight");
    if (!(llama3->factor > 0) || !(llama3->high_freq_factor > llama3->low_freq_factor) ||
        !(llama3->low_freq_factor > 0) || llama3->original_context == 0)
      return bad(
          "llama3 rope: factor and low_freq_factor positive, high_freq_factor above low_freq_factor, "
          "original context positive");
  }
  return Status::ok();
}

}  // namespace

namespace {

Result<ModelConfig> hybrid_preset(const std::string& preset, const Architecture* arch) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = preset == "small" ? 49152 : 512;
  if (preset == "tiny") {
    c.name = "tandem-tiny-hybrid";
    c.dim = 64, c.n_layers = 4, c.ffn_dim = 192, c.n_heads = 4, c.n_kv_heads = 2, c.key_length = 32;
    c.rope_dims = 8, c.ssm_state_size = 16, c.ssm_group_count = 2, c.ssm_time_step_rank = 4;
    c.context_length = 512;
  } else if (preset == "small") {
    c.name = "tandem-small-hybrid";
    c.dim = 576, c.n_layers = 28, c.ffn_dim = 1536, c.n_heads = 8, c.n_kv_heads = 2, c.key_length = 64;
    c.rope_dims = 16, c.ssm_state_size = 64, c.ssm_group_count = 4, c.ssm_time_step_rank = 8;
    c.context_length = 2048;
  } else {
    return Status::invalid("unknown model preset '" + preset + "' (presets: tiny, small)");
  }
  c.ssm_conv_kernel = 4;
  c.ssm_inner_size = c.ssm_time_step_rank * c.ssm_state_size;
  c.full_attention_interval = 4;
  for (uint32_t i = 0; i < c.n_layers; ++i) c.recurrent.push_back((i + 1) % c.full_attention_interval != 0);
  c.rope_freq_base = 10000000.0f;
  c.rms_eps = 1e-6f;
  return c;
}

// Gemma 2/3 (make_model.h): Gemma's shape (a head longer than dim / heads, one window pattern)
// scaled down; tiny's window of 32 so short prompts cross it, and caps that bite.
Result<ModelConfig> gemma_preset(const std::string& preset, const Architecture* arch) {
  ModelConfig c;
  c.arch = arch;
  const bool gemma3 = arch->name == "gemma3";
  if (preset == "tiny") {
    c.name = "tandem-tiny-" + std::string(arch->name);
    c.vocab_size = 512, c.dim = 64, c.n_layers = gemma3 ? 6 : 4, c.n_heads = 4, c.n_kv_heads = 2;
    c.key_length = 32, c.ffn_dim = 192, c.context_length = 512, c.sliding_window = 32;
    c.attn_softcap = gemma3 ? 0.0f : 5.0f;
    c.final_softcap = gemma3 ? 0.0f : 30.0f;
  } else if (preset == "small") {
    c.name = "tandem-small-" + std::string(arch->name);
    c.vocab_size = 49152, c.dim = 640, c.n_layers = 18, c.n_heads = 4, c.n_kv_heads = 1;
    c.key_length = 256, c.ffn_dim = 2048, c.context_length = 2048, c.sliding_window = 512;
    c.attn_softcap = gemma3 ? 0.0f : 50.0f;
    c.final_softcap = gemma3 ? 0.0f : 30.0f;
  } else {
    return Status::invalid("unknown model preset '" + preset + "' (presets: tiny, small)");
  }
  c.rope_freq_base = gemma3 ? 1000000.0f : 10000.0f;
  c.rope_freq_base_swa = gemma3 ? 10000.0f : 0.0f;
  c.rms_eps = 1e-6f;
  c.tied_embeddings = true;  // Gemma's files have no output.weight
  c.swa_pattern = arch->swa_pattern;
  for (uint32_t l = 0; l < c.n_layers; ++l) c.swa_layers.push_back(l % c.swa_pattern < c.swa_pattern - 1);
  return c;
}

}  // namespace

Result<ModelConfig> preset_config(const std::string& preset, std::string_view arch_name) {
  const Architecture* arch = find_architecture(arch_name);
  if (arch == nullptr) return Status::invalid("unknown architecture '" + std::string(arch_name) + "'");
  if (arch->hybrid()) return hybrid_preset(preset, arch);
  if (arch->swa_pattern != 0) return gemma_preset(preset, arch);
  ModelConfig c;
  c.arch = arch;
  if (preset == "tiny") {
    c.name = "tandem-tiny";
    c.vocab_size = 512;
    c.dim = 64;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.ffn_dim = 192;
    c.context_length = 512;
    c.rope_freq_base = 10000.0f;
  } else if (preset == "small") {
    c.name = "tandem-small";
    c.vocab_size = 49152;
    c.dim = 576;
    c.n_layers = 30;
    c.n_heads = 9;
    c.n_kv_heads = 3;
    c.ffn_dim = 1536;
    c.context_length = 2048;
    c.rope_freq_base = 100000.0f;
  } else {
    return Status::invalid("unknown model preset '" + preset + "' (presets: tiny, small)");
  }
  c.rms_eps = 1e-5f;
  c.tied_embeddings = false;
  return c;
}

std::vector<float> llama3_rope_factors(const Llama3Rope& rope, uint32_t head_dim, double base) {
  // The convert script's loop (conversion/llama.py, generate_extra_tensors), in double.
  const double old_context = rope.original_context;
  const double low_freq_wavelen = old_context / rope.low_freq_factor;
  const double high_freq_wavelen = old_context / rope.high_freq_factor;
  std::vector<float> factors;
  for (uint32_t i = 0; i < head_dim; i += 2) {
    const double wavelen = 2 * M_PI * std::pow(base, static_cast<double>(i) / head_dim);
    double f = rope.factor;
    if (wavelen < high_freq_wavelen) {
      f = 1.0;
    } else if (wavelen <= low_freq_wavelen) {
      const double smooth =
          (old_context / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
      f = 1.0 / ((1 - smooth) / rope.factor + smooth);
    }
    factors.push_back(static_cast<float>(f));
  }
  return factors;
}

namespace {

// The hyper-parameters, as llama.cpp's convert script writes them. Optional keys whose field
// is 0 (absent) are left out.
void add_hyper_parameters(GgufWriter& w, const ModelConfig& c, bool f16) {
  const Architecture& a = *c.arch;
  w.add_string("general.architecture", std::string(a.name));
  w.add_string("general.name", c.name.empty() ? "tandem" : c.name);
  w.add_u32("general.file_type", f16 ? 1 : 0);  // LLAMA_FTYPE_ALL_F32 / LLAMA_FTYPE_MOSTLY_F16
  w.add_u32("general.alignment", 32);
  for (const UintParam& p : a.uints)
    if (c.*p.field != 0) w.add_u32(a.key(p.key), c.*p.field);
  if (c.key_length != 0) w.add_u32(a.key("attention.value_length"), c.key_length);
  for (const FloatParam& p : a.floats)
    if (c.*p.field != 0) w.add_f32(a.key(p.key), c.*p.field);
  if (a.swa_pattern != 0 && c.sliding_window != 0) w.add_u32(a.key("attention.sliding_window_pattern"), c.swa_pattern);
  w.add_u32(a.key("rope.dimension_count"), c.rope_dim());
  if (a.hybrid()) {  // IMROPE sections covering every rotated pair (docs/HYBRID.md): [11, 11, 10, 0] for 32
    const int32_t pairs = static_cast<int32_t>(c.rope_dim() / 2), t = (pairs + 2) / 3, h = (pairs - t + 1) / 2;
    w.add_i32_array(a.key("rope.dimension_sections"), {t, h, pairs - t - h, 0});
  }
  if (c.rope_scaling != RopeScaling::kNone) {
    w.add_string(a.key("rope.scaling.type"), std::string(rope_scaling_name(c.rope_scaling)));
    w.add_f32(a.key("rope.scaling.factor"), c.rope_scaling_factor);
    if (c.rope_original_context != 0) w.add_u32(a.key("rope.scaling.original_context_length"), c.rope_original_context);
    if (c.rope_attn_factor != 1.0f) w.add_f32(a.key("rope.scaling.attn_factor"), c.rope_attn_factor);
  }
  w.add_u32(a.key("vocab_size"), c.vocab_size);
}

// Byte-level vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then unused fillers.
void add_vocabulary(GgufWriter& w, const ModelConfig& c) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  tokens.reserve(c.vocab_size);
  types.reserve(c.vocab_size);
  append_byte_level_tokens(tokens, types);
  for (uint32_t i = 0; tokens.size() < c.vocab_size; ++i) {
    tokens.push_back("<unused" + std::to_string(i) + ">");
    types.push_back(5);
  }
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string("tokenizer.ggml.pre", "default");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_f32_array("tokenizer.ggml.scores", std::vector<float>(c.vocab_size, 0.0f));
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  w.add_bool("tokenizer.ggml.add_eos_token", false);
}

// Tensors in llama.cpp's order. Each tensor is cut into chunks of kChunk values and each
// chunk draws from its own stream (seed, tensor index, chunk index): the bytes do not depend
// on how many threads draw them, and chunks are drawn in parallel.
void add_tensors(GgufWriter& w, const ModelConfig& c, uint64_t seed, bool f16) {
  constexpr uint64_t kChunk = uint64_t{1} << 16;
  const unsigned n_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  uint64_t tensor_index = 0;
  std::vector<float> buf;
  std::vector<uint16_t> halves;
  auto add_random = [&](const std::string& name, uint64_t in, uint64_t out, double std_dev) {
    const uint64_t index = tensor_index++;
    buf.resize(in * out);
    const uint64_t n_chunks = (buf.size() + kChunk - 1) / kChunk;
    auto draw = [&](unsigned first) {
      for (uint64_t chunk = first; chunk < n_chunks; chunk += n_threads) {
        Rng rng(seed, (index << 32) | chunk);
        const uint64_t end = std::min<uint64_t>(buf.size(), (chunk + 1) * kChunk);
        for (uint64_t i = chunk * kChunk; i < end; ++i) buf[i] = static_cast<float>(rng.normal() * std_dev);
      }
    };
    std::vector<std::thread> helpers;
    for (unsigned t = 1; t < n_threads && t < n_chunks; ++t) helpers.emplace_back(draw, t);
    draw(0);
    for (std::thread& h : helpers) h.join();
    if (f16) {
      halves.resize(buf.size());
      for (size_t i = 0; i < buf.size(); ++i) halves[i] = float_to_half(buf[i]);
      w.add_tensor(name, {in, out}, TensorType::kF16, halves.data(), halves.size() * sizeof(uint16_t));
    } else {
      w.add_tensor(name, {in, out}, TensorType::kF32, buf.data(), buf.size() * sizeof(float));
    }
  };
  auto add_ones = [&](const std::string& name, uint64_t n) {
    ++tensor_index;
    buf.assign(n, 1.0f);
    w.add_tensor(name, {n}, TensorType::kF32, buf.data(), buf.size() * sizeof(float));
  };
  // Vectors other than the block norms (biases, Q/K norms): mean + N(0, std_dev^2), F32.
  auto add_random_vector = [&](const std::string& name, uint64_t n, double mean, double std_dev) {
    Rng rng(seed, tensor_index++ << 32);
    buf.resize(n);
    for (float& x : buf) x = static_cast<float>(mean + rng.normal() * std_dev);
    w.add_tensor(name, {n}, TensorType::kF32, buf.data(), buf.size() * sizeof(float));
  };
  const uint64_t dim = c.dim, vocab = c.vocab_size;
  auto std_dev = [](uint64_t fan_in) { return 1.0 / std::sqrt(static_cast<double>(fan_in)); };
  add_random(std::string(kTokenEmbd), dim, vocab, 1.0);
  // ssm_a = -exp(A_log): decay rates from 0.01 to 2 per token (some heads remember past a chunk), no libm.
  auto add_decay = [&](const std::string& name, uint64_t n) {
    Rng rng(seed, tensor_index++ << 32);
    buf.resize(n);
    for (float& x : buf) {
      const double u = rng.uniform();
      x = static_cast<float>(-(0.01 + 1.99 * u * u * u));
    }
    w.add_tensor(name, {n}, TensorType::kF32, buf.data(), buf.size() * sizeof(float));
  };
  for (uint32_t i = 0; i < c.n_layers; ++i) {
    for (const TensorSpec& t : layer_tensors(c, i)) {
      if (t.presence == Presence::kRare) continue;
      const uint64_t in = dim_size(t.in, c);
      const std::string name = layer_tensor(i, t.role);
      if (t.role == LayerTensor::kSsmA) {
        add_decay(name, in);
      } else if (t.role == LayerTensor::kSsmDt) {
        add_random_vector(name, in, -1.0, 1.0);
      } else if (t.role == LayerTensor::kSsmConv1d) {
        add_random(name, in, dim_size(t.out, c), 0.5);
      } else if (t.role == LayerTensor::kAttnQNorm || t.role == LayerTensor::kAttnKNorm ||
                 t.role == LayerTensor::kSsmNorm) {
        add_random_vector(name, in, 1.0, 0.25);
      } else if (tensor_kind(t.role) == "bias") {
        add_random_vector(name, in, 0.0, 0.5);
      } else if (t.vector) {
        add_ones(name, in);
      } else {
        add_random(name, in, dim_size(t.out, c), std_dev(in));
      }
    }
  }
  add_ones(std::string(kOutputNorm), dim);
  if (!c.tied_embeddings) add_random(std::string(kOutput), dim, vocab, std_dev(dim));
}

}  // namespace

void append_byte_level_tokens(std::vector<std::string>& tokens, std::vector<int32_t>& types) {
  tokens.insert(tokens.end(), {"<unk>", "<s>", "</s>"});
  types.insert(types.end(), {2, 3, 3});
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    tokens.emplace_back(buf);
    types.push_back(6);
  }
}

Status make_model(const ModelConfig& config, uint64_t seed, const std::string& path, TensorType weights,
                  const std::optional<Llama3Rope>& llama3, const VocabularyKeys* vocabulary) {
  TANDEM_RETURN_IF_ERROR(check_config(config, llama3, vocabulary == nullptr));
  if (vocabulary != nullptr && vocabulary->size != config.vocab_size) {
    return Status::invalid("make-model: vocab_size " + std::to_string(config.vocab_size) +
                           " is not the vocabulary's size " + std::to_string(vocabulary->size));
  }
  const bool f16 = weights == TensorType::kF16;
  GgufWriter w;
  add_hyper_parameters(w, config, f16);
  if (vocabulary == nullptr) {
    add_vocabulary(w, config);
  } else {
    for (const auto& [key, value] : vocabulary->keys) w.add_value(key, value);
  }
  if (llama3) {  // first, as the convert script yields its generated tensors
    const std::vector<float> f = llama3_rope_factors(*llama3, config.head_dim(), config.rope_freq_base);
    w.add_tensor(std::string(kRopeFreqs), {f.size()}, TensorType::kF32, f.data(), f.size() * sizeof(float));
  }
  add_tensors(w, config, seed, f16);
  return w.write(path);
}

namespace {

constexpr size_t kMaxScriptBytes = 4096;
constexpr uint64_t kMaxSpellSteps = 2'000'000;  // tokens tried before the search gives up

// Depth-first search for a spelling of text[pos..] with unused tokens, longest first.
class Speller {
 public:
  Speller(std::string_view text, const std::unordered_map<std::string, std::vector<int32_t>>& by_text, size_t max_len)
      : text_(text), by_text_(by_text), max_len_(max_len) {}

  bool spell(size_t pos) {
    furthest_ = std::max(furthest_, pos);
    if (pos == text_.size()) return true;
    for (size_t len = std::min(max_len_, text_.size() - pos); len > 0; --len) {
      const auto it = by_text_.find(std::string(text_.substr(pos, len)));
      if (it == by_text_.end()) continue;
      for (int32_t id : it->second) {
        if (++steps_ > kMaxSpellSteps) return false;
        if (!used_.insert(id).second) continue;
        out_.push_back(id);
        if (spell(pos + len)) return true;
        out_.pop_back();
        used_.erase(id);
      }
    }
    return false;
  }
  std::vector<int32_t>& tokens() { return out_; }
  size_t furthest() const { return furthest_; }

 private:
  std::string_view text_;
  const std::unordered_map<std::string, std::vector<int32_t>>& by_text_;
  size_t max_len_;
  std::unordered_set<int32_t> used_;
  std::vector<int32_t> out_;
  size_t furthest_ = 0;
  uint64_t steps_ = 0;
};

}  // namespace

Result<std::vector<int32_t>> spell_without_repeats(const Tokenizer& tokenizer, std::string_view text,
                                                   const std::vector<int32_t>& avoid) {
  if (text.empty() || text.size() > kMaxScriptBytes)
    return Status::invalid("script: the text must have 1 to " + std::to_string(kMaxScriptBytes) + " bytes, not " +
                           std::to_string(text.size()));
  const std::unordered_set<int32_t> avoided(avoid.begin(), avoid.end());
  std::unordered_map<std::string, std::vector<int32_t>> by_text;
  size_t max_len = 0;
  std::string piece;
  for (uint32_t t = 0; t < tokenizer.vocab_size(); ++t) {
    const int32_t id = static_cast<int32_t>(t);
    piece.clear();
    tokenizer.append_token_text(id, false, piece);
    if (piece.empty() || avoided.count(id) || tokenizer.is_eog(id) || text.find(piece) == std::string_view::npos)
      continue;
    max_len = std::max(max_len, piece.size());
    by_text[piece].push_back(id);
  }
  Speller speller(text, by_text, max_len);
  if (!speller.spell(0))
    return Status::invalid("script: no spelling of the text with distinct tokens was found (got to byte " +
                           std::to_string(speller.furthest()) + " of " + std::to_string(text.size()) +
                           "); shorten the text or vary its repeated parts");
  return std::move(speller.tokens());
}

Status make_scripted_model(ModelConfig config, const std::vector<int32_t>& chain, const std::string& path,
                           const VocabularyKeys& vocabulary) {
  const uint64_t vocab = vocabulary.size;
  std::unordered_map<int32_t, uint32_t> dim_of;  // chain token -> its embedding dimension
  for (size_t i = 0; i < chain.size(); ++i) {
    if (chain[i] < 0 || static_cast<uint64_t>(chain[i]) >= vocab)
      return Status::invalid("make-model: scripted token " + std::to_string(chain[i]) + " is outside the vocabulary");
    if (!dim_of.emplace(chain[i], static_cast<uint32_t>(i + 1)).second)
      return Status::invalid("make-model: scripted token " + std::to_string(chain[i]) + " comes twice");
  }
  if (chain.empty()) return Status::invalid("make-model: the script is empty");
  config.vocab_size = vocabulary.size;
  config.dim = std::max<uint32_t>(64, (static_cast<uint32_t>(chain.size()) + 32) / 32 * 32);
  config.key_length = 0;
  if (config.arch->hybrid()) return Status::invalid("make-model: scripted models are llama, qwen2 or qwen3");
  TANDEM_RETURN_IF_ERROR(check_config(config, std::nullopt, false));
  const uint64_t dim = config.dim;
  constexpr float kLogitScale = 16.0f;
  GgufWriter w;
  add_hyper_parameters(w, config, /*f16=*/true);
  for (const auto& [key, value] : vocabulary.keys) w.add_value(key, value);
  std::vector<uint16_t> halves(dim * vocab, float_to_half(0.0f));
  std::vector<float> floats;
  const uint16_t one = float_to_half(1.0f), scale = float_to_half(kLogitScale);
  for (uint64_t t = 0; t < vocab; ++t) {  // the last chain token (the end) embeds as "start"
    const auto it = dim_of.find(static_cast<int32_t>(t));
    halves[t * dim + (it == dim_of.end() || it->second == chain.size() ? 0 : it->second)] = one;
  }
  auto add_half = [&](std::string_view name, uint64_t in, uint64_t out) {
    if (in * out > halves.size()) halves.resize(in * out, float_to_half(0.0f));
    w.add_tensor(std::string(name), {in, out}, TensorType::kF16, halves.data(), in * out * sizeof(uint16_t));
  };
  auto add_floats = [&](const std::string& name, uint64_t n, float v) {
    floats.assign(n, v);
    w.add_tensor(name, {n}, TensorType::kF32, floats.data(), n * sizeof(float));
  };
  add_half(kTokenEmbd, dim, vocab);
  std::fill(halves.begin(), halves.end(), float_to_half(0.0f));
  for (uint32_t i = 0; i < config.n_layers; ++i) {
    for (const TensorSpec& t : config.arch->layer_tensors) {
      if (t.presence == Presence::kRare) continue;
      const uint64_t in = dim_size(t.in, config);
      const std::string name = layer_tensor(i, t.role);
      const bool norm = t.role == LayerTensor::kAttnQNorm || t.role == LayerTensor::kAttnKNorm ||
                        (t.vector && tensor_kind(t.role) != "bias");
      if (t.vector) {
        add_floats(name, in, norm ? 1.0f : 0.0f);
      } else {
        add_half(name, in, dim_size(t.out, config));  // zero: the residual stream is the embedding
      }
    }
  }
  add_floats(std::string(kOutputNorm), dim, 1.0f);
  for (size_t i = 0; i < chain.size(); ++i) halves[static_cast<uint64_t>(chain[i]) * dim + i] = scale;
  add_half(kOutput, dim, vocab);
  return w.write(path);
}

}  // namespace tandem::model
