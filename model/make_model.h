// Deterministic random models in GGUF (every architecture of model/architecture.h), for tests
// and benchmarks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/status.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "model/vocab_import.h"

namespace tandem::model {

// "tiny": vocab 512, dim 64, 2 layers, 4 heads, 2 KV heads, FFN 192, context 512.
// "small": SmolLM2-135M's shape, untied: vocab 49152, dim 576, 30 layers, 9 heads,
//          3 KV heads, FFN 1536, rope base 100000, rms eps 1e-5, context 2048.
// With a hybrid `arch` (qwen35, docs/HYBRID.md): "tiny" is scripts/qwen35-reference.py's tiny
// preset (dim 64, 4 layers: 3 Gated DeltaNet + 1 full attention, delta net 2 QK / 4 V heads of
// 16, attention 4 heads / 2 KV heads of 32 with RoPE on 8 dims, rope base 1e7, eps 1e-6);
// "small" has the llama small preset's vocabulary and width (dim 576, FFN 1536, 28 layers: 21
// + 7, delta net 4 QK / 8 V heads of 64, attention 8 heads / 2 KV heads of 64, RoPE on 16).
// With gemma2 / gemma3 (docs/WINDOWS.md): "tiny" is dim 64, 4 heads / 2 KV heads of 32, FFN 192,
// context 512, tied embeddings, eps 1e-6, a sliding window of 32 on llama.cpp's pattern (gemma2:
// 4 layers alternating windowed / full, a cap of 5 on attention so it bites, 30 on the logits;
// gemma3: 6 layers, five windowed then one full, rope base 1e6 and 10000 on windowed layers);
// "small" is Gemma 3 270M's shape with the llama small preset's vocabulary (dim 640, 18 layers,
// 4 heads / 1 KV head of 256, FFN 2048, window 512; gemma2's caps 50 and 30).
Result<ModelConfig> preset_config(const std::string& preset, std::string_view arch = "llama");

// Llama 3's RoPE scaling (Hugging Face rope_scaling.rope_type "llama3"), which llama.cpp's
// convert script turns into rope_freqs.weight: per pair, 1 for wavelengths below
// original_context / high_freq_factor, `factor` above original_context / low_freq_factor, a
// smooth blend between. Llama 3.1's values are the defaults.
struct Llama3Rope {
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  uint32_t original_context = 8192;
};
// rope_freqs.weight's values for a head of `head_dim` and RoPE base `base`.
std::vector<float> llama3_rope_factors(const Llama3Rope& rope, uint32_t head_dim, double base);

// Writes a GGUF v3 file of config.arch (matrices and embeddings in `weights`, F32 or F16;
// norms and biases F32 as llama.cpp writes F16 models) with the standard llama.cpp metadata
// and a byte-level vocabulary (<unk>, <s>, </s>, <0x00>..<0xFF>, then unique unused filler
// tokens). Weights are drawn so every layer matters: token embeddings std 1, each matrix std
// 1/sqrt(fan_in), block and output norms 1, Q/K norms 1 + N(0, 0.25^2), biases N(0, 0.5^2),
// untied output.weight (omitted when config.tied_embeddings). The architecture's optional
// tensors its models have are written (Qwen2's biases), rare ones not. config.key_length != 0
// writes attention.key_length and value_length; config.rope_scaling != kNone writes the
// rope.scaling keys (type, factor, and original_context_length and attn_factor when set);
// `llama3` writes rope_freqs.weight (llama only).
// Same (config, seed): same bytes on every machine (a portable RNG, no libm).
// Errors: Code::kInvalidArgument for an inconsistent config; Code::kModelFile when the
// file cannot be written.
// F16 files hold the same draws rounded to half precision.
// `vocabulary` (model/vocab_import.h) replaces the byte-level vocabulary with a real one: its
// keys are written as given; config.vocab_size must be its size.
// The byte-level vocabulary's first 259 tokens, appended with their token types: <unk> (2),
// <s> and </s> (3, control), then the byte tokens <0x00>..<0xFF> (6). make_model's vocabulary
// starts so; tests build vocabularies on it.
void append_byte_level_tokens(std::vector<std::string>& tokens, std::vector<int32_t>& types);

Status make_model(const ModelConfig& config, uint64_t seed, const std::string& path,
                  TensorType weights = TensorType::kF32, const std::optional<Llama3Rope>& llama3 = std::nullopt,
                  const VocabularyKeys* vocabulary = nullptr);

// A test fixture (`tandem make-model --script-file`): a model whose greedy output is a given
// text, so end-to-end tests see a real model emit what random weights never do (think blocks,
// tool calls). It is a bigram chain: every attention and FFN output projection is zero, so the
// final hidden state is the current token's embedding, normalized; chain token i (of n) embeds
// one-hot in dimension i + 1, every other token in dimension 0; output.weight's row for the
// next chain token (the first after dimension 0, the end token after the last) has 16 in the
// current token's dimension, every other logit is 0. The model therefore writes the chain after
// any prompt whose last token is not in it, then the end token. The chain never repeats a token
// (a bigram has one successor per token), so the text is spelled by spell_without_repeats().

// Tokens of `tokenizer` whose texts (as the detokenizer writes them, no special pieces)
// concatenate to `text`, no id twice and none of `avoid` (longer tokens are tried first, by
// depth-first search). Errors (kInvalidArgument): empty text, longer than 4096 bytes, or no
// such spelling found within a bounded search (the message names how far it got).
Result<std::vector<int32_t>> spell_without_repeats(const Tokenizer& tokenizer, std::string_view text,
                                                   const std::vector<int32_t>& avoid);

// Writes the scripted model of `vocabulary` (see above) to `path`: `chain` is the output, its
// last element the end token. config.dim is set to fit the chain (a multiple of 32, at least
// 64); config's other shape fields are used as given; matrices F16. Errors: repeated tokens or
// ids outside the vocabulary (kInvalidArgument), the file (kModelFile).
Status make_scripted_model(ModelConfig config, const std::vector<int32_t>& chain, const std::string& path,
                           const VocabularyKeys& vocabulary);

}  // namespace tandem::model
