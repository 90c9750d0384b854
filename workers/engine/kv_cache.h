// The paged KV cache: a pool of fixed-size blocks holding keys and values of every layer.
// A sequence is a block table (ids into the pool) owned by the caller — the scheduler
// decides which blocks a sequence has; the pool only holds the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/status.h"
#include "workers/engine/huge_pages.h"
#include "workers/engine/kv_rotation.h"
#include "workers/engine/model_file.h"

namespace tandem::engine {

// How K and V are stored. bits 0: F32. bits 8 or 4: uniform codes per group of
// `group_size` consecutive elements of a head vector, min-max affine (x ~ scale * code +
// bias, F32 scale and bias), rounded to nearest. A group never spans heads: on a model
// whose head_dim is below the group size (the tiny test preset, head_dim 16) the group is
// the whole head vector. skip_last_layer keeps the last layer in F32 (quality: mlx-vlm's
// default). f32_window (quantized formats): a sequence also keeps the K and V of its most
// recent blocks in F32 — 1: its open (last, not yet full) block; 2: that and the one
// before — in a few pool blocks of its own (its tail, KvPool::tail_blocks), and attention
// reads the keys of a query's own block and the f32_window - 1 before it from there. Every
// row is still quantized once when written, but the keys nearest a query, which carry most
// of its attention, are exact (KIVI's full-precision residual, 16-31 tokens long). Quality:
// on the trained tiny model, 8-bit free-running greedy agreement goes from 86% (window 0)
// to 95% (1) and 98% (2) (bench/RESULTS.md); it costs f32_window F32 blocks per sequence.
//
// scheme kRotated (docs/KV_ROTATED.md, bits 4 or 3): each head row is stored as its F32 L2
// norm plus its direction rotated by a randomized Hadamard transform (signs from
// rotation_seed, the layer and K|V), each rotated coordinate the index of a Lloyd-Max level;
// group_size is unused. The F32 window and skip_last_layer work as for uniform codes.
enum class KvScheme : uint32_t { kUniform = 0, kRotated = 1 };

// The rotated scheme's sign seed. Fixed, not per model or flag: every worker, `tandem run`
// and the service agree without configuration; registration and the handoff carry it, so a
// build that changes it is refused by one that does not, never silently misread.
inline constexpr uint64_t kKvRotationSeed = 0x7A4E3D5C9B1F2E81ull;

struct KvFormat {
  uint32_t bits = 0;
  uint32_t group_size = 64;
  bool skip_last_layer = false;
  uint32_t f32_window = 2;  // 0, 1 or 2 blocks
  KvScheme scheme = KvScheme::kUniform;
  uint64_t rotation_seed = kKvRotationSeed;

  bool rotated() const { return scheme == KvScheme::kRotated; }
  // Errors name the bad value: bits not 0/8/4 (uniform) or 4/3 (rotated), group not 32/64/128 ...
  Status validate_values() const;
  // ... or, for this model, the group not dividing head_dim (uniform) or a head_dim the
  // rotation cannot take (rotated: a power of two in [16, 256]).
  Status validate(const ModelConfig& config) const;
  // The group actually used for a head of `head_dim` elements: min(group_size, head_dim).
  uint32_t effective_group(uint32_t head_dim) const { return group_size < head_dim ? group_size : head_dim; }
  // Bits of layer `layer` of `n_layers` (0 for the last one with skip_last_layer).
  uint32_t layer_bits(uint32_t layer, uint32_t n_layers) const {
    return skip_last_layer && layer + 1 == n_layers ? 0 : bits;
  }
  // "f32", "q8/g64", "q4/g32+f32-last", "q8/g64+w1" (F32 window of 1 block), "rot4", "rot3+f32-last"
  std::string to_string() const;
  bool operator==(const KvFormat&) const = default;
};

// Quantizes n values (one group) to codes in [0, 2^bits - 1], one per byte in `codes`:
// bias = min, scale = (max - min) / (2^bits - 1) (0 for a constant group: every code 0),
// code = round((x - bias) / scale). |x - (scale * code + bias)| <= scale / 2 up to the
// rounding of scale to float. The one routine every kernel variant's cache is written with.
struct QuantParams {
  float scale = 0, bias = 0;
};
QuantParams quantize_group(const float* x, uint32_t n, uint32_t bits, uint8_t* codes);

// Layout: one region per (layer, KV head, K or V), each an array of n_blocks blocks; a hybrid
// model's recurrent layers have none (their state is in a StatePool, state_pool.h).
// (Rotated layers: see below.)
// F32 layers:
//   K block: [head_dim][block_tokens] floats (transposed: 16 keys per vector)
//   V block: [block_tokens][head_dim] floats
// Quantized layers (8 bits: one code per byte; 4 bits: two codes per byte, the even index
// in the low nibble):
//   K block: codes [head_dim][block_tokens], then F32 scales [groups][block_tokens], then
//            F32 biases [groups][block_tokens]  (16 keys' parameters side by side)
//   V block: codes [block_tokens][head_dim], then F32 scales [block_tokens][groups], then
//            F32 biases [block_tokens][groups]
// Rotated layers (KvScheme::kRotated; codes: 4 bits two per byte as above; 3 bits as three
// bit planes, a row of n codes taking bit 0 of every code in n / 8 bytes, then bit 1, then
// bit 2, code i at bit i % 8 of byte i / 8 of each plane: rotated_code_at):
//   K block: codes [head_dim][block_tokens], then F32 norms [block_tokens]
//   V block: codes [block_tokens][head_dim], then F32 norms [block_tokens]
// so a sequence whose blocks have consecutive ids reads one contiguous run per region in
// attention. (Scattered 4 KiB pieces read at a third of the bandwidth of long runs on
// this machine: see bench/RESULTS.md.)
class KvPool {
 public:
  // block_tokens must be a positive multiple of 16; the format must validate.
  // `ring_blocks` > 0 (rings, docs/WINDOWS.md): the windowed layers' regions hold that many
  // blocks, ids of their own (a sequence's ring, SeqStep::ring), and the full layers' n_blocks;
  // refused for a model without windowed layers and with an F32 window tail (its rows live in
  // every quantized layer's region under the full layers' ids).
  static Result<std::unique_ptr<KvPool>> create(const ModelConfig& config, uint32_t n_blocks,
                                                uint32_t block_tokens = 16, const KvFormat& format = {},
                                                uint32_t ring_blocks = 0);
  // Bytes one block takes across all layers, heads, K and V, in this format.
  // windowed_only: the sliding-window layers' part only (a ring block's bytes with rings).
  static size_t bytes_per_block(const ModelConfig& config, uint32_t block_tokens = 16, const KvFormat& format = {},
                                bool windowed_only = false);
  // Pool blocks a sequence's tail takes (the F32 copy of its f32_window most recent blocks,
  // kept in the quantized layers' regions: a row of head_dim floats per token); 0 when the
  // format keeps no F32 window or has no quantized layer.
  static uint32_t tail_blocks_for(const ModelConfig& config, uint32_t block_tokens = 16, const KvFormat& format = {});
  // Number of blocks that fit in `bytes` for this model and format.
  static uint32_t blocks_for_bytes(const ModelConfig& config, size_t bytes, uint32_t block_tokens = 16,
                                   const KvFormat& format = {});

  uint32_t n_blocks() const { return n_blocks_; }
  uint32_t ring_blocks() const { return ring_blocks_; }  // 0: no rings, every layer under n_blocks ids
  // Layer `layer` keeps its blocks in the ring region (a windowed layer of a pool with rings).
  bool ring_layer(uint32_t layer) const { return ring_layer_[layer] != 0; }
  // A hybrid's recurrent layer: no KV regions here (its state is in a StatePool).
  bool recurrent_layer(uint32_t layer) const { return recurrent_[layer] != 0; }
  uint32_t block_tokens() const { return block_tokens_; }
  uint32_t n_layers() const { return n_layers_; }
  uint32_t n_kv_heads() const { return n_kv_heads_; }
  uint32_t head_dim() const { return head_dim_; }
  const KvFormat& format() const { return format_; }
  // Bits layer `layer` is stored with (0: F32).
  uint32_t layer_bits(uint32_t layer) const { return format_.layer_bits(layer, n_layers_); }
  // The group size in use (see KvFormat::effective_group).
  uint32_t group_size() const { return format_.effective_group(head_dim_); }
  // Rotated scheme: the ±1 signs of (layer, kv) (head_dim floats) and the level table; the
  // signs are those of kv_rotation::signs(format().rotation_seed, layer, kv).
  const float* rotation_signs(uint32_t layer, uint32_t kv) const {
    return signs_.data() + (size_t{layer} * 2 + kv) * head_dim_;
  }
  const kv_rotation::Levels* rotation_levels() const { return levels_; }
  // Bytes one block takes across all layers, heads, K and V.
  // (With rings: the full layers' only; ring_block_bytes() is the windowed layers'.)
  size_t block_bytes() const { return block_bytes_; }
  size_t ring_block_bytes() const { return ring_block_bytes_; }
  // Blocks one sequence's tail takes (see tail_blocks_for); 0: no F32 window.
  uint32_t tail_blocks() const { return tail_blocks_; }
  // Tokens a tail holds: f32_window * block_tokens (position p at row p % tail_tokens()).
  uint32_t tail_tokens() const { return tail_blocks_ ? format_.f32_window * block_tokens_ : 0; }
  // Row `row` (< tail_tokens) of a tail in region (layer, kv_head, kv): head_dim floats.
  // Row r lives in tail block r / rows_per_block at slot r % rows_per_block of its region.
  float* tail_row(uint32_t layer, uint32_t kv_head, uint32_t kv, std::span<const int32_t> tail, uint32_t row) {
    return reinterpret_cast<float*>(block_data(layer, kv_head, kv, static_cast<uint32_t>(tail[row / tail_rows_])) +
                                    size_t{row % tail_rows_} * head_dim_ * sizeof(float));
  }

  // Bytes one block takes inside one (layer, kv head, K|V) region (differs per layer with
  // skip_last_layer).
  size_t region_block_bytes(uint32_t layer) const {
    return layer_bits(layer) ? quant_region_block_ : f32_region_block_;
  }
  // The bytes of block `block` in the region (layer, kv_head, kv) where kv is 0 for K, 1
  // for V. Copying every region's block_data bytes of a block into a pool of the same
  // format transfers that block's KV exactly.
  uint8_t* block_data(uint32_t layer, uint32_t kv_head, uint32_t kv, uint32_t block) {
    return data_.get() + layer_offset_[layer] +
           ((size_t{kv_head} * 2 + kv) * layer_blocks_[layer] + block) * region_block_bytes(layer);
  }
  const uint8_t* block_data(uint32_t layer, uint32_t kv_head, uint32_t kv, uint32_t block) const {
    return const_cast<KvPool*>(this)->block_data(layer, kv_head, kv, block);
  }

  // Stores K and V (head_dim floats each) of one token at `slot` of `block` for (layer,
  // kv_head), quantized once here when the layer is quantized. Touches only that token's
  // codes and parameters.
  void write(uint32_t layer, uint32_t kv_head, uint32_t block, uint32_t slot, const float* k, const float* v);
  // The K and V of one token as attention would see them from the block: dequantized
  // (scale * code + bias; rotated: norm * level, rotated back) in a quantized layer, as
  // stored in an F32 one.
  void read(uint32_t layer, uint32_t kv_head, uint32_t block, uint32_t slot, float* k, float* v) const;

 private:
  KvPool() = default;
  Status lay_out_rings(const ModelConfig& config, uint32_t ring_blocks);  // layer_blocks_, ring_layer_
  void write_uniform(uint8_t* kb, uint8_t* vb, uint32_t slot, uint32_t bits, const float* k, const float* v);
  void write_rotated(uint32_t layer, uint8_t* kb, uint8_t* vb, uint32_t slot, uint32_t bits, const float* k,
                     const float* v);
  void read_rotated(uint32_t layer, const uint8_t* kb, const uint8_t* vb, uint32_t slot, uint32_t bits, float* k,
                    float* v) const;
  std::vector<float> signs_;                     // rotated: [layer][K|V][head_dim]
  const kv_rotation::Levels* levels_ = nullptr;  // rotated: the table of (head_dim, bits)
  HugeMemory data_;
  KvFormat format_;
  uint32_t n_blocks_ = 0, block_tokens_ = 16, n_layers_ = 0, n_kv_heads_ = 0, head_dim_ = 0;
  size_t f32_region_block_ = 0, quant_region_block_ = 0, block_bytes_ = 0;
  uint32_t tail_blocks_ = 0, tail_rows_ = 1;  // tail rows per block (quantized regions)
  std::vector<size_t> layer_offset_;          // byte offset of each layer's regions
  std::vector<uint8_t> recurrent_;            // per layer: a recurrent layer, no regions
  std::vector<uint32_t> layer_blocks_;        // blocks in each layer's regions (n_blocks_ or ring_blocks_)
  std::vector<uint8_t> ring_layer_;
  uint32_t ring_blocks_ = 0;
  size_t ring_block_bytes_ = 0;
};

// Bytes of one block in one region for a head of `head_dim`, `block_tokens` tokens.
size_t region_block_bytes(uint32_t head_dim, uint32_t block_tokens, uint32_t bits, uint32_t group,
                          KvScheme scheme = KvScheme::kUniform);

// Block ids for in-process use (tandem run, tests, benchmarks); the service's scheduler
// has its own accounting. Prefers the id after a table's last block, then the lowest
// free id, so tables stay contiguous where the pool allows.
class BlockAllocator {
 public:
  explicit BlockAllocator(uint32_t n_blocks);
  uint32_t free_blocks() const { return n_free_; }
  // Appends blocks to `table` until it covers `tokens` positions; false (table unchanged)
  // if not enough blocks are free.
  bool ensure(std::vector<int32_t>& table, uint32_t tokens, uint32_t block_tokens);
  void release(std::vector<int32_t>& table);

 private:
  std::vector<uint8_t> used_;
  uint32_t n_free_ = 0;
  uint32_t lowest_free_ = 0;  // no free id below this
};

}  // namespace tandem::engine
