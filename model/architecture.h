// The architecture table: for each `general.architecture` tandem runs, the GGUF keys of its
// hyper-parameters, the tensors of its blocks with their shapes, how RoPE pairs a head's
// elements and which norms a block applies. The config reader (model_config.h), the model
// writer (make_model.h) and the engine all read it; a new architecture (or a new tensor of one)
// is a row here and the engine code that computes it, nothing else.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace tandem::model {

struct ModelConfig;

// How RoPE pairs the elements of a head. kNormal: adjacent pairs (2i, 2i + 1), llama.cpp's
// LLAMA_ROPE_TYPE_NORM (its convert script permutes Llama's Q and K rows into this order).
// kNeox: (i, i + head_dim / 2), LLAMA_ROPE_TYPE_NEOX (Qwen).
enum class RopeType : uint8_t { kNormal, kNeox };

// How a file stretches RoPE past its training context (`{arch}.rope.scaling.type`, read for
// every architecture as llama.cpp does). kLinear: every angle divided by the factor. kYarn:
// YaRN's per-pair blend of divided and undivided angles and its attention magnitude.
enum class RopeScaling : uint8_t { kNone, kLinear, kYarn };
std::string_view rope_scaling_name(RopeScaling scaling);  // "none", "linear", "yarn"

// The normalisations of a block. kRms: RMSNorm (weight, no bias) before attention, before the
// FFN and after the last block. kRmsQkNorm: also a per-head RMSNorm of Q and K (attn_q_norm,
// attn_k_norm: one weight of head_dim shared by the heads) after the biases, before RoPE (Qwen3).
enum class NormVariant : uint8_t { kRms, kRmsQkNorm };

// The FFN's gate activation: out = act(gate) * up. kSilu: SwiGLU (Llama, Qwen). kGeluTanh:
// GeGLU with the tanh approximation of GELU, as ggml_gelu (Gemma).
enum class Activation : uint8_t { kSilu, kGeluTanh };

// The tensors of a block by role: the engine asks for a role, the table gives its GGUF name.
enum class LayerTensor : uint8_t {
  kAttnNorm,
  kAttnQ,
  kAttnK,
  kAttnV,
  kAttnOutput,
  kFfnNorm,
  kFfnGate,
  kFfnUp,
  kFfnDown,
  kAttnQBias,  // blk.{layer}.attn_q.bias, added to Q after the projection
  kAttnKBias,
  kAttnVBias,
  kAttnQNorm,  // blk.{layer}.attn_q_norm.weight
  kAttnKNorm,
  // Hybrid (qwen35) layers, docs/HYBRID.md. kPostAttnNorm is the FFN's norm in every qwen35 layer.
  kPostAttnNorm,  // post_attention_norm
  kAttnQkv,       // Gated DeltaNet: q|k|v conv inputs
  kAttnGate,      // Gated DeltaNet: the output gate z
  kSsmConv1d,     // depthwise conv kernel [conv_kernel][channels]
  kSsmDt,         // ssm_dt.bias: the softplus gate's bias per V head
  kSsmA,          // ssm_a (no suffix): -exp(A_log) per V head
  kSsmBeta,
  kSsmAlpha,
  kSsmNorm,  // the gated RMSNorm's weight [state_size], shared by the V heads
  kSsmOut,
  kFfnPostNorm,  // post_ffw_norm: Gemma's norm of the FFN output before the residual add
};

// A dimension of a tensor, in terms of the hyper-parameters. GGUF lists a matrix's dimensions
// input first: attn_q is [model, q].
enum class Dim : uint8_t {
  kModel,  // embedding_length
  kQ,      // head_count * head_dim
  kKv,     // head_count_kv * head_dim
  kFfn,    // feed_forward_length
  kHead,   // head_dim: attention.key_length, else embedding_length / head_count
  // Hybrid (qwen35) dimensions.
  kQGated,        // 2 * head_count * head_dim: per head the query, then its output gate
  kConvChannels,  // 2 * ssm.group_count * ssm.state_size + ssm.inner_size
  kVInner,        // ssm.inner_size = ssm.time_step_rank * ssm.state_size
  kVHeads,        // ssm.time_step_rank
  kConvKernel,    // ssm.conv_kernel
  kSsmState,      // ssm.state_size
};
uint64_t dim_size(Dim dim, const ModelConfig& config);

// Its name in GGUF files: "attn_q" (blk.{layer}.attn_q.weight, and blk.{layer}.attn_q.bias for
// kAttnQBias), the same in every architecture.
std::string_view tensor_name(LayerTensor role);
// "weight", "bias", or "" for a tensor without suffix (qwen35's ssm_a).
std::string_view tensor_kind(LayerTensor role);

// Whether a block tensor must be in a file, as llama.cpp loads it.
enum class Presence : uint8_t {
  kRequired,
  kOptional,  // used when present; this architecture's models have it, so make-model writes it (Qwen2's biases)
  kRare,      // used when present; its models lack it, so make-model leaves it out (Llama's Q/K/V biases)
};

struct TensorSpec {
  LayerTensor role;
  Dim in;  // the only dimension of a vector (norm weights, biases)
  Dim out;
  bool vector;  // rank 1: [in]
  Presence presence = Presence::kRequired;
};

// A positive integer hyper-parameter: `{architecture}.{key}`, stored in ModelConfig::*field.
// Required unless it has a fallback: absent, the field is fallback(config read so far); a
// fallback of 0 means "absent" (make-model writes a field only when it is not 0).
struct UintParam {
  std::string_view key;
  uint32_t ModelConfig::*field;
  uint64_t max;
  uint32_t (*fallback)(const ModelConfig&) = nullptr;
};

// A positive float hyper-parameter, optional with a fallback.
struct FloatParam {
  std::string_view key;
  float ModelConfig::*field;
  float fallback;
};

struct Architecture {
  std::string_view name;  // general.architecture, and the prefix of its keys
  RopeType rope;
  NormVariant norm;
  std::span<const UintParam> uints;  // read in this order (its first error is reported)
  std::span<const FloatParam> floats;
  std::span<const TensorSpec> layer_tensors;  // in llama.cpp's file order
  // A hybrid architecture's recurrent (Gated DeltaNet) layers; layer_tensors are then its
  // full-attention layers (ModelConfig::recurrent says which is which). Empty: no such layers.
  std::span<const TensorSpec> recurrent_tensors = {};
  Activation ffn = Activation::kSilu;
  // Gemma: the token embeddings are multiplied by sqrt(embedding_length), and the attention and
  // FFN outputs are RMS-normalised (post_attention_norm, post_ffw_norm) before each residual add.
  bool embed_scale = false;
  bool post_norms = false;
  // Sliding-window attention (docs/WINDOWS.md): the default of attention.sliding_window_pattern,
  // llama.cpp's n_pattern (layer l is windowed iff l % n < n - 1); 0: no windowed layers.
  uint32_t swa_pattern = 0;
  // Windowed layers' RoPE ignores the file's rope scaling (Gemma 3: llama.cpp's
  // rope_freq_scale_train_swa stays 1); false: they scale as the full layers do (Gemma 2).
  bool swa_rope_unscaled = false;
  // Loads rope_freqs.weight when present (Llama 3's per-pair frequency divisors, [head_dim / 2],
  // F32); llama.cpp ignores it for architectures without this.
  bool rope_freqs = false;
  std::string key(std::string_view suffix) const { return std::string(name) + "." + std::string(suffix); }
  const TensorSpec* find(LayerTensor role) const;
  bool hybrid() const { return !recurrent_tensors.empty(); }
};

// The tensors of layer `layer` of a model: recurrent_tensors for a hybrid's recurrent layers,
// layer_tensors otherwise.
std::span<const TensorSpec> layer_tensors(const ModelConfig& config, uint32_t layer);

// The row of `name`; nullptr for an architecture tandem does not run.
const Architecture* find_architecture(std::string_view name);
// What tandem runs, for error messages: "'llama'".
std::string architecture_names();
// The default of a config built by hand (presets, tests): llama.
const Architecture* default_architecture();

// Hyper-parameters above this are not a model tandem can run on a CPU: a bound that catches
// garbage (and keeps later products like dim * vocab far from overflow).
inline constexpr uint64_t kMaxHyperParameter = (uint64_t{1} << 20) - 1;

// Tensors outside the blocks, the same in every architecture.
inline constexpr std::string_view kTokenEmbd = "token_embd.weight";
inline constexpr std::string_view kOutputNorm = "output_norm.weight";
inline constexpr std::string_view kOutput = "output.weight";         // absent: tied to token_embd
inline constexpr std::string_view kRopeFreqs = "rope_freqs.weight";  // see Architecture::rope_freqs

std::string layer_tensor(uint32_t layer, std::string_view name);  // "blk.{layer}.{name}.weight"
std::string layer_tensor(uint32_t layer, LayerTensor role);       // "blk.{layer}.attn_q.bias", "blk.{layer}.ssm_a"

}  // namespace tandem::model
