// A model's hyper-parameters, read and checked from GGUF metadata through the architecture
// table (model/architecture.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/architecture.h"
#include "model/gguf.h"
#include "runtime/status.h"

namespace tandem::model {

// The keys named below are the llama row's; another architecture reads `{its name}.…`.
struct ModelConfig {
  const Architecture* arch = default_architecture();  // general.architecture's row
  std::string name;                                   // general.name, or the file name
  uint32_t vocab_size = 0;                            // rows of token_embd.weight
  uint32_t dim = 0;                                   // llama.embedding_length
  uint32_t n_layers = 0;                              // llama.block_count
  uint32_t n_heads = 0;                               // llama.attention.head_count
  uint32_t n_kv_heads = 0;                            // llama.attention.head_count_kv (defaults to n_heads)
  uint32_t ffn_dim = 0;                               // llama.feed_forward_length
  uint32_t context_length = 0;                        // llama.context_length
  uint32_t key_length = 0;                            // llama.attention.key_length; 0 (absent): dim / n_heads
  float rope_freq_base = 10000.0f;                    // llama.rope.freq_base
  float rms_eps = 1e-5f;                              // llama.attention.layer_norm_rms_epsilon
  bool tied_embeddings = false;                       // output.weight absent: the LM head is token_embd
  // RoPE scaling, as llama.cpp reads it: llama.rope.scaling.type (default linear) and .factor
  // (or the older rope.scale_linear; absent or 0: 1, no scaling; type none: never scaled).
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_scaling_factor = 1.0f;
  uint32_t rope_original_context = 0;  // llama.rope.scaling.original_context_length; 0: context_length
  float rope_attn_factor = 1.0f;       // llama.rope.scaling.attn_factor: a magnitude on every cos/sin
  bool rope_freqs = false;             // rope_freqs.weight present and used (Architecture::rope_freqs)
  // Hybrid (qwen35) hyper-parameters, 0 / empty for the others (docs/HYBRID.md).
  uint32_t rope_dims = 0;                // rope.dimension_count when below head_dim (partial RoPE); 0: all
  uint32_t ssm_conv_kernel = 0;          // ssm.conv_kernel: K, the causal conv's width
  uint32_t ssm_state_size = 0;           // ssm.state_size: d_k = d_v of a delta-net head
  uint32_t ssm_group_count = 0;          // ssm.group_count: Q/K heads
  uint32_t ssm_time_step_rank = 0;       // ssm.time_step_rank: V heads (gates)
  uint32_t ssm_inner_size = 0;           // ssm.inner_size = V heads x state_size
  uint32_t full_attention_interval = 0;  // layer i is full attention iff (i + 1) % interval == 0
  std::vector<bool> recurrent;           // per layer: Gated DeltaNet (attention.recurrent_layers or the interval)
  // Sliding-window attention (Gemma 2/3, docs/WINDOWS.md): a query at position p of a windowed
  // layer sees the keys p - W + 1 .. p (W = attention.sliding_window), as llama.cpp.
  uint32_t sliding_window = 0;   // attention.sliding_window; 0: none
  uint32_t swa_pattern = 0;      // attention.sliding_window_pattern as an integer (0: from swa_layers)
  std::vector<bool> swa_layers;  // per layer: windowed
  // The attention scores' scale; 0: 1 / sqrt(head_dim). Gemma 2/3 27B: 1 / sqrt(dim / heads)
  // (gemma_query_scale).
  float query_scale = 0;
  float rope_freq_base_swa = 0;  // rope.freq_base_swa: the windowed layers' RoPE base (0: rope_freq_base)
  float attn_softcap = 0;        // attn_logit_softcapping: score s -> c tanh(s / c) before the softmax; 0: none
  float final_softcap = 0;       // final_logit_softcapping: the same on the logits; 0: none
  // The window of layer `layer` in positions, 0 for a full-attention layer: what the attention
  // masks today, and what a ring of KV blocks per sequence would keep.
  uint32_t window(uint32_t layer) const { return layer < swa_layers.size() && swa_layers[layer] ? sliding_window : 0; }
  bool is_recurrent(uint32_t layer) const { return layer < recurrent.size() && recurrent[layer]; }
  // Layers with a KV cache (all but a hybrid's recurrent ones).
  uint32_t attention_layers() const {
    uint32_t n = 0;
    for (uint32_t l = 0; l < n_layers; ++l) n += is_recurrent(l) ? 0 : 1;
    return n;
  }
  uint32_t conv_channels() const { return 2 * ssm_group_count * ssm_state_size + ssm_inner_size; }
  uint32_t rope_dim() const { return rope_dims ? rope_dims : head_dim(); }
  uint32_t head_dim() const { return key_length ? key_length : dim / n_heads; }
  float attention_scale() const { return query_scale > 0 ? query_scale : 1.0f / std::sqrt(float(head_dim())); }
  uint32_t q_dim() const { return n_heads * head_dim(); }
  uint32_t kv_dim() const { return n_kv_heads * head_dim(); }
  uint32_t yarn_original_context() const { return rope_original_context ? rope_original_context : context_length; }
};

// Reads general.architecture (a row of the architecture table) and that row's keys; checks
// that every tensor the architecture needs is present, of a type the engine computes on
// (readable_type_names(): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) with
// rows of whole blocks, and of the shape the keys imply. Errors are Code::kModelFile and name the key or tensor:
//   "unsupported architecture 'gpt2' (tandem runs 'llama', 'qwen2', 'qwen3', 'qwen35', 'gemma2', 'gemma3')"
//   "missing key llama.block_count"
//   "llama.rope.scaling.type 'longrope' is not supported (tandem applies none, linear, yarn)"
//   "tensor blk.3.attn_k.weight has shape [64, 48], expected [64, 32]"
//   "tensor blk.0.ffn_up.weight has unsupported type IQ2_XS (tandem loads F32, F16, BF16, ...)"
//   "head_count 5 does not divide embedding_length 64"
//   "gemma2.attention.sliding_window_pattern has 3 entries for 4 blocks"
Result<ModelConfig> read_model_config(const GgufFile& file);

// Gemma's query scale as llama.cpp sets it (src/models/gemma2.cpp, gemma3.cpp): its 27B models,
// told by their layer count (46 for gemma2, 62 for gemma3), scale queries by
// 1 / sqrt(dim / heads) (gemma_pytorch's query_pre_attn_scalar), the others by
// 1 / sqrt(head_dim); 0 (the default) for any other architecture.
float gemma_query_scale(const ModelConfig& config);

// A short hex digest of what makes two files the same model for serving: the architecture,
// its hyper-parameters, the vocabulary, and every tensor's name, shape, type and a sample of
// its bytes. The scheduler refuses a worker whose fingerprint differs from its own.
std::string model_fingerprint(const GgufFile& file, const ModelConfig& config);

}  // namespace tandem::model
