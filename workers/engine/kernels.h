// SIMD kernels of the forward pass, one implementation per instruction set
// (kernels_generic.cpp, kernels_avx2.cpp, kernels_avx512.cpp), chosen once at start-up.
//
// Batch invariance by construction: every output element is defined as a fixed scalar
// sequence of IEEE operations (mostly one fused multiply-add chain in index order), the
// vector variants only compute many such elements side by side. So a result never
// depends on how many rows are in the batch, how work is split between threads, or which
// variant runs: bitwise.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::engine::kernels {

// Weights are packed at load time in panels of kPanel output columns: panel p holds
// W[p*kPanel + j][k] at data[(p*K + k)*kPanel + j] (K-major inside the panel), zero-padded
// past N. That lets the GEMM stream each weight byte once per step, whatever M is.
inline constexpr uint32_t kPanel = 32;

// Floats a packed copy of an [n][k] matrix takes (n rounded up to whole panels).
inline size_t packed_floats(uint32_t n, uint32_t k) { return size_t{(n + kPanel - 1) / kPanel} * kPanel * k; }
// Writes row `n` (k floats) of W into its place in a packed buffer.
void pack_row(const float* row, uint32_t n, uint32_t k, float* packed);

struct PackedView {
  const float* data = nullptr;
  uint32_t n = 0;  // output columns (rows of the original W[N][K])
  uint32_t k = 0;  // input features
  uint32_t panels() const { return (n + kPanel - 1) / kPanel; }
};

// F16 or BF16 weights packed as PackedView, 16 bits per element (the file's bits, not
// widened): the same bytes as the file's tensor, rounded up to whole panels.
struct Packed16View {
  const uint16_t* data = nullptr;
  uint32_t n = 0, k = 0;
  bool bf16 = false;  // else IEEE binary16
  uint32_t panels() const { return (n + kPanel - 1) / kPanel; }
};

// BF16 weights for the pair kernel (Kernels::gemm_bf16), K even: panels of kPanel columns with
// K in pairs, panel p holding W[p * kPanel + j][2 q + t] at data[((p * K / 2 + q) * kPanel + j) * 2
// + t], zero-padded past N, denormals as zero: the file's bytes rearranged.
struct PackedPairsView {
  const uint16_t* data = nullptr;
  uint32_t n = 0, k = 0;
  uint32_t panels() const { return (n + kPanel - 1) / kPanel; }
};
// Writes row n (k BF16 elements) of W into its place in a pair-packed buffer.
void pack_bf16_pairs_row(const uint16_t* row, uint32_t n, uint32_t k, uint16_t* packed);
// Rounds rows [r0, r1) of A (k floats each, lda apart) to BF16 into out (k per row): nearest,
// ties to even; NaN stays NaN (quiet); a denormal result becomes zero of its sign.
void round_rows_bf16(const float* a, size_t lda, uint32_t r0, uint32_t r1, uint32_t k, uint16_t* out);

// Quantized weights (type: model::TensorType's id, one of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 with
// activations in blocks of kAct32, or Q4_K, Q5_K, Q6_K with kAct256), never expanded: repacked
// once at load (tile_quant) into tiles of kQuantTile output columns x one block (32 or 256
// elements), so a vector register holds one 4-element group of 16 columns and the dot products
// need no horizontal sums. Tile t = g * nb + b (column group g, block b, nb blocks per column);
// columns past N are zero. Sections, each tiles() x its bytes per tile, in this order:
//   codes  the unsigned codes (offset not taken off). Q8_0: 512 bytes, byte 64 i + 4 c + e =
//          w + 128 of element 4 i + e (i < 8) of column c. Other types: 256 bytes per 32
//          elements (sub-block j of a K block at 256 j): byte 64 i + 4 c + e holds element
//          32 j + 4 i + e (i < 4) in its low nibble and element 32 j + 4 (i + 4) + e in its high
//          one (Q6_K: the code's low 4 bits)
//   qh     (Q5_0, Q5_1: 8, Q5_K: 64 uint64 per tile) bit 4 c + e of word 8 j + i = bit 4 of
//          element 32 j + 4 i + e
//   q6h    (Q6_K, 1024 bytes) bits 2 s, 2 s + 1 of byte 128 j + 64 h + 4 c + e = bits 4, 5 of
//          element 32 j + 4 (4 h + s) + e
//   sc     (K types) Q4_K/Q5_K: byte 16 j + c = the 6-bit scale of sub-block j; Q6_K: byte
//          16 g + c = the int8 scale of group g (16 elements)
//   mk     (Q4_K, Q5_K) byte 32 (j / 2) + 2 c + j % 2 = the 6-bit min of sub-block j
//   d      16 binary16 scales per tile, one per column
//   m      (Q4_1, Q5_1: the min; Q4_K, Q5_K: dmin) 16 binary16 per tile
// Q4_K and Q5_K tiles are 2.8 % and 2.3 % larger than the file's blocks (scales and mins a
// byte each); the others are the same size.
inline constexpr uint32_t kQuantTile = 16;
struct QuantView {
  const uint8_t* data = nullptr;  // the tiles
  uint32_t type = 0;
  uint32_t n = 0, k = 0;
};
// Whether a type runs on tiles (every quantized type).
bool tiled_type(uint32_t type);
// Bytes the tiled copy of an [n][k] matrix of a tiled type takes.
size_t tiled_bytes(uint32_t type, uint32_t n, uint32_t k);
// Repacks n rows (row_bytes apart, k elements each) into the tiled layout at out (tiled_bytes).
void tile_quant(const uint8_t* rows, size_t row_bytes, uint32_t type, uint32_t n, uint32_t k, uint8_t* out);
// The sections of a tiled matrix (null where the type has none).
struct TiledSections {
  const uint8_t* codes = nullptr;
  const uint64_t* qh = nullptr;
  const uint8_t* q6h = nullptr;
  const uint8_t* sc = nullptr;
  const uint8_t* mk = nullptr;
  const uint16_t* d = nullptr;
  const uint16_t* m = nullptr;
  uint32_t nb = 0;          // blocks per column
  uint32_t code_bytes = 0;  // per tile
};
TiledSections tiled_sections(const QuantView& w);

// Activation rows quantized to int8 as ggml's quantize_row_q8_0 (block 32, scale rounded to
// binary16) or quantize_row_q8_K (block 256, float scale) do it, laid out for the kernels:
// row r has qs[r * k ...] (k codes), d[r * k / block ...] (scales as float) and
// sums[r * k / 16 ...] (sums of each 16 codes).
inline constexpr uint32_t kAct32 = 32, kAct256 = 256;
struct QuantRows {
  const int8_t* qs = nullptr;
  const float* d = nullptr;
  const int16_t* sums = nullptr;
  uint32_t k = 0, block = kAct32;
};
// The activation block a weight type takes (kAct32 or kAct256); 0: not a quantized type.
uint32_t act_block(uint32_t type);
// Quantizes rows [r0, r1) of A (k floats each, lda apart) into the QuantRows buffers: the
// scalar definition (ggml's reference quantizers); Kernels::quantize gives the same bytes.
void quantize_rows(const float* a, size_t lda, uint32_t r0, uint32_t r1, uint32_t k, uint32_t block, int8_t* qs,
                   float* d, int16_t* sums);
// One block of quantize_rows (block elements at x): its codes and scale.
void quantize_block(const float* x, uint32_t block, int8_t* q, float& d);

// Keys are laid out per block transposed, [head_dim][block_tokens], values [block_tokens][head_dim].
struct AttentionArgs {
  const float* q = nullptr;  // [n_q][head_dim]: the query heads sharing this KV head
  uint32_t n_q = 1;
  uint32_t head_dim = 0;
  const int32_t* blocks = nullptr;  // the sequence's block table
  const float* k_base = nullptr;    // K of block 0 for this layer and KV head (F32 KV)
  const float* v_base = nullptr;    // V of block 0 for this layer and KV head (F32 KV)
  size_t block_stride = 0;          // floats between consecutive pool blocks (F32 KV)
  // Quantized KV (layout in kv_cache.h): kv_bits 8 or 4, k_base/v_base/block_stride unused.
  uint32_t kv_bits = 0;
  uint32_t group_size = 0;           // divides head_dim, a multiple of 16
  const uint8_t* k_bytes = nullptr;  // K region, block 0
  const uint8_t* v_bytes = nullptr;  // V region, block 0
  size_t block_bytes = 0;            // bytes between consecutive pool blocks
  uint32_t block_tokens = 16;        // a multiple of 16
  uint32_t n_keys = 0;               // attend to positions [0, n_keys)
  // A sliding window (docs/WINDOWS.md): keys before first_key are masked; 0: none. first_key <
  // n_keys. The kernels read no key before first_scored() and no value before first_key (keys
  // there may hold anything, NaN included), and give the bits they would give scoring every key
  // with the masked keys' probabilities exactly 0 (see masked_lanes).
  uint32_t first_key = 0;
  // Gemma 2's attention logit soft-capping: > 0, each score s (scale included) becomes
  // softcap * tanh(s / softcap) before the softmax; 0: none.
  float softcap = 0.0f;
  // Quantized KV with an F32 window: keys at positions >= f32_from (a multiple of
  // block_tokens, < n_keys) are read from F32 rows instead of the pool's codes: key j's K
  // and V (head_dim floats each) at win_k[j - f32_from] and win_v[j - f32_from]. Null: every
  // key is read from the codes.
  uint32_t f32_from = 0;
  const float* const* win_k = nullptr;
  const float* const* win_v = nullptr;
  // Rotated KV (kv_cache.h, KvScheme::kRotated; kv_bits 4 or 3, group_size unused): the
  // layer's K and V signs (head_dim floats each) and its 2^kv_bits levels.
  bool kv_rotated = false;
  const float* k_signs = nullptr;
  const float* v_signs = nullptr;
  const float* levels = nullptr;
  float scale = 1.0f;
  float* scores = nullptr;  // scratch, rows * n_q * round_up(n_keys + rows - 1, 16) floats
  float* out = nullptr;     // [n_q][head_dim]
  // Consecutive positions of one sequence (a prompt chunk, a speculative round's rows): row r's
  // query heads at q + r * q_row_stride, its output at out + r * out_row_stride, its keys
  // [0, n_keys + r). Each row's output is bitwise what it alone gives (rows = 1); the F32 cache's
  // kernels read K and V once for several rows. rows > 1 needs first_key == 0.
  uint32_t rows = 1;
  size_t q_row_stride = 0;
  size_t out_row_stride = 0;
};

// Row r of a multi-row AttentionArgs as a single row (the kernels that read each row alone).
inline AttentionArgs row_of(const AttentionArgs& x, uint32_t r) {
  AttentionArgs a = x;
  a.rows = 1;
  a.q = x.q + r * x.q_row_stride;
  a.out = x.out + r * x.out_row_stride;
  a.n_keys = x.n_keys + r;
  return a;
}

struct Kernels {
  const char* name;
  // C[m][n] for n in panels [p0, p1) of W and m < M:
  //   c = 0; for k in 0..K-1: c = fma(A[m][k], W[n][k], c)
  void (*gemm)(const float* a, size_t lda, uint32_t m, const PackedView& w, uint32_t p0, uint32_t p1, float* c,
               size_t ldc);
  // C[m][n] for BF16 pair panels and BF16 activation rows (a: m rows of w.k elements): c = 0,
  // then per pair q of K in order: c = ftz(fma(a[2q+1], W[n][2q+1], c)); c = ftz(fma(a[2q],
  // W[n][2q], c)), where ftz(x) is the zero of x's sign when |x| < FLT_MIN. That is what AVX-512
  // BF16's vdpbf16ps computes (odd element first, each sum rounded, denormals flushed), so
  // where the CPU has it the AVX-512 variant uses it: 32 multiply-adds an instruction.
  void (*gemm_bf16)(const uint16_t* a, uint32_t m, const PackedPairsView& w, uint32_t p0, uint32_t p1, float* c,
                    size_t ldc);
  // gemm of 16-bit weights widened to F32: exactly gemm on the widened values (same chain).
  void (*gemm16)(const float* a, size_t lda, uint32_t m, const Packed16View& w, uint32_t p0, uint32_t p1, float* c,
                 size_t ldc);
  // C[r][n] for r < m, n in [n0, n1): the dot product of weight row n with activation row r.
  // Integer sums are exact, so their order is free; the floats follow one fixed sequence.
  //  32-element types (tiled; n0 a multiple of kQuantTile): c = 0, then per block b in order,
  //  with isum = sum over the block of w_e a_e (w: the signed weight the scale multiplies,
  //  q - 8 for Q4_0, q - 16 for Q5_0) and asum = sum of a_e:
  //   Q8_0, Q4_0, Q5_0: c = fma(dw * da, float(isum), c)
  //   Q4_1, Q5_1:       c = fma(dw * da, float(isum), c); c = fma(mw * da, float(asum), c)
  //  K types: into 16 lanes l (+0 at the start), then c = the tree [i] += [i + 8], 4, 2, 1
  //  (reduce16); 256-element super-blocks b into lane b % 8 (j: the 8 sub-blocks of 32, g: the 16 of 16):
  //   Q4_K, Q5_K: l = fma(d * da, float(sum_j sc_j sum q a), l); l = fma(-(dmin * da), float(sum_j m_j sum a), l)
  //   Q6_K:       l = fma(d * da, float(sum_g sc_g sum (q - 32) a), l)
  // So a result never depends on m, the n range or the variant.
  void (*qgemm)(const QuantRows& a, uint32_t m, const QuantView& w, uint32_t n0, uint32_t n1, float* c, size_t ldc);
  // round_rows_bf16, bit for bit.
  void (*round_bf16)(const float* a, size_t lda, uint32_t r0, uint32_t r1, uint32_t k, uint16_t* out);
  // quantize_rows, bit for bit.
  void (*quantize)(const float* a, size_t lda, uint32_t r0, uint32_t r1, uint32_t k, uint32_t block, int8_t* qs,
                   float* d, int16_t* sums);
  // Per query head h: s_j = scale * (fma chain over d of q[d]*k_j[d]); softmax over j with
  // exp_approx(s_j - max) and 16-lane partial sums (lane j % 16, tree-reduced); then
  // out[d] = (fma chain over j of p_j * v_j[d]) * (1 / sum).
  // Quantized KV, dequantized inside the dot products (c: codes as floats, exact; G: the
  // groups of head_dim; qs_g = add chain over d in g of q[d]):
  //   s_j = scale * t, t = 0; per g: a = fma chain over d in g of q[d]*c_j[d];
  //         t = fma(kscale_jg, a, t); t = fma(kbias_jg, qs_g, t)
  //   out[d] = (o[d] + b_g) * (1 / sum), o[d] = fma chain over j of (p_j * vscale_jg) * c_j[d],
  //         b_g = fma chain over j of p_j * vbias_jg  (g the group of d)
  // With an F32 window, keys j >= f32_from are F32 rows scored in 16 lanes: lane l = fma
  // chain over d = l, l + 16, ... of q[d]*k_j[d], s_j = scale * (lanes tree-reduced as the
  // softmax sums are); their values continue o's chain after the coded ones:
  // o[d] = fma(p_j, v_j[d], o[d]).
  // Rotated KV (kv_rotated; L: the levels, n_j: row j's norm, c_j: its codes; R: the
  // transform of kv_rotation.h): per head, q~ = rotate_row(q, k_signs) once;
  //   s_j = (n_j * (fma chain over d of q~[d] * L[c_j[d]])) * scale
  //   a[d] = fma chain over coded j of (p_j * n_j) * L[c_j[d]]; o = unrotate_row(a, v_signs)
  // then the F32 window's values continue o's chain as above, and out[d] = o[d] * (1 / sum).
  // first_key and softcap (shape_scores) act between the scores and the softmax, the same
  // scalar code in every variant; every loop starts at the window (first_scored, masked_lanes).
  void (*attention)(const AttentionArgs& args);
  // out[i] = (g * sigmoid(g)) * up[i] with g = gate[i]; sigmoid via exp_approx(-|g|).
  void (*silu_mul)(const float* gate, const float* up, float* out, size_t n);
  // The lowest i < n holding the largest x[i], NaN counted as -inf; *max = that value. All -inf
  // or NaN (or n = 0): 0 and -inf. Exact, so every variant agrees by definition (greedy sampling).
  uint32_t (*argmax)(const float* x, uint32_t n, float* max);
  // out[c] = the largest x[i] over i in [c * kScreenChunk, (c + 1) * kScreenChunk) and i < n
  // (the greedy screen's chunks, greedy_screen.h). x finite. Exact, so every variant agrees.
  void (*chunk_max)(const float* x, uint32_t n, float* out);
};
inline constexpr uint32_t kScreenChunk = 64;

// The best variant this CPU runs. TANDEM_KERNELS=generic|avx2|avx512 overrides (tests
// use it to prove the variants agree bitwise).
const Kernels& best();
const Kernels* by_name(const char* name);  // nullptr if unknown or unsupported here

// The first key a variant scores: first_key rounded down to a group of 16 (one step of the
// softmax's 16 lanes), so that a windowed layer costs its window's keys, not the context's.
inline uint32_t first_scored(const AttentionArgs& args) { return args.first_key / 16 * 16; }

// One query head's scores s[first_scored, n_keys) after the variant computed them with running
// max `mx`: with a window or a cap, keys before first_key become -inf, the others are capped,
// and the max is taken again over [first_key, n_keys); without either, mx is returned
// untouched. Compiled once (kernels.cpp), so every variant gets the same bits.
float shape_scores(const AttentionArgs& args, float* s, float mx);

// What each of the softmax's 16 lane sums holds after `groups` groups of 16 masked keys: +0
// plus exp_approx(-inf) (the clamped exp(-87) a masked key's -inf score gives) `groups`
// times, in order. The softmax starts its lanes there at first_scored instead of adding those
// keys one by one, so skipping them changes no bit of the sum. The value chains start at
// first_key: a masked key's probability is 0 and fma(0, v, +0) is +0, so skipping it changes
// no bit either. A table up to 2^14 groups (256k keys), a loop past it.
float masked_lanes(uint32_t groups);

// exp for x <= 0 (softmax): Cody-Waite reduction + degree-6 polynomial, every step an
// explicit fma/mul/add so every variant yields the same bits. Relative error < 2e-7.
float exp_approx(float x);

}  // namespace tandem::engine::kernels
