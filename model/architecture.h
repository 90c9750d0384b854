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

// The normalisations of a block. kRms: RMSNorm (weight, no bias) before attention, before the
// FFN and after the last block. kRmsQkNorm: also a per-head RMSNorm of Q and K before RoPE.
enum class NormVariant : uint8_t { kRms, kRmsQkNorm };

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
};

// A dimension of a tensor, in terms of the hyper-parameters. GGUF lists a matrix's dimensions
// input first: attn_q is [model, q].
enum class Dim : uint8_t {
  kModel,  // embedding_length
  kQ,      // head_count * head_dim
  kKv,     // head_count_kv * head_dim
  kFfn,    // feed_forward_length
};
uint64_t dim_size(Dim dim, const ModelConfig& config);

// Its name in GGUF files: "attn_q" (blk.{layer}.attn_q.weight), the same in every architecture.
std::string_view tensor_name(LayerTensor role);

struct TensorSpec {
  LayerTensor role;
  Dim in;  // the only dimension of a vector (norm weights)
  Dim out;
  bool vector;  // rank 1: [in]
};

// A positive integer hyper-parameter: `{architecture}.{key}`, stored in ModelConfig::*field.
struct UintParam {
  std::string_view key;
  uint32_t ModelConfig::*field;
  uint64_t max;
  uint32_t ModelConfig::*fallback = nullptr;  // optional: absent means this field's value
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
  std::string key(std::string_view suffix) const { return std::string(name) + "." + std::string(suffix); }
  const TensorSpec* find(LayerTensor role) const;
};

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
inline constexpr std::string_view kOutput = "output.weight";  // absent: tied to token_embd

std::string layer_tensor(uint32_t layer, std::string_view name);  // "blk.{layer}.{name}.weight"
std::string layer_tensor(uint32_t layer, LayerTensor role);

}  // namespace tandem::model
