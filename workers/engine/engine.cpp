#include "workers/engine/engine.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "model/half.h"
#include "workers/engine/hybrid.h"
#include "workers/engine/model_file.h"

namespace tandem::engine {

namespace {

// Row `row` of a GGUF tensor ([rows][cols], any type model_config accepts) as floats:
// copied (F32) or dequantized by ggml's reference conversion. No allocation.
void read_row(const GgufTensor& t, uint64_t row, float* out) {
  const uint64_t cols = t.dims[0];
  const auto type = static_cast<TensorType>(t.type);
  if (type == TensorType::kF32) {
    std::memcpy(out, reinterpret_cast<const float*>(t.data) + row * cols, cols * sizeof(float));
    return;
  }
  const model::TypeTraits* traits = model::type_traits(type);
  traits->dequantize(t.data + row * model::row_bytes(type, cols), out, static_cast<int64_t>(cols));
}

bool is_16bit(uint32_t type) {
  return type == static_cast<uint32_t>(TensorType::kF16) || type == static_cast<uint32_t>(TensorType::kBF16);
}

std::vector<float> read_vector(const GgufTensor& t) {
  std::vector<float> v(t.elements());
  const uint64_t rows = t.elements() / t.dims[0];
  for (uint64_t r = 0; r < rows; ++r) read_row(t, r, v.data() + r * t.dims[0]);
  return v;
}

// y may be x.
void rms_norm(const float* x, const float* w, float* y, uint32_t n, float eps) {
  double ss = 0.0;
  for (uint32_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (uint32_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

// cos and sin of every (position, pair) of a head, [context][head_dim], in double and then
// rounded, as the angles of far positions lose precision in float. ggml's rope (ops.cpp,
// rope_yarn): pair i's angle is pos * base^(-2i / head_dim), divided by the file's frequency
// factor of the pair (Llama 3's rope_freqs.weight) and by the scaling factor (linear; YaRN
// blends the divided and undivided angle by a ramp over the pairs between its correction
// dimensions); cos and sin carry the magnitude (rope.scaling.attn_factor, and YaRN's
// 1 + 0.1 ln(factor)). Unscaled, without factors, this is exactly the plain table.
std::vector<float> rope_table(const ModelConfig& c, const float* freq_factors) {
  // A hybrid rotates the first rope_dim() dims only (partial RoPE): its angles use that width.
  const uint32_t hd = c.head_dim(), rot = c.rope_dim(), half = rot / 2;
  const double base = c.rope_freq_base, factor = c.rope_scaling_factor;
  const double freq_scale = c.rope_scaling == model::RopeScaling::kNone ? 1.0 : 1.0 / factor;
  const bool yarn = c.rope_scaling == model::RopeScaling::kYarn;
  double mscale = c.rope_attn_factor;
  if (yarn && factor > 1.0) mscale *= 1.0 + 0.1 * std::log(factor);
  // YaRN's correction dimensions for beta_fast 32 and beta_slow 1 (llama.cpp's values for
  // these architectures): the pair whose wavelength fits the original context beta times.
  auto corr_dim = [&](double beta) {
    return hd * std::log(c.yarn_original_context() / (beta * 2 * M_PI)) / (2 * std::log(base));
  };
  const double low = std::max(0.0, std::floor(corr_dim(32.0)));
  const double high = std::min(hd - 1.0, std::ceil(corr_dim(1.0)));
  std::vector<float> table(size_t{c.context_length} * hd);
  for (uint32_t p = 0; p < c.context_length; ++p) {
    for (uint32_t i = 0; i < half; ++i) {
      double extrapolated = p * std::pow(base, -2.0 * i / rot);
      if (freq_factors) extrapolated /= freq_factors[i];
      double theta = freq_scale * extrapolated;
      if (yarn) {
        const double ramp = 1.0 - std::clamp((i - low) / std::max(0.001, high - low), 0.0, 1.0);
        theta = theta * (1.0 - ramp) + extrapolated * ramp;
      }
      table[size_t{p} * hd + 2 * i] = static_cast<float>(std::cos(theta) * mscale);
      table[size_t{p} * hd + 2 * i + 1] = static_cast<float>(std::sin(theta) * mscale);
    }
  }
  return table;
}

// GeGLU in place: gate[i] = gelu(gate[i]) * up[i], GELU's tanh approximation as ggml_gelu.
void gelu_tanh_mul(float* gate, const float* up, uint32_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f, kCoefA = 0.044715f;
  for (uint32_t i = 0; i < n; ++i) {
    const float x = gate[i];
    gate[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCoefA * x * x))) * up[i];
  }
}

// Gemma's soft-capping: cap * tanh(x / cap), as llama.cpp (a scale by 1 / cap, tanh, a scale by cap).
void soft_cap(float* x, size_t n, float cap) {
  const float inv = 1.0f / cap;
  for (size_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv);
}

// The RoPE table of a model's windowed layers (docs/WINDOWS.md): base rope.freq_base_swa, and
// unscaled where the architecture says so (Gemma 3), as llama.cpp's get_rope_freq_base/scale.
ModelConfig windowed_rope_config(const ModelConfig& c) {
  ModelConfig w = c;
  w.rope_freq_base = c.rope_freq_base_swa;
  if (c.arch->swa_rope_unscaled) w.rope_scaling = model::RopeScaling::kNone, w.rope_scaling_factor = 1.0f;
  return w;
}

}  // namespace

// A weight matrix W[N][K], several GGUF tensors fused along N (q|k|v, gate|up), as parts
// each in its own kernel layout: F32 packed panels (or row-major for cblas_sgemm), F16/BF16
// packed panels of 16-bit elements, or quantized rows read in place from the mapped file.
// Consecutive tensors of one F32/16-bit type share a part; each quantized tensor is one.
struct Engine::Matrix {
  enum class Kind { kF32, kF32Rows, k16, kBf16Pairs, kQuant };
  struct Part {
    Kind kind = Kind::kF32;
    uint32_t n0 = 0, n = 0;  // its columns [n0, n0 + n) of the matrix
    uint32_t type = 0;       // the GGUF type of its tensors
    float* owned = nullptr;  // packed copies (F32 floats, 16-bit elements, quantized tiles) in the weight arena
    size_t bytes = 0;
    kernels::QuantView quant;
    // Work units for the thread pool: panels, or quantized tile columns.
    uint32_t units() const {
      if (kind == Kind::kF32Rows) return 0;  // cblas_sgemm, outside the pool
      if (kind == Kind::kQuant) return (n + kernels::kQuantTile - 1) / kernels::kQuantTile;
      return (n + kernels::kPanel - 1) / kernels::kPanel;
    }
  };
  uint32_t n = 0, k = 0;
  std::vector<Part> parts;
  uint32_t units = 0;

  size_t bytes() const {
    size_t b = 0;
    for (const Part& p : parts) b += p.bytes;
    return b;
  }

  static Result<Matrix> build(std::initializer_list<const GgufTensor*> tensors, bool packed, WeightArena& arena) {
    Matrix m;
    m.k = static_cast<uint32_t>((*tensors.begin())->dims[0]);
    std::vector<const GgufTensor*> group;
    auto flush = [&] {
      if (group.empty()) return;
      m.parts.push_back(build_part(group, m.n, m.k, packed, arena));
      m.n += m.parts.back().n;
      m.units += m.parts.back().units();
      group.clear();
    };
    for (const GgufTensor* t : tensors) {
      const bool joins = !group.empty() && group.back()->type == t->type && kernels::act_block(t->type) == 0;
      if (!joins) flush();
      group.push_back(t);
    }
    flush();
    for (const Part& p : m.parts)
      if (!p.owned)
        return Status::error(Code::kUnavailable, "cannot map " + std::to_string(p.bytes) +
                                                     " bytes for the packed weights: " + std::strerror(errno));
    return m;
  }

  static Part build_part(const std::vector<const GgufTensor*>& tensors, uint32_t n0, uint32_t k, bool packed,
                         WeightArena& arena) {
    Part p;
    p.n0 = n0;
    p.type = tensors.front()->type;
    for (const GgufTensor* t : tensors) p.n += static_cast<uint32_t>(t->dims[1]);
    if (kernels::act_block(p.type) != 0) {
      const GgufTensor& t = *tensors.front();
      p.kind = Kind::kQuant;
      // Repacked once into the kernels' tiles (about the same size as the file's blocks).
      p.bytes = kernels::tiled_bytes(p.type, p.n, k);
      p.owned = static_cast<float*>(arena.allocate(p.bytes));
      if (!p.owned) return p;
      auto* tiles = reinterpret_cast<uint8_t*>(p.owned);
      kernels::tile_quant(reinterpret_cast<const uint8_t*>(t.data),
                          model::row_bytes(static_cast<TensorType>(p.type), k), p.type, p.n, k, tiles);
      p.quant = {tiles, p.type, p.n, k};
      return p;
    }
    const bool wide = is_16bit(p.type);
    const bool pairs = p.type == static_cast<uint32_t>(TensorType::kBF16) && k % 2 == 0;
    p.kind = pairs ? Kind::kBf16Pairs : wide ? Kind::k16 : packed ? Kind::kF32 : Kind::kF32Rows;
    const size_t elems = p.kind == Kind::kF32Rows ? size_t{p.n} * k : kernels::packed_floats(p.n, k);
    const size_t elem_bytes = wide ? 2 : 4;
    p.bytes = elems * elem_bytes;
    p.owned = static_cast<float*>(arena.allocate(p.bytes));  // zeroed
    if (!p.owned) return p;
    std::vector<float> row(k);
    uint32_t n = 0;
    for (const GgufTensor* t : tensors) {
      for (uint64_t r = 0; r < t->dims[1]; ++r, ++n) {
        if (pairs) {  // the file's BF16 elements, K in pairs inside each panel
          kernels::pack_bf16_pairs_row(reinterpret_cast<const uint16_t*>(t->data) + r * k, n, k,
                                       reinterpret_cast<uint16_t*>(p.owned));
        } else if (wide) {  // the file's 16-bit elements, K-major inside each panel
          const auto* src = reinterpret_cast<const uint16_t*>(t->data) + r * k;
          auto* panel = reinterpret_cast<uint16_t*>(p.owned) + size_t{n / kernels::kPanel} * k * kernels::kPanel;
          for (uint32_t i = 0; i < k; ++i) panel[size_t{i} * kernels::kPanel + n % kernels::kPanel] = src[i];
        } else if (p.kind == Kind::kF32Rows) {
          read_row(*t, r, p.owned + size_t{n} * k);
        } else {
          read_row(*t, r, row.data());
          kernels::pack_row(row.data(), n, k, p.owned);
        }
      }
    }
    return p;
  }
};

struct Engine::Layer {
  // ffn_norm is a hybrid's post_attention_norm. A hybrid's recurrent layer keeps its fused
  // attn_qkv|attn_gate|ssm_beta|ssm_alpha in qkv and ssm_out in wo.
  bool recurrent = false;
  uint32_t rec_index = 0;                                    // its StatePool layer
  std::vector<float> conv_kernel, dt_bias, ssm_a, ssm_norm;  // conv_kernel: [channels][conv_kernel]
  std::vector<float> attn_norm, ffn_norm;
  std::vector<float> qkv_bias;        // q|k|v, added after the GEMM; empty: no biases (absent ones are 0)
  std::vector<float> q_norm, k_norm;  // per-head RMSNorm weights [head_dim] (NormVariant::kRmsQkNorm)
  // Gemma: the norms of the attention and FFN outputs (Architecture::post_norms); empty: none.
  std::vector<float> post_attn_norm, post_ffn_norm;
  uint32_t window = 0;  // ModelConfig::window(layer): 0 full attention
  Matrix qkv, wo, gate_up, down;
};

Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::load(const std::string& path, const EngineOptions& options) {
  auto file = GgufFile::open(path);
  if (!file) return file.status();
  auto config = read_model_config(**file);
  if (!config) return config.status();
  const bool known_rope =
      config->arch->rope == model::RopeType::kNormal || config->arch->rope == model::RopeType::kNeox;
  const bool known_norm =
      config->arch->norm == model::NormVariant::kRms || config->arch->norm == model::NormVariant::kRmsQkNorm;
  if (!known_rope || !known_norm)
    return Status::model_file(path + ": architecture '" + std::string(config->arch->name) +
                              "' needs a RoPE or norm variant this engine does not compute");
  const uint32_t hd = config->head_dim();
  // The attention kernels hold a value row in head_dim / 16 (AVX-512) or / 8 (AVX2) registers,
  // instantiated for powers of two.
  if (hd < 16 || hd > 256 || (hd & (hd - 1)) != 0)
    return Status::model_file(path + ": head dimension " + std::to_string(hd) +
                              " is not supported (tandem's attention takes 16, 32, 64, 128 or 256)");
  // Bounds the delta rule's per-thread scratch (hybrid::chunk_scratch_floats: d^2 + 4 x 64 d + 2 x 64^2 floats).
  if (config->arch->hybrid() && config->ssm_state_size > 1024)
    return Status::model_file(path + ": ssm.state_size " + std::to_string(config->ssm_state_size) +
                              " is above the 1024 tandem's delta net takes");
  auto tokenizer = Tokenizer::from_gguf(**file);
  if (!tokenizer) return tokenizer.status();
  // Fewer tokens than embedding rows is fine (padded vocabularies); more would let text
  // encode to ids the model has no row for.
  if (tokenizer->vocab_size() > config->vocab_size)
    return Status::model_file(path + ": the vocabulary has " + std::to_string(tokenizer->vocab_size()) +
                              " tokens but token_embd.weight has only " + std::to_string(config->vocab_size) + " rows");
  if (options.threads == 0 || options.threads > 256)
    return Status::invalid("threads must be in [1, 256], got " + std::to_string(options.threads));

  auto engine = std::unique_ptr<Engine>(new Engine());
  engine->options_ = options;
  engine->config_ = *config;
  engine->tokenizer_ = std::move(tokenizer.value());
  engine->pool_ = std::make_unique<ThreadPool>(options.threads);
  engine->kernels_ = &kernels::best();
  engine->embed_scale_ = std::sqrt(static_cast<float>(config->dim));
  if (options.gemm == GemmBackend::kOpenBlas) openblas_set_num_threads(static_cast<int>(options.threads));
  TANDEM_RETURN_IF_ERROR(engine->load_weights(**file));
  if (config->arch->hybrid())
    engine->delta_scratch_.resize(options.threads * hybrid::chunk_scratch_floats(config->ssm_state_size));
  std::vector<float> freq_factors;
  if (config->rope_freqs) freq_factors = read_vector(*(*file)->tensor(std::string(model::kRopeFreqs)));
  engine->rope_ = rope_table(*config, config->rope_freqs ? freq_factors.data() : nullptr);
  if (config->sliding_window != 0)
    engine->rope_swa_ = rope_table(windowed_rope_config(*config), config->rope_freqs ? freq_factors.data() : nullptr);
  engine->file_ = std::move(file.value());  // quantized weights and the embedding are read in place
  return engine;
}

Status Engine::load_weights(const GgufFile& file) {
  const bool packed = options_.gemm == GemmBackend::kPacked;
  auto build = [&](Matrix& m, std::initializer_list<const GgufTensor*> tensors) {
    auto built = Matrix::build(tensors, packed, arena_);
    if (!built) return built.status();
    m = std::move(built.value());
    return Status::ok();
  };
  const auto* embd = file.tensor(std::string(model::kTokenEmbd));
  embeddings_ = embd;
  output_norm_ = read_vector(*file.tensor(std::string(model::kOutputNorm)));
  weight_bytes_ = output_norm_.size() * sizeof(float);
  uint32_t n_recurrent = 0;
  for (uint32_t l = 0; l < config_.n_layers; ++l) {
    using enum model::LayerTensor;
    auto t = [&](model::LayerTensor role) { return file.tensor(layer_tensor(l, role)); };
    auto layer = std::make_unique<Layer>();
    layer->attn_norm = read_vector(*t(kAttnNorm));
    layer->ffn_norm = read_vector(*t(config_.arch->hybrid() ? kPostAttnNorm : kFfnNorm));
    if (config_.is_recurrent(l)) {
      layer->recurrent = true;
      layer->rec_index = n_recurrent++;
      layer->conv_kernel = read_vector(*t(kSsmConv1d));
      layer->dt_bias = read_vector(*t(kSsmDt));
      layer->ssm_a = read_vector(*t(kSsmA));
      layer->ssm_norm = read_vector(*t(kSsmNorm));
      TANDEM_RETURN_IF_ERROR(build(layer->qkv, {t(kAttnQkv), t(kAttnGate), t(kSsmBeta), t(kSsmAlpha)}));
      TANDEM_RETURN_IF_ERROR(build(layer->wo, {t(kSsmOut)}));
      TANDEM_RETURN_IF_ERROR(build(layer->gate_up, {t(kFfnGate), t(kFfnUp)}));
      TANDEM_RETURN_IF_ERROR(build(layer->down, {t(kFfnDown)}));
      weight_bytes_ += layer->qkv.bytes() + layer->wo.bytes() + layer->gate_up.bytes() + layer->down.bytes() +
                       (layer->attn_norm.size() + layer->ffn_norm.size() + layer->conv_kernel.size() +
                        layer->dt_bias.size() + layer->ssm_a.size() + layer->ssm_norm.size()) *
                           sizeof(float);
      layers_.push_back(std::move(layer));
      continue;
    }
    if (config_.arch->norm == model::NormVariant::kRmsQkNorm) {
      layer->q_norm = read_vector(*t(kAttnQNorm));
      layer->k_norm = read_vector(*t(kAttnKNorm));
    }
    if (config_.arch->post_norms) {
      layer->post_attn_norm = read_vector(*t(kPostAttnNorm));
      layer->post_ffn_norm = read_vector(*t(kFfnPostNorm));
    }
    layer->window = config_.window(l);
    if (t(kAttnQBias) || t(kAttnKBias) || t(kAttnVBias)) {
      layer->qkv_bias.assign(config_.q_dim() + 2 * config_.kv_dim(), 0.0f);
      size_t at = 0;
      for (model::LayerTensor role : {kAttnQBias, kAttnKBias, kAttnVBias}) {
        const size_t n = role == kAttnQBias ? config_.q_dim() : config_.kv_dim();
        if (const GgufTensor* b = t(role)) read_row(*b, 0, layer->qkv_bias.data() + at);
        at += n;
      }
    }
    TANDEM_RETURN_IF_ERROR(build(layer->qkv, {t(kAttnQ), t(kAttnK), t(kAttnV)}));
    TANDEM_RETURN_IF_ERROR(build(layer->wo, {t(kAttnOutput)}));
    TANDEM_RETURN_IF_ERROR(build(layer->gate_up, {t(kFfnGate), t(kFfnUp)}));
    TANDEM_RETURN_IF_ERROR(build(layer->down, {t(kFfnDown)}));
    weight_bytes_ += layer->qkv.bytes() + layer->wo.bytes() + layer->gate_up.bytes() + layer->down.bytes() +
                     (layer->attn_norm.size() + layer->ffn_norm.size() + layer->qkv_bias.size() + layer->q_norm.size() +
                      layer->k_norm.size() + layer->post_attn_norm.size() + layer->post_ffn_norm.size()) *
                         sizeof(float);
    layers_.push_back(std::move(layer));
  }
  const GgufTensor* out = file.tensor(std::string(model::kOutput));
  output_ = std::make_unique<Matrix>();
  TANDEM_RETURN_IF_ERROR(build(*output_, {out ? out : embd}));
  weight_bytes_ += output_->bytes();
  build_screen();
  return Status::ok();
}

// Per layer: the QKV and output projections and the gated FFN (a recurrent layer's projections
// are of the same order); the head: vocabulary x dim.
bool head_outweighs_layers(const ModelConfig& c) {
  const uint64_t per_layer = uint64_t{c.dim} * (2 * c.q_dim() + 2 * c.kv_dim()) + uint64_t{3} * c.dim * c.ffn_dim;
  return uint64_t{c.vocab_size} * c.dim > per_layer * c.n_layers;
}

void Engine::build_screen() {
  const char* env = std::getenv("TANDEM_GREEDY_SCREEN");
  if (!options_.greedy_screen || (env != nullptr && std::string(env) == "0")) return;
  if (output_->parts.size() != 1 || config_.final_softcap > 0.0f || !head_outweighs_layers(config_)) return;
  const Matrix::Part& p = output_->parts.front();
  if (p.kind != Matrix::Kind::kF32 && p.kind != Matrix::Kind::k16) return;
  const uint32_t k = output_->k;
  const bool bf16 = p.type == static_cast<uint32_t>(TensorType::kBF16);
  // Row v's values as the head's GEMM widens them: element (v, i) of the panel layout.
  screen_ = GreedyScreen::build(output_->n, k, [&](uint32_t v, float* w) {
    const size_t at = size_t{v / kernels::kPanel} * k * kernels::kPanel + v % kernels::kPanel;
    for (uint32_t i = 0; i < k; ++i) {
      const size_t e = at + size_t{i} * kernels::kPanel;
      if (p.kind == Matrix::Kind::kF32) {
        w[i] = p.owned[e];
      } else {
        const uint16_t bits = reinterpret_cast<const uint16_t*>(p.owned)[e];
        w[i] = bf16 ? model::bf16_to_float(bits) : model::half_to_float(bits);
      }
    }
  });
  if (!screen_) return;
  const uint32_t threads = pool_->size(), vocab = config_.vocab_size;
  screen_upper_.resize(size_t{threads} * (vocab / kernels::kScreenChunk + 1));
  screen_full_.resize(size_t{threads} * vocab);
}

void Engine::exact_panel(const float* x, uint32_t panel, float* out) const {
  const Matrix::Part& p = output_->parts.front();
  const uint32_t k = output_->k, cols = std::min(kernels::kPanel, p.n - panel * kernels::kPanel);
  const size_t at = size_t{panel} * k * kernels::kPanel;
  if (p.kind == Matrix::Kind::kF32) {
    kernels_->gemm(x, k, 1, {p.owned + at, cols, k}, 0, 1, out, kernels::kPanel);
  } else {
    const kernels::Packed16View v{reinterpret_cast<const uint16_t*>(p.owned) + at, cols, k,
                                  p.type == static_cast<uint32_t>(TensorType::kBF16)};
    kernels_->gemm16(x, k, 1, v, 0, 1, out, kernels::kPanel);
  }
}

Status Engine::screen_rows(std::span<const uint32_t> rows) {
  if (!screen_) return Status::invalid("screen_rows: this engine has no greedy screen");
  for (size_t j = 0; j < rows.size(); ++j) {
    const uint32_t row = rows[j];
    std::string bad;
    if (row >= n_logit_rows_)
      bad = "is outside the step's " + std::to_string(n_logit_rows_) + " logit rows";
    else if (screen_slot_[row] >= 0)
      bad = "is screened already (or named twice)";
    if (!bad.empty()) {
      for (size_t i = 0; i < j; ++i) screen_slot_[rows[i]] = -1;  // as it was
      return Status::invalid("screen_rows: row " + std::to_string(row) + " " + bad);
    }
    screen_slot_[row] = static_cast<int32_t>(screened_ + j);
  }
  if (rows.empty()) return Status::ok();
  const uint32_t dim = config_.dim, vocab = config_.vocab_size, m = static_cast<uint32_t>(rows.size());
  for (uint32_t j = 0; j < m; ++j) std::copy_n(&logit_in_[size_t{rows[j]} * dim], dim, &head_in_[size_t{j} * dim]);
  kernels_->quantize(head_in_.data(), dim, 0, m, dim, kernels::kAct32, screen_qs_.data(), screen_d_.data(),
                     screen_sums_.data());
  const kernels::QuantRows act{screen_qs_.data(), screen_d_.data(), screen_sums_.data(), dim, kernels::kAct32};
  float* out = screen_out_.data() + size_t{screened_} * vocab;
  const kernels::QuantView& view = screen_->view();
  const uint32_t tiles = (vocab + kernels::kQuantTile - 1) / kernels::kQuantTile;
  pool_->parallel_for(tiles, [&](uint32_t t0, uint32_t t1, uint32_t) {
    kernels_->qgemm(act, m, view, t0 * kernels::kQuantTile, std::min(vocab, t1 * kernels::kQuantTile), out, vocab);
  });
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (uint32_t j = 0; j < m; ++j) {
    float* he = &screen_he_[2 * size_t{screened_ + j}];
    const size_t at = size_t{j} * dim;
    if (!screen_->norms(&head_in_[at], &screen_qs_[at], &screen_d_[at / kernels::kAct32], &he[0], &he[1]))
      he[0] = he[1] = nan;
  }
  screened_ += m;
  return Status::ok();
}

int32_t Engine::greedy_token(uint32_t row, uint32_t thread) {
  const uint32_t vocab = config_.vocab_size;
  const int32_t slot = screen_slot_[row];
  const float* x = &logit_in_[size_t{row} * config_.dim];
  const float h = screen_he_[2 * size_t(slot)], e = screen_he_[2 * size_t(slot) + 1];
  int32_t token = -1;
  if (std::isfinite(h) && std::isfinite(e))
    token = screen_->pick(*kernels_, &screen_out_[size_t(slot) * vocab], h, e,
                          &screen_upper_[size_t{thread} * (vocab / kernels::kScreenChunk + 1)],
                          [&](uint32_t panel, float* z) { exact_panel(x, panel, z); });
  if (token >= 0) return token;
  // Not finite somewhere: the full row, as the head computes it, and its argmax.
  float* z = &screen_full_[size_t{thread} * vocab];
  for (uint32_t p = 0; p * kernels::kPanel < vocab; ++p) {
    float panel[kernels::kPanel];
    exact_panel(x, p, panel);
    std::copy_n(panel, std::min(kernels::kPanel, vocab - p * kernels::kPanel), z + size_t{p} * kernels::kPanel);
  }
  float max = 0.0f;
  return static_cast<int32_t>(kernels_->argmax(z, vocab, &max));
}

double Engine::gemm_flops(uint64_t tokens, uint64_t logit_rows) const {
  if (config_.arch->hybrid()) {  // per layer from its matrices' shapes
    double per_token = 0;
    for (const auto& L : layers_)
      for (const Matrix* m : {&L->qkv, &L->wo, &L->gate_up, &L->down}) per_token += 2.0 * m->n * m->k;
    return per_token * tokens + 2.0 * config_.dim * config_.vocab_size * logit_rows;
  }
  const double d = config_.dim, q = config_.q_dim(), kv = config_.kv_dim(), f = config_.ffn_dim;
  const double per_token = 2.0 * config_.n_layers * (d * (q + 2 * kv) + q * d + d * 2 * f + f * d);
  return per_token * tokens + 2.0 * d * config_.vocab_size * logit_rows;
}

// Rows [0, m) of A quantized once per matmul for each activation block its quantized parts
// take (on the pool when there are many rows).
void Engine::quantize_activations(const Matrix& w, const float* a, size_t lda, uint32_t m) {
  for (const Matrix::Part& p : w.parts) {
    if (p.kind == Matrix::Kind::kBf16Pairs) {
      if (act_bf16_source_ == a) continue;  // done for an earlier part
      if (act_bf16_.size() < size_t{m} * w.k) act_bf16_.resize(size_t{m} * w.k);
      act_bf16_source_ = a;
      auto part = [&](uint32_t r0, uint32_t r1, uint32_t) {
        kernels_->round_bf16(a, lda, r0, r1, w.k, act_bf16_.data());
      };
      if (m >= 64) {
        pool_->parallel_for(m, part);
      } else {
        part(0, m, 0);
      }
      continue;
    }
    const uint32_t block = kernels::act_block(p.type);
    if (block == 0) continue;
    ActBuffer& buf = block == kernels::kAct32 ? act32_ : act256_;
    if (buf.rows.k == w.k && buf.m == m && buf.source == a) continue;  // done for an earlier part
    const size_t codes = size_t{m} * w.k;
    if (buf.qs.size() < codes) buf.qs.resize(codes), buf.d.resize(codes / block), buf.sums.resize(codes / 16);
    buf.rows = {buf.qs.data(), buf.d.data(), buf.sums.data(), w.k, block};
    buf.m = m;
    buf.source = a;
    auto part = [&](uint32_t r0, uint32_t r1, uint32_t) {
      kernels_->quantize(a, lda, r0, r1, w.k, block, buf.qs.data(), buf.d.data(), buf.sums.data());
    };
    if (m >= 64) {  // fewer rows cost less than a pass of the pool
      pool_->parallel_for(m, part);
    } else {
      part(0, m, 0);
    }
  }
}

void Engine::matmul(const Matrix& w, const float* a, size_t lda, uint32_t m, float* c) {
  using Kind = Matrix::Kind;
  act32_.source = act256_.source = nullptr;
  act_bf16_source_ = nullptr;
  quantize_activations(w, a, lda, m);
  for (const Matrix::Part& p : w.parts) {
    if (p.kind != Kind::kF32Rows) continue;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(p.n),
                static_cast<int>(w.k), 1.0f, a, static_cast<int>(lda), p.owned, static_cast<int>(w.k), 0.0f, c + p.n0,
                static_cast<int>(w.n));
  }
  const kernels::Kernels& kern = *kernels_;
  // One pass of the pool over every part's units (panels or row groups), in part order.
  auto run = [&](uint32_t u0, uint32_t u1, uint32_t) {
    uint32_t base = 0;
    for (const Matrix::Part& p : w.parts) {
      const uint32_t units = p.units();
      const uint32_t b = std::max(u0, base), e = std::min(u1, base + units);
      if (b < e) {
        const uint32_t lo = b - base, hi = e - base;
        float* out = c + p.n0;
        if (p.kind == Kind::kF32) {
          kern.gemm(a, lda, m, {p.owned, p.n, w.k}, lo, hi, out, w.n);
        } else if (p.kind == Kind::kBf16Pairs) {
          const kernels::PackedPairsView v{reinterpret_cast<const uint16_t*>(p.owned), p.n, w.k};
          kern.gemm_bf16(act_bf16_.data(), m, v, lo, hi, out, w.n);
        } else if (p.kind == Kind::k16) {
          const kernels::Packed16View v{reinterpret_cast<const uint16_t*>(p.owned), p.n, w.k,
                                        p.type == static_cast<uint32_t>(TensorType::kBF16)};
          kern.gemm16(a, lda, m, v, lo, hi, out, w.n);
        } else if (p.kind == Kind::kQuant) {
          const ActBuffer& buf = kernels::act_block(p.type) == kernels::kAct32 ? act32_ : act256_;
          const uint32_t r = kernels::kQuantTile;
          kern.qgemm(buf.rows, m, p.quant, lo * r, std::min(hi * r, p.n), out, w.n);
        }
      }
      base += units;
    }
  };
  if (w.units > 0) pool_->parallel_for(w.units, run);  // none: every part went to cblas_sgemm
}

void Engine::reserve_scratch(uint32_t tokens, uint32_t logit_rows, uint32_t max_keys) {
  const ModelConfig& c = config_;
  if (tokens > cap_tokens_) {
    cap_tokens_ = tokens;
    x_.resize(size_t{tokens} * c.dim);
    xn_.resize(size_t{tokens} * c.dim);
    qkv_.resize(size_t{tokens} * (c.q_dim() + 2 * c.kv_dim()));
    attn_.resize(size_t{tokens} * std::max(c.q_dim(), c.ssm_inner_size));
    if (c.arch->hybrid()) {
      mix_width_ =
          std::max(2 * c.q_dim() + 2 * c.kv_dim(), c.conv_channels() + c.ssm_inner_size + 2 * c.ssm_time_step_rank);
      mix_.resize(size_t{tokens} * mix_width_);
      conv_out_.resize(size_t{tokens} * c.conv_channels());
      gates_.resize(size_t{tokens} * 2 * c.ssm_time_step_rank);
    }
    ffn_.resize(size_t{tokens} * 2 * c.ffn_dim);
    row_seq_.resize(tokens);
    row_pos_.resize(tokens);
    attn_runs_.reserve(tokens + 1);
  }
  if (logit_rows > cap_logit_rows_) {
    cap_logit_rows_ = logit_rows;
    logit_in_.resize(size_t{logit_rows} * c.dim);
    logits_.resize(size_t{logit_rows} * c.vocab_size);
    logit_at_.resize(logit_rows);
    head_in_.resize(size_t{logit_rows} * c.dim);
    screen_slot_.resize(logit_rows);
    if (screen_) {
      screen_out_.resize(size_t{logit_rows} * c.vocab_size);
      screen_he_.resize(2 * size_t{logit_rows});
      screen_qs_.resize(size_t{logit_rows} * c.dim);
      screen_d_.resize(size_t{logit_rows} * c.dim / kernels::kAct32);
      screen_sums_.resize(size_t{logit_rows} * c.dim / 16);
    }
    first_rows_.reserve(logit_rows);
  }
  if (max_keys > cap_keys_) {  // by half again: decode grows the keys a step at a time
    cap_keys_ = std::max(max_keys, cap_keys_ + cap_keys_ / 2);
    const size_t group = c.n_heads / c.n_kv_heads;
    attn_scratch_.resize(size_t{pool_->size()} * kAttentionRows * group *
                         ((cap_keys_ + kAttentionRows - 1 + 15) / 16 * 16));
  }
}

// The F32 window of layer l for every sequence with a tail: row pointers for positions
// [window_first(start_pos) * bt, end), K then V per KV head. Positions before start_pos
// point into the tail where it holds them (else they are read back from the codes into
// scratch: a new tail, or a rollback past what it holds); the step's own positions point
// at their rows of qkv_ (after RoPE). Nothing is copied but those read-backs.
void Engine::point_windows(std::span<const SeqStep> step, KvPool& pool, uint32_t l) {
  const ModelConfig& c = config_;
  const uint32_t hd = c.head_dim(), bt = pool.block_tokens(), n_kv = c.n_kv_heads, qd = c.q_dim(), kvd = c.kv_dim();
  const uint32_t qkv_w = qd + 2 * kvd, ring = pool.tail_tokens(), window = pool.format().f32_window;
  size_t back = 0;  // read-back rows used so far (K and V: 2 * hd floats each)
  for (size_t s = 0; s < step.size(); ++s) {
    const SeqWindow& w = seq_window_[s];
    if (w.at < 0) continue;
    const SeqStep& q = step[s];
    const uint32_t start = q.start_pos, first = w.first;
    const int64_t held_from = tail_held_from(q, bt, window);
    for (uint32_t h = 0; h < n_kv; ++h) {
      const float** kp = w.rows(window_rows_, h);
      const float** vp = kp + w.n;
      for (uint32_t pos = first; pos < start; ++pos)
        if (pos >= held_from) {
          kp[pos - first] = pool.tail_row(l, h, 0, q.tail, pos % ring);
          vp[pos - first] = pool.tail_row(l, h, 1, q.tail, pos % ring);
        } else {
          float* k = &read_back_[back++ * 2 * hd];
          pool.read(l, h, static_cast<uint32_t>(q.blocks[pos / bt]), pos % bt, k, k + hd);
          kp[pos - first] = k;
          vp[pos - first] = k + hd;
        }
      for (uint32_t i = 0; i < q.tokens.size(); ++i) {
        const float* row = &qkv_[size_t{seq_row0_[s] + i} * qkv_w];
        kp[start + i - first] = row + qd + h * hd;
        vp[start + i - first] = row + qd + kvd + h * hd;
      }
    }
  }
}

// After layer l's attention: each tail holds the F32 rows of the window of the step's last
// position, [window_first(end - 1) * bt, end) (a row's place in the tail depends only on its
// position); the rows it does not hold yet are copied in.
void Engine::save_tails(std::span<const SeqStep> step, KvPool& pool, uint32_t l) {
  const uint32_t hd = config_.head_dim(), bt = pool.block_tokens(), n_kv = config_.n_kv_heads;
  const uint32_t ring = pool.tail_tokens(), window = pool.format().f32_window;
  for (size_t s = 0; s < step.size(); ++s) {
    const SeqWindow& w = seq_window_[s];
    if (w.at < 0) continue;
    const SeqStep& q = step[s];
    const uint32_t start = q.start_pos, end = w.first + w.n;
    const int64_t held_from = tail_held_from(q, bt, window);
    for (uint32_t pos = window_first(end - 1, bt, window) * bt; pos < end; ++pos) {
      if (pos < start && pos >= held_from) continue;  // already there
      for (uint32_t h = 0; h < n_kv; ++h) {
        const float* const* kp = w.rows(window_rows_, h);
        std::memcpy(pool.tail_row(l, h, 0, q.tail, pos % ring), kp[pos - w.first], hd * sizeof(float));
        std::memcpy(pool.tail_row(l, h, 1, q.tail, pos % ring), kp[w.n + pos - w.first], hd * sizeof(float));
      }
    }
  }
}

Result<Engine::StepShape> Engine::check_step(std::span<const SeqStep> step, const KvPool& pool,
                                             const StatePool* states) const {
  const ModelConfig& c = config_;
  if (step.empty()) return Status::invalid("forward: empty step");
  if (pool.block_tokens() % 16 != 0) return Status::invalid("forward: KV block size must be a multiple of 16");
  if (pool.n_layers() != c.n_layers || pool.n_kv_heads() != c.n_kv_heads || pool.head_dim() != c.head_dim())
    return Status::invalid("forward: the KV pool was made for another model shape");
  StepShape shape;
  const uint32_t bt = pool.block_tokens();
  for (size_t s = 0; s < step.size(); ++s) {
    const SeqStep& q = step[s];
    // Messages are built only on failure: validation allocates nothing on the hot path.
    auto bad = [s](const std::string& what) {
      return Status::invalid("forward: sequence " + std::to_string(s) + ": " + what);
    };
    if (q.tokens.empty()) return bad("no tokens");
    const uint64_t end = uint64_t{q.start_pos} + q.tokens.size();
    if (end > c.context_length)
      return bad("positions up to " + std::to_string(end) + " exceed the context length " +
                 std::to_string(c.context_length));
    if (q.blocks.size() * uint64_t{bt} < end)
      return bad("block table covers " + std::to_string(q.blocks.size() * bt) + " positions, needs " +
                 std::to_string(end));
    for (int32_t b : q.blocks.first((end + bt - 1) / bt))
      if (b < 0 || static_cast<uint32_t>(b) >= pool.n_blocks())
        return bad("block id " + std::to_string(b) + " is outside the pool of " + std::to_string(pool.n_blocks()));
    for (int32_t t : q.tokens)
      if (t < 0 || static_cast<uint32_t>(t) >= c.vocab_size)
        return bad("token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(c.vocab_size));
    if (!q.tail.empty()) {
      if (pool.tail_blocks() == 0) return bad("has a tail, but this KV pool keeps no F32 window");
      if (q.tail.size() != pool.tail_blocks())
        return bad("tail of " + std::to_string(q.tail.size()) + " blocks, the pool's tails take " +
                   std::to_string(pool.tail_blocks()));
      if (q.tail_end < -1 || q.tail_end > c.context_length)
        return bad("tail_end " + std::to_string(q.tail_end) + " is outside [-1, " + std::to_string(c.context_length) +
                   "]");
      for (int32_t b : q.tail)
        if (b < 0 || static_cast<uint32_t>(b) >= pool.n_blocks())
          return bad("tail block id " + std::to_string(b) + " is outside the pool of " +
                     std::to_string(pool.n_blocks()));
      // Bounds that depend only on the chunk's length (the window reaches back at most
      // f32_window blocks), so a decode step allocates nothing whatever its position.
      const uint64_t back = uint64_t{pool.format().f32_window} * bt;
      shape.window_rows += (back + q.tokens.size()) * 2 * c.n_kv_heads;
      shape.read_back_rows += back * c.n_kv_heads;
    }
    if (pool.ring_blocks()) {
      TANDEM_RETURN_IF_ERROR(check_ring(q, pool, end));
      shape.ring_entries += (end + bt - 1) / bt;
    }
    if (q.n_logits > q.tokens.size())
      return bad("asks logits for " + std::to_string(q.n_logits) + " of " + std::to_string(q.tokens.size()) +
                 " tokens");
    shape.tokens += q.tokens.size();
    shape.logit_rows += q.n_logits;
    shape.max_keys = std::max<uint32_t>(shape.max_keys, static_cast<uint32_t>(end));
  }
  TANDEM_RETURN_IF_ERROR(check_states(step, states));
  if (shape.tokens > (1u << 20))
    return Status::invalid("forward: step of " + std::to_string(shape.tokens) + " tokens is too large");
  return shape;
}

Status Engine::check_ring(const SeqStep& q, const KvPool& pool, uint64_t end) const {
  const uint32_t bt = pool.block_tokens(), w = config_.sliding_window;
  const uint64_t need = (end + bt - 1) / bt;
  // Messages are built only on failure.
  auto bad = [](const std::string& what) { return Status::invalid("forward: ring: " + what); };
  if (q.ring.empty() || q.ring_first + uint64_t{q.ring.size()} < need)
    return bad("blocks " + std::to_string(q.ring_first) + " .. " + std::to_string(q.ring_first + q.ring.size()) +
               " do not reach block " + std::to_string(need - 1));
  const uint64_t seen = q.start_pos + 1 > w ? q.start_pos + 1 - w : 0;  // the first query's first key
  if (uint64_t{q.ring_first} * bt > seen)
    return bad("starts at block " + std::to_string(q.ring_first) + ", but position " + std::to_string(q.start_pos) +
               " sees keys from " + std::to_string(seen));
  for (int32_t b : q.ring)
    if (b < 0 || static_cast<uint32_t>(b) >= pool.ring_blocks())
      return bad("block id " + std::to_string(b) + " is outside the ring pool of " +
                 std::to_string(pool.ring_blocks()));
  return Status::ok();
}

void Engine::lay_out_rings(std::span<const SeqStep> step, const KvPool& pool, const StepShape& shape) {
  if (!pool.ring_blocks()) return;
  if (ring_tables_.size() < shape.ring_entries) ring_tables_.resize(shape.ring_entries);
  if (seq_ring_at_.size() < step.size()) seq_ring_at_.resize(step.size());
  const uint32_t bt = pool.block_tokens();
  size_t at = 0;
  for (size_t s = 0; s < step.size(); ++s) {
    const SeqStep& q = step[s];
    const size_t n = (q.start_pos + q.tokens.size() + bt - 1) / bt;
    seq_ring_at_[s] = at;
    for (size_t b = 0; b < n; ++b) ring_tables_[at + b] = q.ring[b < q.ring_first ? 0 : b - q.ring_first];
    at += n;
  }
}

void Engine::lay_out_step(std::span<const SeqStep> step, const KvPool& pool, const StepShape& shape) {
  const ModelConfig& c = config_;
  const uint32_t bt = pool.block_tokens(), dim = c.dim;
  reserve_scratch(static_cast<uint32_t>(shape.tokens), static_cast<uint32_t>(shape.logit_rows), shape.max_keys);
  n_logit_rows_ = static_cast<uint32_t>(shape.logit_rows);
  // F32 windows: where each sequence's row pointers are (sized once per step; the vectors only grow).
  if (window_rows_.size() < shape.window_rows) window_rows_.resize(shape.window_rows);
  if (read_back_.size() < shape.read_back_rows * 2 * c.head_dim())
    read_back_.resize(shape.read_back_rows * 2 * c.head_dim());
  if (seq_window_.size() < step.size()) seq_window_.resize(step.size()), seq_row0_.resize(step.size());
  lay_out_rings(step, pool, shape);
  uint32_t t = 0;
  int64_t next_window = 0;  // index into window_rows_
  for (size_t s = 0; s < step.size(); ++s) {
    seq_row0_[s] = t;
    seq_window_[s] = SeqWindow{};
    if (!step[s].tail.empty()) {
      SeqWindow& w = seq_window_[s];
      w.at = next_window;
      w.first = window_first(step[s].start_pos, bt, pool.format().f32_window) * bt;
      w.n = step[s].start_pos + static_cast<uint32_t>(step[s].tokens.size()) - w.first;
      next_window += int64_t{w.n} * 2 * c.n_kv_heads;
    }
    for (size_t i = 0; i < step[s].tokens.size(); ++i, ++t) {
      row_seq_[t] = static_cast<uint32_t>(s);
      row_pos_[t] = step[s].start_pos + static_cast<uint32_t>(i);
      read_row(*embeddings_, static_cast<uint64_t>(step[s].tokens[i]), &x_[size_t{t} * dim]);
      if (c.arch->embed_scale)  // Gemma: times sqrt(dim), as llama.cpp's ggml_scale by sqrtf(n_embd)
        for (uint32_t d = 0; d < dim; ++d) x_[size_t{t} * dim + d] *= embed_scale_;
    }
  }
}

// One token's q|k|v row of layer L, in place: biases, the per-head Q/K norms, then RoPE on
// every q and k head at `pos`, pairing (2i, 2i + 1) (kNormal) or (i, i + head_dim / 2) (kNeox).
void Engine::position_qk(const Layer& L, float* row, uint32_t pos) const {
  const ModelConfig& c = config_;
  const uint32_t hd = c.head_dim(), half = c.rope_dim() / 2, n_q = c.n_heads, n_qk = c.n_heads + c.n_kv_heads;
  if (!L.qkv_bias.empty())
    for (size_t i = 0; i < L.qkv_bias.size(); ++i) row[i] = row[i] + L.qkv_bias[i];
  if (!L.q_norm.empty())
    for (uint32_t h = 0; h < n_qk; ++h)
      rms_norm(row + h * hd, (h < n_q ? L.q_norm : L.k_norm).data(), row + h * hd, hd, c.rms_eps);
  const float* cs = &(L.window ? rope_swa_ : rope_)[size_t{pos} * hd];
  if (c.arch->rope == model::RopeType::kNeox) {
    for (uint32_t h = 0; h < n_qk; ++h) {
      float* v = row + h * hd;
      for (uint32_t i = 0; i < half; ++i) {
        const float x0 = v[i], x1 = v[i + half], co = cs[2 * i], si = cs[2 * i + 1];
        v[i] = x0 * co - x1 * si;
        v[i + half] = x0 * si + x1 * co;
      }
    }
    return;
  }
  for (uint32_t h = 0; h < n_qk; ++h) {
    float* v = row + h * hd;
    for (uint32_t i = 0; i < hd; i += 2) {
      const float x0 = v[i], x1 = v[i + 1], co = cs[i], si = cs[i + 1];
      v[i] = x0 * co - x1 * si;
      v[i + 1] = x0 * si + x1 * co;
    }
  }
}

// Every new token's q and k positioned (position_qk), then its K/V into the cache before any
// attention reads it.
void Engine::rope_and_store(std::span<const SeqStep> step, KvPool& pool, uint32_t l, uint32_t T) {
  const ModelConfig& c = config_;
  const uint32_t hd = c.head_dim(), qd = c.q_dim(), kvd = c.kv_dim(), n_kv = c.n_kv_heads, qkv_w = qd + 2 * kvd;
  const uint32_t bt = pool.block_tokens();
  const Layer& L = *layers_[l];
  for (uint32_t t = 0; t < T; ++t) {
    float* row = &qkv_[size_t{t} * qkv_w];
    const uint32_t pos = row_pos_[t];
    position_qk(L, row, pos);
    const uint32_t blk = static_cast<uint32_t>(layer_table(step, pool, l, row_seq_[t])[pos / bt]);
    for (uint32_t h = 0; h < n_kv; ++h) pool.write(l, h, blk, pos % bt, row + qd + h * hd, row + qd + kvd + h * hd);
  }
}

// Attention of every (token, KV head) pair of layer l over the cache, on the thread pool;
// a quantized layer with F32 windows reads each query's nearest keys from the window rows.
void Engine::attend(std::span<const SeqStep> step, const KvPool& pool, uint32_t l, uint32_t T, bool window_layer,
                    uint32_t max_keys) {
  const ModelConfig& c = config_;
  const uint32_t qd = c.q_dim(), hd = c.head_dim(), n_kv = c.n_kv_heads, group = c.n_heads / n_kv;
  const uint32_t qkv_w = qd + 2 * c.kv_dim(), bt = pool.block_tokens();
  const float scale = c.attention_scale();  // 1 / sqrt(head_dim) but Gemma 27B's
  const uint32_t window = layers_[l]->window;
  const size_t scratch_per_thread = size_t{kAttentionRows} * group * ((max_keys + kAttentionRows - 1 + 15) / 16 * 16);
  // Work items: runs of up to kAttentionRows consecutive positions of one sequence (a prompt
  // chunk, a speculative round), which the kernels attend at once, times KV heads. Not with a
  // sliding window, an F32 window of a quantized cache or rotated KV (each row alone there).
  const bool runs = window == 0 && !window_layer && !(pool.layer_bits(l) && pool.format().rotated());
  attn_runs_.clear();
  for (uint32_t t = 0; t < T; ++t)
    if (!runs || t == 0 || row_seq_[t] != row_seq_[t - 1] || row_pos_[t] != row_pos_[t - 1] + 1 ||
        t - attn_runs_.back() == kAttentionRows)
      attn_runs_.push_back(t);
  const auto n_runs = static_cast<uint32_t>(attn_runs_.size());
  attn_runs_.push_back(T);
  std::atomic<uint32_t> next{0};
  const uint32_t items = n_runs * n_kv;
  const auto attention = kernels_->attention;
  auto work = [&](uint32_t thread) {
    kernels::AttentionArgs a;
    a.n_q = group;
    a.head_dim = hd;
    a.block_tokens = bt;
    a.kv_bits = pool.layer_bits(l);
    a.group_size = pool.group_size();
    a.kv_rotated = a.kv_bits && pool.format().rotated();
    if (a.kv_rotated) {
      a.k_signs = pool.rotation_signs(l, 0);
      a.v_signs = pool.rotation_signs(l, 1);
      a.levels = pool.rotation_levels()->levels;
    }
    a.block_bytes = pool.region_block_bytes(l);
    a.block_stride = a.block_bytes / sizeof(float);
    a.scale = scale;
    a.softcap = c.attn_softcap;
    a.scores = attn_scratch_.data() + thread * scratch_per_thread;
    a.q_row_stride = qkv_w;
    a.out_row_stride = qd;
    for (uint32_t it; (it = next.fetch_add(1, std::memory_order_relaxed)) < items;) {
      const uint32_t run = it / n_kv, h = it % n_kv, t = attn_runs_[run];
      a.rows = attn_runs_[run + 1] - t;
      a.q = &qkv_[size_t{t} * qkv_w + size_t{h} * group * hd];
      a.blocks = layer_table(step, pool, l, row_seq_[t]);
      a.k_bytes = pool.block_data(l, h, 0, 0);
      a.v_bytes = pool.block_data(l, h, 1, 0);
      a.k_base = reinterpret_cast<const float*>(a.k_bytes);
      a.v_base = reinterpret_cast<const float*>(a.v_bytes);
      a.n_keys = row_pos_[t] + 1;
      a.first_key = window != 0 && a.n_keys > window ? a.n_keys - window : 0;  // keys p - W + 1 .. p
      a.out = &attn_[size_t{t} * qd + size_t{h} * group * hd];
      a.win_k = a.win_v = nullptr;
      if (const SeqWindow& w = seq_window_[row_seq_[t]]; window_layer && w.at >= 0) {
        a.f32_from = window_first(row_pos_[t], bt, pool.format().f32_window) * bt;
        a.win_k = w.rows(window_rows_, h) + (a.f32_from - w.first);
        a.win_v = a.win_k + w.n;
      }
      attention(a);
    }
  };
  pool_->run(work);
}

// x += down(silu(gate(norm(x))) * up(norm(x))) for the step's T rows.
void Engine::feed_forward(const Layer& L, uint32_t T) {
  const ModelConfig& c = config_;
  const uint32_t dim = c.dim, ffn = c.ffn_dim;
  for (uint32_t t = 0; t < T; ++t)
    rms_norm(&x_[size_t{t} * dim], L.ffn_norm.data(), &xn_[size_t{t} * dim], dim, c.rms_eps);
  matmul(L.gate_up, xn_.data(), dim, T, ffn_.data());
  const bool gelu = c.arch->ffn == model::Activation::kGeluTanh;
  for (uint32_t t = 0; t < T; ++t) {
    float* g = &ffn_[size_t{t} * 2 * ffn];
    if (gelu) {
      gelu_tanh_mul(g, g + ffn, ffn);
    } else {
      kernels_->silu_mul(g, g + ffn, g, ffn);  // in place: out[i] depends on g[i], u[i] only
    }
  }
  matmul(L.down, ffn_.data(), 2 * ffn, T, xn_.data());
  add_residual(L.post_ffn_norm, T);
}

Status Engine::forward(std::span<const SeqStep> step, KvPool& pool, StatePool* states, LogitRows logit_rows) {
  auto shape = check_step(step, pool, states);
  if (!shape) return shape.status();
  lay_out_step(step, pool, *shape);
  const auto T = static_cast<uint32_t>(shape->tokens);
  if (config_.arch->hybrid())
    for (const SeqStep& q : step)
      if (q.start_pos == 0) states->reset(static_cast<uint32_t>(q.state_slot));
  for (uint32_t l = 0; l < config_.n_layers; ++l) {
    if (layers_[l]->recurrent) {
      recurrent_block(step, *states, l, T);
    } else {
      attention_block(step, pool, l, *shape);
    }
    feed_forward(*layers_[l], T);
    if (between_layers_) between_layers_();
  }
  compute_logits(step, logit_rows);
  if (config_.arch->hybrid())
    for (const SeqStep& q : step)
      states->advance(static_cast<uint32_t>(q.state_slot), static_cast<uint32_t>(q.tokens.size()));
  return Status::ok();
}

void Engine::attention_block(std::span<const SeqStep> step, KvPool& pool, uint32_t l, const StepShape& shape) {
  const ModelConfig& c = config_;
  const Layer& L = *layers_[l];
  const auto T = static_cast<uint32_t>(shape.tokens);
  const uint32_t dim = c.dim;
  for (uint32_t t = 0; t < T; ++t)
    rms_norm(&x_[size_t{t} * dim], L.attn_norm.data(), &xn_[size_t{t} * dim], dim, c.rms_eps);
  if (c.arch->hybrid()) {
    matmul(L.qkv, xn_.data(), dim, T, mix_.data());
    mix_stride_ = L.qkv.n;
    split_gated_query(T);
  } else {
    matmul(L.qkv, xn_.data(), dim, T, qkv_.data());
  }
  rope_and_store(step, pool, l, T);
  const bool window_layer = shape.window_rows > 0 && pool.layer_bits(l) != 0;
  if (window_layer) point_windows(step, pool, l);
  attend(step, pool, l, T, window_layer, shape.max_keys);
  if (window_layer) save_tails(step, pool, l);
  if (c.arch->hybrid()) apply_output_gate(T);
  matmul(L.wo, attn_.data(), c.q_dim(), T, xn_.data());
  add_residual(L.post_attn_norm, T);
}

// x += xn for the step's T rows, xn first RMS-normalised by `post_norm` when there is one (Gemma).
void Engine::add_residual(const std::vector<float>& post_norm, uint32_t T) {
  const uint32_t dim = config_.dim;
  if (!post_norm.empty())
    for (uint32_t t = 0; t < T; ++t)
      rms_norm(&xn_[size_t{t} * dim], post_norm.data(), &xn_[size_t{t} * dim], dim, config_.rms_eps);
  for (size_t i = 0; i < size_t{T} * dim; ++i) x_[i] = x_[i] + xn_[i];
}

void Engine::compute_logits(std::span<const SeqStep> step, LogitRows which) {
  const uint32_t dim = config_.dim;
  uint32_t r = 0, t = 0;
  first_rows_.clear();
  for (const SeqStep& q : step) {
    const auto n = static_cast<uint32_t>(q.tokens.size());
    if (q.n_logits > 0) first_rows_.push_back(r);
    for (uint32_t i = n - q.n_logits; i < n; ++i, ++r)
      rms_norm(&x_[size_t(t + i) * dim], output_norm_.data(), &logit_in_[size_t{r} * dim], dim, config_.rms_eps);
    t += n;
  }
  logits_filled_ = 0;
  screened_ = 0;
  std::fill_n(screen_slot_.begin(), n_logit_rows_, -1);
  if (which == LogitRows::kNone || (which == LogitRows::kFirstPerSequence && first_rows_.size() < n_logit_rows_)) {
    std::fill_n(logit_at_.begin(), n_logit_rows_, nullptr);
    if (which == LogitRows::kFirstPerSequence) head_rows(first_rows_);
    return;
  }
  if (n_logit_rows_ > 0) matmul(*output_, logit_in_.data(), dim, n_logit_rows_, logits_.data());
  if (config_.final_softcap > 0.0f)
    soft_cap(logits_.data(), size_t{n_logit_rows_} * config_.vocab_size, config_.final_softcap);
  for (uint32_t row = 0; row < n_logit_rows_; ++row) logit_at_[row] = logits_.data() + size_t{row} * config_.vocab_size;
  logits_filled_ = n_logit_rows_;
}

void Engine::head_rows(std::span<const uint32_t> rows) {
  const uint32_t dim = config_.dim;
  for (size_t j = 0; j < rows.size(); ++j) std::copy_n(&logit_in_[size_t{rows[j]} * dim], dim, &head_in_[j * dim]);
  float* out = logits_.data() + size_t{logits_filled_} * config_.vocab_size;
  if (!rows.empty()) matmul(*output_, head_in_.data(), dim, static_cast<uint32_t>(rows.size()), out);
  if (config_.final_softcap > 0.0f) soft_cap(out, rows.size() * config_.vocab_size, config_.final_softcap);
  for (size_t j = 0; j < rows.size(); ++j) logit_at_[rows[j]] = out + j * config_.vocab_size;
  logits_filled_ += static_cast<uint32_t>(rows.size());
}

Status Engine::compute_logit_rows(std::span<const uint32_t> rows) {
  for (size_t j = 0; j < rows.size(); ++j) {
    const uint32_t row = rows[j];
    std::string bad;
    if (row >= n_logit_rows_)
      bad = "is outside the step's " + std::to_string(n_logit_rows_) + " logit rows";
    else if (logit_at_[row] != nullptr)
      bad = "is computed already (or named twice)";
    if (!bad.empty()) {
      for (size_t i = 0; i < j; ++i) logit_at_[rows[i]] = nullptr;  // as it was
      return Status::invalid("compute_logit_rows: row " + std::to_string(row) + " " + bad);
    }
    logit_at_[row] = logits_.data();  // taken: a second mention is refused
  }
  head_rows(rows);
  return Status::ok();
}

void Engine::run_gemms_only(uint32_t tokens, uint32_t logit_rows) {
  reserve_scratch(tokens, logit_rows, 16);
  const uint32_t dim = config_.dim, ffn = config_.ffn_dim;
  float* first = config_.arch->hybrid() ? mix_.data() : qkv_.data();
  for (const auto& L : layers_) {
    matmul(L->qkv, xn_.data(), dim, tokens, first);
    matmul(L->wo, attn_.data(), L->wo.k, tokens, xn_.data());
    matmul(L->gate_up, xn_.data(), dim, tokens, ffn_.data());
    matmul(L->down, ffn_.data(), 2 * ffn, tokens, xn_.data());
  }
  if (logit_rows > 0) matmul(*output_, logit_in_.data(), dim, logit_rows, logits_.data());
}

}  // namespace tandem::engine

namespace tandem::engine {

// ---- Hybrid (qwen35) layers: docs/HYBRID.md -------------------------------------------------

Status Engine::check_states(std::span<const SeqStep> step, const StatePool* states) const {
  if (!config_.arch->hybrid()) return Status::ok();
  if (states == nullptr) return Status::invalid("forward: a hybrid model needs a recurrent state pool");
  for (size_t s = 0; s < step.size(); ++s) {
    const SeqStep& q = step[s];
    auto bad = [s](const std::string& what) {
      return Status::invalid("forward: sequence " + std::to_string(s) + ": " + what);
    };
    if (q.state_slot < 0 || static_cast<uint32_t>(q.state_slot) >= states->slots())
      return bad("state slot " + std::to_string(q.state_slot) + " is outside the pool of " +
                 std::to_string(states->slots()));
    const uint32_t at = states->position(static_cast<uint32_t>(q.state_slot));
    if (q.start_pos != 0 && at != q.start_pos)
      return bad("its recurrent state holds " + std::to_string(at) + " positions, the chunk starts at " +
                 std::to_string(q.start_pos) + " (roll it back first: StatePool::roll_back)");
    for (size_t o = 0; o < s; ++o)
      if (step[o].state_slot == q.state_slot) return bad("shares state slot " + std::to_string(q.state_slot));
  }
  return Status::ok();
}

// The attention GEMM of a hybrid wrote per head [query | gate] then k, v into mix_: queries,
// keys and values go to qkv_ in the usual layout; the gates stay in mix_ for apply_output_gate.
void Engine::split_gated_query(uint32_t T) {
  const ModelConfig& c = config_;
  const uint32_t hd = c.head_dim(), qd = c.q_dim(), kvd = c.kv_dim(), qkv_w = qd + 2 * kvd;
  for (uint32_t t = 0; t < T; ++t) {
    const float* in = &mix_[size_t{t} * mix_stride_];
    float* out = &qkv_[size_t{t} * qkv_w];
    for (uint32_t h = 0; h < c.n_heads; ++h) std::memcpy(out + h * hd, in + 2 * h * hd, hd * sizeof(float));
    std::memcpy(out + qd, in + 2 * qd, 2 * kvd * sizeof(float));
  }
}

// attn_ *= sigmoid(gate), per head, before the output projection.
void Engine::apply_output_gate(uint32_t T) {
  const ModelConfig& c = config_;
  const uint32_t hd = c.head_dim(), qd = c.q_dim();
  for (uint32_t t = 0; t < T; ++t) {
    const float* in = &mix_[size_t{t} * mix_stride_];
    float* o = &attn_[size_t{t} * qd];
    for (uint32_t h = 0; h < c.n_heads; ++h)
      for (uint32_t i = 0; i < hd; ++i) {
        const float g = in[2 * h * hd + hd + i];
        o[h * hd + i] = o[h * hd + i] * (1.0f / (1.0f + std::exp(-g)));
      }
  }
}

// Every row's conv output and gates of a recurrent layer, on the pool; then each slot's conv
// state becomes its chunk's last K - 1 inputs. Row i of a sequence's chunk reads the inputs of
// positions i - K + 1 .. i: the chunk's rows, or the conv state before them (unchanged until
// every row is done); the same floats in the same order whatever the chunking.
void Engine::conv_inputs(std::span<const SeqStep> step, const Layer& L, StatePool& states, uint32_t T) {
  const ModelConfig& c = config_;
  const uint32_t K = c.ssm_conv_kernel, C = c.conv_channels(), hv = c.ssm_time_step_rank, vd = c.ssm_inner_size;
  const hybrid::DeltaNetShape shape{K, C, c.ssm_group_count, hv, c.ssm_state_size, c.rms_eps};
  auto conv = [&](size_t s) { return states.conv(static_cast<uint32_t>(step[s].state_slot), L.rec_index); };
  // Input i of the chunk; negative: the slot's inputs before it (the conv state, and before
  // that the rows kept for rollback), a signed offset from the conv state's first row.
  auto input = [&](size_t s, int64_t i) -> const float* {
    return i >= 0 ? &mix_[size_t(seq_row0_[s] + i) * mix_stride_] : conv(s) + (int64_t{K} - 1 + i) * int64_t{C};
  };
  pool_->parallel_for(T, [&](uint32_t r0, uint32_t r1, uint32_t) {
    const float* window[64];  // K <= 64 (model_config)
    for (uint32_t r = r0; r < r1; ++r) {
      const uint32_t s = row_seq_[r];
      const int64_t i = int64_t{r} - seq_row0_[s];
      for (uint32_t m = 0; m < K; ++m) window[m] = input(s, i - K + 1 + m);
      hybrid::conv_token(shape, L.conv_kernel.data(), window, &conv_out_[size_t{r} * C]);
      const float* row = &mix_[size_t{r} * mix_stride_];
      hybrid::gates(hv, row + C + vd + hv, row + C + vd, L.dt_bias.data(), L.ssm_a.data(), &gates_[size_t{r} * 2 * hv],
                    &gates_[size_t{r} * 2 * hv + hv]);
    }
  });
  // The slot's inputs (the rollback() kept before the conv state's K - 1): new row j of H is
  // input n - H + j; in increasing j an old row is read before it is written.
  const uint32_t H = states.rollback() + K - 1;
  for (size_t s = 0; s < step.size(); ++s) {
    const auto n = static_cast<int64_t>(step[s].tokens.size());
    float* rows = conv(s) - size_t{states.rollback()} * C;
    for (uint32_t j = 0; j < H; ++j) {
      const float* src = input(s, n - H + j);
      float* dst = rows + size_t{j} * C;
      if (src != dst) std::memmove(dst, src, C * sizeof(float));
    }
  }
}

// The keys a chunked delta rule finds in the slot (hybrid::delta_rows): before it, the rows of
// each call's first grid chunk; after it (first = false), the rows of the call's last grid chunk
// when the call reaches past a grid point.
void Engine::store_chunk_keys(std::span<const SeqStep> step, StatePool& states, const Layer& L, bool first) {
  const ModelConfig& c = config_;
  const uint32_t C = c.conv_channels(), d = c.ssm_state_size, hk = c.ssm_group_count;
  const hybrid::ChunkLayout lay{d, c.ssm_time_step_rank, hk};
  for (size_t s = 0; s < step.size(); ++s) {
    const uint32_t pos = step[s].start_pos, end = pos + static_cast<uint32_t>(step[s].tokens.size());
    const uint32_t from = first ? pos : end / hybrid::kGrid * hybrid::kGrid;
    const uint32_t to = first ? std::min(end, (pos / hybrid::kGrid + 1) * hybrid::kGrid) : end;
    if (!first && (from <= pos || from == end)) continue;
    float* layer = states.recurrent(static_cast<uint32_t>(step[s].state_slot), L.rec_index);
    const float* k = &conv_out_[size_t(seq_row0_[s] + from - pos) * C + hk * d];
    for (uint32_t i = 0; i < hk; ++i)
      hybrid::store_keys(k + i * d, C, from, to - from, d, hybrid::key_rows(layer, lay, i));
  }
}

// Per (sequence, V head), on the thread pool: the delta rule over the sequence's rows (the
// chunked form or token by token, EngineOptions::delta), then the gated norm, into attn_.
void Engine::delta_heads(std::span<const SeqStep> step, StatePool& states, const Layer& L) {
  const ModelConfig& c = config_;
  const uint32_t C = c.conv_channels(), hv = c.ssm_time_step_rank, hk = c.ssm_group_count;
  const uint32_t d = c.ssm_state_size, vd = c.ssm_inner_size, kd = hk * d;
  const hybrid::ChunkLayout lay{d, hv, hk};
  const size_t scratch = hybrid::chunk_scratch_floats(d);
  std::atomic<uint32_t> next{0};
  const auto items = static_cast<uint32_t>(step.size()) * hv;
  auto work = [&](uint32_t thread) {
    for (uint32_t it; (it = next.fetch_add(1, std::memory_order_relaxed)) < items;) {
      const uint32_t s = it / hv, j = it % hv, i = j % hk;  // GGUF's tiled order: V head j reads Q/K head j mod H_k
      const SeqStep& q = step[s];
      const auto n = static_cast<uint32_t>(q.tokens.size());
      float* layer = states.recurrent(static_cast<uint32_t>(q.state_slot), L.rec_index);
      const hybrid::HeadState st = hybrid::head_state(layer, lay, j);
      const float* u = &conv_out_[size_t{seq_row0_[s]} * C];
      const float* g = &gates_[size_t{seq_row0_[s]} * 2 * hv];
      float* o = &attn_[size_t{seq_row0_[s]} * vd + j * d];
      if (options_.delta == DeltaForm::kChunked) {
        const hybrid::HeadRows in{u + i * d, u + kd + i * d, u + 2 * kd + j * d, C, g + j, g + hv + j, 2 * hv};
        hybrid::delta_rows(*kernels_, lay, st, hybrid::key_rows(layer, lay, i), in, q.start_pos, n, o, vd,
                           delta_scratch_.data() + thread * scratch);
      } else {  // S kept row-major where the chunked form keeps S0
        for (uint32_t r = 0; r < n; ++r)
          hybrid::delta_step(st.s0, u + r * C + i * d, u + r * C + kd + i * d, u + r * C + 2 * kd + j * d,
                             g[r * 2 * hv + j], g[r * 2 * hv + hv + j], d, o + r * vd);
      }
      for (uint32_t r = 0; r < n; ++r)
        hybrid::gated_norm(o + r * vd, L.ssm_norm.data(), &mix_[size_t(seq_row0_[s] + r) * mix_stride_ + C + j * d], d,
                           c.rms_eps, o + r * vd);
    }
  };
  pool_->run(work);
}

// A Gated DeltaNet block: norm, the fused projection (q|k|v conv inputs, z, beta, alpha), the
// conv and gates per sequence, the delta rule and gated norm per (sequence, V head), the output
// projection and the residual.
void Engine::recurrent_block(std::span<const SeqStep> step, StatePool& states, uint32_t l, uint32_t T) {
  const ModelConfig& c = config_;
  const Layer& L = *layers_[l];
  const uint32_t dim = c.dim;
  for (uint32_t t = 0; t < T; ++t)
    rms_norm(&x_[size_t{t} * dim], L.attn_norm.data(), &xn_[size_t{t} * dim], dim, c.rms_eps);
  matmul(L.qkv, xn_.data(), dim, T, mix_.data());
  mix_stride_ = L.qkv.n;
  conv_inputs(step, L, states, T);
  const bool chunked = options_.delta == DeltaForm::kChunked;
  if (chunked) store_chunk_keys(step, states, L, true);
  delta_heads(step, states, L);
  if (chunked) store_chunk_keys(step, states, L, false);
  matmul(L.wo, attn_.data(), c.ssm_inner_size, T, xn_.data());
  for (size_t i = 0; i < size_t{T} * dim; ++i) x_[i] = x_[i] + xn_[i];
}

}  // namespace tandem::engine
