#include "model/architecture.h"

#include <iterator>

#include "model/model_config.h"

namespace tandem::model {

namespace {

constexpr uint64_t kMaxSize = kMaxHyperParameter;
constexpr uint64_t kMaxContext = uint64_t{1} << 24;

// The keys llama.cpp's convert script writes for a Llama-like model, in its order.
constexpr UintParam kLlamaUints[] = {
    {"context_length", &ModelConfig::context_length, kMaxContext},
    {"embedding_length", &ModelConfig::dim, kMaxSize},
    {"block_count", &ModelConfig::n_layers, kMaxSize},
    {"feed_forward_length", &ModelConfig::ffn_dim, kMaxSize},
    {"attention.head_count", &ModelConfig::n_heads, kMaxSize},
    {"attention.head_count_kv", &ModelConfig::n_kv_heads, kMaxSize, &ModelConfig::n_heads},
};

constexpr FloatParam kLlamaFloats[] = {
    {"rope.freq_base", &ModelConfig::rope_freq_base, 10000.0f},
    {"attention.layer_norm_rms_epsilon", &ModelConfig::rms_eps, 1e-5f},
};

using enum LayerTensor;
using enum Dim;

// Indexed by LayerTensor.
constexpr std::string_view kTensorNames[] = {
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
};

constexpr TensorSpec kLlamaBlock[] = {
    {kAttnNorm, kModel, kModel, true}, {kAttnQ, kModel, kQ, false},      {kAttnK, kModel, kKv, false},
    {kAttnV, kModel, kKv, false},      {kAttnOutput, kQ, kModel, false}, {kFfnNorm, kModel, kModel, true},
    {kFfnGate, kModel, kFfn, false},   {kFfnUp, kModel, kFfn, false},    {kFfnDown, kFfn, kModel, false},
};

constexpr Architecture kArchitectures[] = {
    {.name = "llama",
     .rope = RopeType::kNormal,
     .norm = NormVariant::kRms,
     .uints = kLlamaUints,
     .floats = kLlamaFloats,
     .layer_tensors = kLlamaBlock},
};

static_assert(std::size(kTensorNames) == static_cast<size_t>(kFfnDown) + 1, "a name for every LayerTensor");

}  // namespace

uint64_t dim_size(Dim dim, const ModelConfig& c) {
  switch (dim) {
    case kModel: return c.dim;
    case kQ: return uint64_t{c.n_heads} * c.head_dim();
    case kKv: return c.kv_dim();
    case kFfn: return c.ffn_dim;
  }
  return 0;
}

const TensorSpec* Architecture::find(LayerTensor role) const {
  for (const TensorSpec& t : layer_tensors)
    if (t.role == role) return &t;
  return nullptr;
}

const Architecture* find_architecture(std::string_view name) {
  for (const Architecture& a : kArchitectures)
    if (a.name == name) return &a;
  return nullptr;
}

std::string architecture_names() {
  std::string names;
  for (const Architecture& a : kArchitectures) names += (names.empty() ? "'" : ", '") + std::string(a.name) + "'";
  return names;
}

const Architecture* default_architecture() { return &kArchitectures[0]; }

std::string layer_tensor(uint32_t layer, std::string_view name) {
  return "blk." + std::to_string(layer) + "." + std::string(name) + ".weight";
}

std::string_view tensor_name(LayerTensor role) { return kTensorNames[static_cast<size_t>(role)]; }

std::string layer_tensor(uint32_t layer, LayerTensor role) { return layer_tensor(layer, tensor_name(role)); }

}  // namespace tandem::model
