// Deterministic random Llama models in GGUF, for tests and benchmarks.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/status.h"
#include "model/gguf.h"
#include "model/model_config.h"

namespace tandem::model {

// "tiny": vocab 512, dim 64, 2 layers, 4 heads, 2 KV heads, FFN 192, context 512.
// "small": SmolLM2-135M's shape, untied: vocab 49152, dim 576, 30 layers, 9 heads,
//          3 KV heads, FFN 1536, rope base 100000, rms eps 1e-5, context 2048.
Result<ModelConfig> preset_config(const std::string& preset);

// Writes a GGUF v3 file (matrices and embeddings in `weights`, F32 or F16; norms F32 as
// llama.cpp writes F16 models) with the standard llama.cpp metadata and a byte-level
// vocabulary (<unk>, <s>, </s>, <0x00>..<0xFF>, then unique unused filler tokens).
// Weights are drawn so every layer matters: token embeddings std 1, each matrix std
// 1/sqrt(fan_in), norms 1, untied output.weight (omitted when config.tied_embeddings).
// Same (config, seed): same bytes on every machine (a portable RNG, no libm).
// Errors: Code::kInvalidArgument for an inconsistent config; Code::kModelFile when the
// file cannot be written.
// F16 files hold the same draws rounded to half precision.
Status make_model(const ModelConfig& config, uint64_t seed, const std::string& path,
                  TensorType weights = TensorType::kF32);

}  // namespace tandem::model
