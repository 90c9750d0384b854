#include "model/architecture.h"

#include <iterator>

#include "model/model_config.h"

namespace tandem::model {

namespace {

constexpr uint64_t kMaxSize = kMaxHyperParameter;
constexpr uint64_t kMaxContext = uint64_t{1} << 24;

constexpr uint32_t absent(const ModelConfig&) { return 0; }
constexpr uint32_t all_heads(const ModelConfig& c) { return c.n_heads; }

// The keys llama.cpp's convert script writes for a Llama-like model, in its order, then
// key_length (a head_dim other than embedding_length / head_count, as Qwen3's), which llama.cpp
// reads for every architecture. The rope.scaling.* keys are read beside these, for every
// architecture as llama.cpp does (read_model_config).
constexpr UintParam kLlamaUints[] = {
    {"context_length", &ModelConfig::context_length, kMaxContext},
    {"embedding_length", &ModelConfig::dim, kMaxSize},
    {"block_count", &ModelConfig::n_layers, kMaxSize},
    {"feed_forward_length", &ModelConfig::ffn_dim, kMaxSize},
    {"attention.head_count", &ModelConfig::n_heads, kMaxSize},
    {"attention.head_count_kv", &ModelConfig::n_kv_heads, kMaxSize, all_heads},
    {"attention.key_length", &ModelConfig::key_length, kMaxSize, absent},
};

constexpr FloatParam kLlamaFloats[] = {
    {"rope.freq_base", &ModelConfig::rope_freq_base, 10000.0f},
    {"attention.layer_norm_rms_epsilon", &ModelConfig::rms_eps, 1e-5f},
};

using enum LayerTensor;
using enum Dim;

using enum Presence;

// Indexed by LayerTensor.
constexpr std::string_view kTensorNames[] = {
    "attn_norm", "attn_q",    "attn_k",      "attn_v",      "attn_output",
    "ffn_norm",  "ffn_gate",  "ffn_up",      "ffn_down",    "attn_q",
    "attn_k",    "attn_v",    "attn_q_norm", "attn_k_norm", "post_attention_norm",
    "attn_qkv",  "attn_gate", "ssm_conv1d",  "ssm_dt",      "ssm_a",
    "ssm_beta",  "ssm_alpha", "ssm_norm",    "ssm_out",     "post_ffw_norm",
};

// Every architecture's block in llama.cpp (src/models/{llama,qwen2,qwen3}.cpp); Q/K/V biases are
// optional in all three (create_tensor_qkv), output and FFN biases tandem does not compute.
constexpr TensorSpec kLlamaBlock[] = {
    {kAttnNorm, kModel, kModel, true}, {kAttnQ, kModel, kQ, false},         {kAttnK, kModel, kKv, false},
    {kAttnV, kModel, kKv, false},      {kAttnOutput, kQ, kModel, false},    {kFfnNorm, kModel, kModel, true},
    {kFfnGate, kModel, kFfn, false},   {kFfnUp, kModel, kFfn, false},       {kFfnDown, kFfn, kModel, false},
    {kAttnQBias, kQ, kQ, true, kRare}, {kAttnKBias, kKv, kKv, true, kRare}, {kAttnVBias, kKv, kKv, true, kRare},
};

constexpr TensorSpec kQwen2Block[] = {
    {kAttnNorm, kModel, kModel, true},       {kAttnQ, kModel, kQ, false},
    {kAttnQBias, kQ, kQ, true, kOptional},   {kAttnK, kModel, kKv, false},
    {kAttnKBias, kKv, kKv, true, kOptional}, {kAttnV, kModel, kKv, false},
    {kAttnVBias, kKv, kKv, true, kOptional}, {kAttnOutput, kQ, kModel, false},
    {kFfnNorm, kModel, kModel, true},        {kFfnGate, kModel, kFfn, false},
    {kFfnUp, kModel, kFfn, false},           {kFfnDown, kFfn, kModel, false},
};

constexpr TensorSpec kQwen3Block[] = {
    {kAttnNorm, kModel, kModel, true},   {kAttnQ, kModel, kQ, false},         {kAttnK, kModel, kKv, false},
    {kAttnV, kModel, kKv, false},        {kAttnQNorm, kHead, kHead, true},    {kAttnKNorm, kHead, kHead, true},
    {kAttnOutput, kQ, kModel, false},    {kFfnNorm, kModel, kModel, true},    {kFfnGate, kModel, kFfn, false},
    {kFfnUp, kModel, kFfn, false},       {kFfnDown, kFfn, kModel, false},     {kAttnQBias, kQ, kQ, true, kRare},
    {kAttnKBias, kKv, kKv, true, kRare}, {kAttnVBias, kKv, kKv, true, kRare},
};

// qwen35 (llama.cpp src/models/qwen35.cpp, docs/HYBRID.md): the llama keys, then the delta
// net's; full_attention_interval defaults to 4 as in llama.cpp. rope.dimension_sections and
// attention.recurrent_layers (arrays) are read beside these (model_config.cpp).
constexpr uint32_t every_fourth(const ModelConfig&) { return 4; }
constexpr UintParam kQwen35Uints[] = {
    {"context_length", &ModelConfig::context_length, kMaxContext},
    {"embedding_length", &ModelConfig::dim, kMaxSize},
    {"block_count", &ModelConfig::n_layers, kMaxSize},
    {"feed_forward_length", &ModelConfig::ffn_dim, kMaxSize},
    {"attention.head_count", &ModelConfig::n_heads, kMaxSize},
    {"attention.head_count_kv", &ModelConfig::n_kv_heads, kMaxSize, all_heads},
    {"attention.key_length", &ModelConfig::key_length, kMaxSize, absent},
    {"ssm.conv_kernel", &ModelConfig::ssm_conv_kernel, 64},
    {"ssm.state_size", &ModelConfig::ssm_state_size, kMaxSize},
    {"ssm.group_count", &ModelConfig::ssm_group_count, kMaxSize},
    {"ssm.time_step_rank", &ModelConfig::ssm_time_step_rank, kMaxSize},
    {"ssm.inner_size", &ModelConfig::ssm_inner_size, kMaxSize},
    {"full_attention_interval", &ModelConfig::full_attention_interval, kMaxSize, every_fourth},
};

constexpr FloatParam kQwen35Floats[] = {
    {"rope.freq_base", &ModelConfig::rope_freq_base, 10000000.0f},
    {"attention.layer_norm_rms_epsilon", &ModelConfig::rms_eps, 1e-6f},
};

// Full-attention layers: the gated query (query and gate per head), Q/K norms, post-attention norm.
constexpr TensorSpec kQwen35AttentionBlock[] = {
    {kAttnNorm, kModel, kModel, true}, {kAttnQ, kModel, kQGated, false},      {kAttnK, kModel, kKv, false},
    {kAttnV, kModel, kKv, false},      {kAttnOutput, kQ, kModel, false},      {kAttnQNorm, kHead, kHead, true},
    {kAttnKNorm, kHead, kHead, true},  {kPostAttnNorm, kModel, kModel, true}, {kFfnGate, kModel, kFfn, false},
    {kFfnUp, kModel, kFfn, false},     {kFfnDown, kFfn, kModel, false},
};

// Gated DeltaNet layers.
constexpr TensorSpec kQwen35RecurrentBlock[] = {
    {kAttnNorm, kModel, kModel, true},      {kAttnQkv, kModel, kConvChannels, false},
    {kAttnGate, kModel, kVInner, false},    {kSsmConv1d, kConvKernel, kConvChannels, false},
    {kSsmDt, kVHeads, kVHeads, true},       {kSsmA, kVHeads, kVHeads, true},
    {kSsmBeta, kModel, kVHeads, false},     {kSsmAlpha, kModel, kVHeads, false},
    {kSsmNorm, kSsmState, kSsmState, true}, {kSsmOut, kVInner, kModel, false},
    {kPostAttnNorm, kModel, kModel, true},  {kFfnGate, kModel, kFfn, false},
    {kFfnUp, kModel, kFfn, false},          {kFfnDown, kFfn, kModel, false},
};

// Gemma 2 and 3 (llama.cpp src/models/gemma2.cpp, gemma3.cpp): the llama keys, then the window
// and soft-capping keys. A fallback of 0 is "absent": Gemma 2's window defaults to 4096 and its
// caps to 50 and 30 as in llama.cpp; Gemma 3 without a window has no windowed layer, without a
// final cap no cap, and it reads no attention cap. rope.freq_base_swa absent: Gemma 2's windowed
// layers use rope.freq_base, Gemma 3's 10000. attention.sliding_window_pattern (an integer or a
// per-layer bool array) is read beside these (model_config.cpp).
constexpr uint32_t gemma_window(const ModelConfig& c) { return c.arch->name == "gemma2" ? 4096 : 0; }
constexpr UintParam kGemmaUints[] = {
    {"context_length", &ModelConfig::context_length, kMaxContext},
    {"embedding_length", &ModelConfig::dim, kMaxSize},
    {"block_count", &ModelConfig::n_layers, kMaxSize},
    {"feed_forward_length", &ModelConfig::ffn_dim, kMaxSize},
    {"attention.head_count", &ModelConfig::n_heads, kMaxSize},
    {"attention.head_count_kv", &ModelConfig::n_kv_heads, kMaxSize, all_heads},
    {"attention.key_length", &ModelConfig::key_length, kMaxSize, absent},
    {"attention.sliding_window", &ModelConfig::sliding_window, kMaxContext, gemma_window},
};

constexpr FloatParam kGemma2Floats[] = {
    {"rope.freq_base", &ModelConfig::rope_freq_base, 10000.0f},
    {"rope.freq_base_swa", &ModelConfig::rope_freq_base_swa, 0.0f},
    {"attention.layer_norm_rms_epsilon", &ModelConfig::rms_eps, 1e-6f},
    {"attn_logit_softcapping", &ModelConfig::attn_softcap, 50.0f},
    {"final_logit_softcapping", &ModelConfig::final_softcap, 30.0f},
};

constexpr FloatParam kGemma3Floats[] = {
    {"rope.freq_base", &ModelConfig::rope_freq_base, 10000.0f},
    {"rope.freq_base_swa", &ModelConfig::rope_freq_base_swa, 10000.0f},
    {"attention.layer_norm_rms_epsilon", &ModelConfig::rms_eps, 1e-6f},
    {"final_logit_softcapping", &ModelConfig::final_softcap, 0.0f},
};

// Pre and post norms around attention and the FFN; Gemma 3 adds Q/K norms.
constexpr TensorSpec kGemma2Block[] = {
    {kAttnNorm, kModel, kModel, true},   {kAttnQ, kModel, kQ, false},          {kAttnK, kModel, kKv, false},
    {kAttnV, kModel, kKv, false},        {kAttnOutput, kQ, kModel, false},     {kPostAttnNorm, kModel, kModel, true},
    {kFfnNorm, kModel, kModel, true},    {kFfnGate, kModel, kFfn, false},      {kFfnUp, kModel, kFfn, false},
    {kFfnDown, kFfn, kModel, false},     {kFfnPostNorm, kModel, kModel, true}, {kAttnQBias, kQ, kQ, true, kRare},
    {kAttnKBias, kKv, kKv, true, kRare}, {kAttnVBias, kKv, kKv, true, kRare},
};

constexpr TensorSpec kGemma3Block[] = {
    {kAttnNorm, kModel, kModel, true},    {kAttnQ, kModel, kQ, false},       {kAttnK, kModel, kKv, false},
    {kAttnV, kModel, kKv, false},         {kAttnOutput, kQ, kModel, false},  {kPostAttnNorm, kModel, kModel, true},
    {kAttnKNorm, kHead, kHead, true},     {kAttnQNorm, kHead, kHead, true},  {kFfnNorm, kModel, kModel, true},
    {kFfnGate, kModel, kFfn, false},      {kFfnUp, kModel, kFfn, false},     {kFfnDown, kFfn, kModel, false},
    {kFfnPostNorm, kModel, kModel, true}, {kAttnQBias, kQ, kQ, true, kRare}, {kAttnKBias, kKv, kKv, true, kRare},
    {kAttnVBias, kKv, kKv, true, kRare},
};

// The default (hand-built configs) first. RoPE types as llama.cpp's llama_model_rope_type.
constexpr Architecture kArchitectures[] = {
    {.name = "llama",
     .rope = RopeType::kNormal,
     .norm = NormVariant::kRms,
     .uints = kLlamaUints,
     .floats = kLlamaFloats,
     .layer_tensors = kLlamaBlock,
     .rope_freqs = true},
    {.name = "qwen2",
     .rope = RopeType::kNeox,
     .norm = NormVariant::kRms,
     .uints = kLlamaUints,
     .floats = kLlamaFloats,
     .layer_tensors = kQwen2Block},
    {.name = "qwen3",
     .rope = RopeType::kNeox,
     .norm = NormVariant::kRmsQkNorm,
     .uints = kLlamaUints,
     .floats = kLlamaFloats,
     .layer_tensors = kQwen3Block},
    {.name = "qwen35",
     .rope = RopeType::kNeox,
     .norm = NormVariant::kRmsQkNorm,
     .uints = kQwen35Uints,
     .floats = kQwen35Floats,
     .layer_tensors = kQwen35AttentionBlock,
     .recurrent_tensors = kQwen35RecurrentBlock},
    {.name = "gemma2",
     .rope = RopeType::kNeox,
     .norm = NormVariant::kRms,
     .uints = kGemmaUints,
     .floats = kGemma2Floats,
     .layer_tensors = kGemma2Block,
     .ffn = Activation::kGeluTanh,
     .embed_scale = true,
     .post_norms = true,
     .swa_pattern = 2},
    {.name = "gemma3",
     .rope = RopeType::kNeox,
     .norm = NormVariant::kRmsQkNorm,
     .uints = kGemmaUints,
     .floats = kGemma3Floats,
     .layer_tensors = kGemma3Block,
     .ffn = Activation::kGeluTanh,
     .embed_scale = true,
     .post_norms = true,
     .swa_pattern = 6,
     .swa_rope_unscaled = true},
};

static_assert(std::size(kTensorNames) == static_cast<size_t>(kFfnPostNorm) + 1, "a name for every LayerTensor");

}  // namespace

uint64_t dim_size(Dim dim, const ModelConfig& c) {
  switch (dim) {
    case kModel: return c.dim;
    case kQ: return uint64_t{c.n_heads} * c.head_dim();
    case kKv: return c.kv_dim();
    case kFfn: return c.ffn_dim;
    case kHead: return c.head_dim();
    case kQGated: return 2 * uint64_t{c.n_heads} * c.head_dim();
    case kConvChannels: return c.conv_channels();
    case kVInner: return c.ssm_inner_size;
    case kVHeads: return c.ssm_time_step_rank;
    case kConvKernel: return c.ssm_conv_kernel;
    case kSsmState: return c.ssm_state_size;
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

std::string_view rope_scaling_name(RopeScaling scaling) {
  switch (scaling) {
    case RopeScaling::kNone: return "none";
    case RopeScaling::kLinear: return "linear";
    case RopeScaling::kYarn: return "yarn";
  }
  return "none";
}

std::string layer_tensor(uint32_t layer, std::string_view name) {
  return "blk." + std::to_string(layer) + "." + std::string(name) + ".weight";
}

std::string_view tensor_name(LayerTensor role) { return kTensorNames[static_cast<size_t>(role)]; }

std::string_view tensor_kind(LayerTensor role) {
  if (role == kSsmA) return "";
  return role == kAttnQBias || role == kAttnKBias || role == kAttnVBias || role == kSsmDt ? "bias" : "weight";
}

std::string layer_tensor(uint32_t layer, LayerTensor role) {
  const std::string_view kind = tensor_kind(role);
  return "blk." + std::to_string(layer) + "." + std::string(tensor_name(role)) + (kind.empty() ? "" : ".") +
         std::string(kind);
}

std::span<const TensorSpec> layer_tensors(const ModelConfig& c, uint32_t layer) {
  return c.is_recurrent(layer) ? c.arch->recurrent_tensors : c.arch->layer_tensors;
}

}  // namespace tandem::model
