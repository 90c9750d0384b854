// ggml's tensor types as GGUF files hold them: the block layouts of ggml-common.h byte for byte,
// a traits table for every type id, and scalar reference conversions to and from F32.
//
// The conversions are the definition the kernels are held to. Each gives the same bits as
// ggml's reference code (dequantize_row_*, quantize_row_*_ref, i.e. llama-quantize without an
// importance matrix): the same IEEE float operations in the same order, no contraction into
// fmas (tandem_model is compiled with -ffp-contract=off) and ggml's rounding helpers
// (round half to even for nearest_int, half away from zero for Q8_0's roundf, truncation for
// the 32-element types). Tested against gguf-py's dequantizer and the npm llama.cpp build's
// llama-quantize (tests/model/quant_reference_test.cpp).
//
// Blocks are plain structs of bytes and 16-bit halves (alignment 2, Q8_K: 4): a row of a tensor
// is an array of blocks, so a GGUF mapping can be read in place at any row whose byte offset
// is a multiple of the block's alignment (every row of a GGUF tensor is: data is 32-aligned
// and block sizes are even).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::model {

// ggml type ids (ggml.h `enum ggml_type`): the numbers GGUF files store. Only the types tandem
// converts are named here; type_traits() knows the geometry of every id ggml defines.
// X(name, id); Q8_K holds the activations of the K-type dot products, never a model's weights.
// clang-format off
#define TANDEM_TENSOR_TYPES(X)                                                                 \
  X(F32, 0)  X(F16, 1)  X(Q4_0, 2)  X(Q4_1, 3)  X(Q5_0, 6)  X(Q5_1, 7)  X(Q8_0, 8)  X(Q4_K, 12) \
  X(Q5_K, 13) X(Q6_K, 14) X(Q8_K, 15) X(BF16, 30)
// clang-format on
enum class TensorType : uint32_t {
#define TANDEM_ENUMERATOR(name, id) k##name = id,
  TANDEM_TENSOR_TYPES(TANDEM_ENUMERATOR)
#undef TANDEM_ENUMERATOR
};

constexpr int kQK32 = 32;     // elements per block of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
constexpr int kQKK = 256;     // elements per super-block of the K types
constexpr int kKScales = 12;  // bytes of packed 6-bit scales and mins in Q4_K / Q5_K

// x = d·(q − 8). qs[j]: element j in the low nibble, element j + 16 in the high one.
struct BlockQ4_0 {
  uint16_t d;  // binary16
  uint8_t qs[kQK32 / 2];
};
// x = d·q + m, q in 0..15, nibbles as Q4_0.
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[kQK32 / 2];
};
// x = d·(q − 16), q in 0..31: low 4 bits as Q4_0, bit 4 of element j is bit j of qh (little-endian u32).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK32 / 2];
};
// x = d·q + m, q in 0..31, bits as Q5_0.
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK32 / 2];
};
// x = d·q, q in −127..127 (−128 never written by the reference quantizer).
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK32];
};
// 8 sub-blocks of 32: x = d·sc_j·q − dmin·m_j, q in 0..15, sc_j and m_j 6-bit (k_scale_min).
// qs: 4 chunks of 64 elements, each 32 bytes: element i of the chunk's first half in the low
// nibble of byte i, of its second half in the high nibble.
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[kKScales];
  uint8_t qs[kQKK / 2];
};
// As Q4_K with q in 0..31: bit 4 of element 32·s + i is bit s of qh[i].
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[kKScales];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
// 16 sub-blocks of 16: x = d·scales_j·(q − 32), q in 0..63. Per 128 elements (ql 64 bytes, qh 32):
// element l (l < 32) + 32·k takes ql[l + 32·(k & 1)]'s nibble k / 2 and qh[l]'s bits 2k, 2k+1.
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};
// Activations for K-type dot products: x = d·q, bsums: sums of q per 16 elements.
struct BlockQ8_K {
  float d;
  int8_t qs[kQKK];
  int16_t bsums[kQKK / 16];
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
                  sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144 &&
                  sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292,
              "ggml's block sizes");
static_assert(alignof(BlockQ4_0) == 2 && alignof(BlockQ4_K) == 2 && alignof(BlockQ6_K) == 2 && alignof(BlockQ8_K) == 4,
              "TypeTraits::block_align");

// Sub-block j's (j < 8) 6-bit scale and min of a Q4_K / Q5_K block: j < 4 in the low 6 bits of
// bytes j and j + 4; j >= 4 in byte j + 4's nibbles with the top 2 bits in bytes j − 4 and j.
inline void k_scale_min(int j, const uint8_t* scales, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = scales[j] & 63;
    m = scales[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// Row conversions: n elements, a multiple of the type's block size (not checked here: the
// caller checked the tensor's shape, as GgufFile::open does). Dequantize writes n floats;
// quantize writes n / block_elems blocks. Quantize is ggml's reference quantizer (no
// importance matrix), deterministic and row-independent. A NaN or an infinity in x gives
// defined bytes (ggml's on x86-64), not a meaningful block.
void dequantize_row_f16(const uint16_t* x, float* y, int64_t n);
void dequantize_row_bf16(const uint16_t* x, float* y, int64_t n);
void dequantize_row_q4_0(const BlockQ4_0* x, float* y, int64_t n);
void dequantize_row_q4_1(const BlockQ4_1* x, float* y, int64_t n);
void dequantize_row_q5_0(const BlockQ5_0* x, float* y, int64_t n);
void dequantize_row_q5_1(const BlockQ5_1* x, float* y, int64_t n);
void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t n);
void dequantize_row_q4_k(const BlockQ4_K* x, float* y, int64_t n);
void dequantize_row_q5_k(const BlockQ5_K* x, float* y, int64_t n);
void dequantize_row_q6_k(const BlockQ6_K* x, float* y, int64_t n);
void dequantize_row_q8_k(const BlockQ8_K* x, float* y, int64_t n);

void quantize_row_f16(const float* x, uint16_t* y, int64_t n);   // round to nearest even
void quantize_row_bf16(const float* x, uint16_t* y, int64_t n);  // round to nearest even, NaN quieted
void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n);
void quantize_row_q4_1(const float* x, BlockQ4_1* y, int64_t n);
void quantize_row_q5_0(const float* x, BlockQ5_0* y, int64_t n);
void quantize_row_q5_1(const float* x, BlockQ5_1* y, int64_t n);
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n);
void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t n);
void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t n);
void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t n);
void quantize_row_q8_k(const float* x, BlockQ8_K* y, int64_t n);

using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeRowFn = void (*)(const float* src, void* dst, int64_t n);

// One ggml type. Names are gguf-py's (GGMLQuantizationType: "Q4_K", "BF16"), the spelling model
// files and their users show; ggml's C strings are the lower-case "q4_K", "bf16".
struct TypeTraits {
  const char* name;
  uint32_t block_elems;  // 1 for the plain types
  uint32_t block_bytes;
  uint32_t block_align;        // a block's address must be a multiple of this (its struct's alignof)
  bool quantized;              // blocks with scales (ggml_is_quantized)
  DequantizeRowFn dequantize;  // nullptr: tandem cannot read this type
  QuantizeRowFn quantize;      // nullptr: tandem cannot write it
};

// The traits of a ggml type id; nullptr for an id ggml does not define (removed or past the last).
const TypeTraits* type_traits(uint32_t type);
inline const TypeTraits* type_traits(TensorType type) { return type_traits(static_cast<uint32_t>(type)); }
// "F32", "Q4_K", ... or "type 99" for an id type_traits() does not know.
const char* ggml_type_name(uint32_t type);
inline const char* ggml_type_name(TensorType type) { return ggml_type_name(static_cast<uint32_t>(type)); }
// Bytes of a row of n elements of a known type (n a multiple of its block size).
uint64_t row_bytes(TensorType type, uint64_t n);
// "F16, BF16, Q8_0, ..." : the types tandem reads, for error messages.
const char* readable_type_names();

}  // namespace tandem::model
