// Whole-file quantization as llama.cpp's llama-quantize does it (without an importance matrix):
// the same type for every tensor, the same metadata, the same bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/gguf.h"
#include "model/quant.h"
#include "runtime/status.h"

namespace tandem::model {

// llama.cpp's file types (llama_ftype, written as general.file_type): a default tensor type plus,
// for the _S/_M mixes and the 4- to 6-bit types, rules that give some tensors another type.
// X(enumerator, id, llama-quantize's name, default tensor type).
// clang-format off
#define TANDEM_FILE_TYPES(X)                                                                         \
  X(kF32, 0, "f32", F32)            X(kF16, 1, "f16", F16)            X(kBF16, 32, "bf16", BF16)      \
  X(kQ8_0, 7, "q8_0", Q8_0)         X(kQ4_0, 2, "q4_0", Q4_0)         X(kQ4_1, 3, "q4_1", Q4_1)       \
  X(kQ5_0, 8, "q5_0", Q5_0)         X(kQ5_1, 9, "q5_1", Q5_1)         X(kQ4_K_M, 15, "q4_k_m", Q4_K)  \
  X(kQ4_K_S, 14, "q4_k_s", Q4_K)    X(kQ5_K_M, 17, "q5_k_m", Q5_K)    X(kQ5_K_S, 16, "q5_k_s", Q5_K)  \
  X(kQ6_K, 18, "q6_k", Q6_K)
// clang-format on
enum class FileType : uint32_t {
#define TANDEM_ENUMERATOR(e, id, ...) e = id,
  TANDEM_FILE_TYPES(TANDEM_ENUMERATOR)
#undef TANDEM_ENUMERATOR
};

// "q4_k_m" -> kQ4_K_M: llama-quantize's names, lower case. nullopt for anything else.
std::optional<FileType> parse_file_type(std::string_view name);
// The names parse_file_type() takes, "f32|f16|bf16|q8_0|...".
std::string_view file_type_choices();

// One tensor of the output, in llama-quantize's order (tensors outside blocks first, then by
// block number, by name within each).
struct TensorPlan {
  const GgufTensor* tensor;  // in the input file
  uint32_t to;               // ggml type id of the output tensor
};

// The type llama-quantize's llama_tensor_get_type picks for each tensor (name-based categories,
// token_embd/output rules, the attn_v/ffn_down bumps of the _M/_S mixes, fallbacks for rows
// that are not a multiple of the block size); tensors it does not quantize (norms, 1-D
// tensors) keep their type. Errors (Code::kModelFile, naming the file): an architecture whose
// llama-quantize rules tandem does not carry (falcon; mixture-of-experts models).
Result<std::vector<TensorPlan>> plan_quantization(const GgufFile& file, FileType type);

// Writes `out` as `llama-quantize in out TYPE` does: the input's metadata in its order, split
// keys dropped, general.quantization_version = 2 and general.file_type last; the tensors of
// plan_quantization(), converted to F32 and quantized with the reference quantizers
// (model/quant.h) on up to 8 threads (the bytes do not depend on the count). Errors:
// Code::kModelFile for an unreadable input, a source type tandem cannot convert (quantized
// sources: llama-quantize also refuses to requantize by default), a tensor holding a NaN or an
// infinity (llama-quantize fails its validation of such rows), or a failed write; `out` is then
// untouched.
Status quantize_model(const std::string& in, const std::string& out, FileType type);

}  // namespace tandem::model
