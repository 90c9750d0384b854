// The paged KV cache: a pool of fixed-size blocks holding keys and values of every layer.
// A sequence is a block table (ids into the pool) owned by the caller — the scheduler
// decides which blocks a sequence has; the pool only holds the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/status.h"
#include "workers/engine/model_file.h"

namespace tandem::engine {

// Layout: one region per (layer, KV head, K or V), each an array of n_blocks blocks:
//   K block: [head_dim][block_tokens] (transposed: 16 keys per vector)
//   V block: [block_tokens][head_dim]
// so a sequence whose blocks have consecutive ids reads one contiguous run per region in
// attention. (Scattered 4 KiB pieces read at a third of the bandwidth of long runs on
// this machine: see bench/RESULTS.md.)
class KvPool {
 public:
  // block_tokens must be a positive multiple of 16.
  static Result<std::unique_ptr<KvPool>> create(const ModelConfig& config, uint32_t n_blocks,
                                                uint32_t block_tokens = 16);
  // Bytes one block takes across all layers, heads, K and V.
  static size_t bytes_per_block(const ModelConfig& config, uint32_t block_tokens = 16);
  // Number of blocks that fit in `bytes` for this model.
  static uint32_t blocks_for_bytes(const ModelConfig& config, size_t bytes, uint32_t block_tokens = 16);

  uint32_t n_blocks() const { return n_blocks_; }
  uint32_t block_tokens() const { return block_tokens_; }
  size_t block_bytes() const { return 2 * size_t{n_layers_} * n_kv_heads_ * head_block_floats_ * sizeof(float); }
  // Floats between consecutive blocks inside one region.
  size_t head_block_floats() const { return head_block_floats_; }
  uint32_t n_layers() const { return n_layers_; }
  uint32_t n_kv_heads() const { return n_kv_heads_; }

  // Byte-level access for moving blocks between pools of the same format (KV handoff).
  // Bytes one block takes inside one (layer, KV head, K|V) region.
  size_t region_block_bytes(uint32_t /*layer*/) const { return head_block_floats_ * sizeof(float); }
  // The bytes of block `block` in the region (layer, kv_head, kv): kv 0 is K, 1 is V.
  uint8_t* block_data(uint32_t layer, uint32_t kv_head, uint32_t kv, uint32_t block) {
    return reinterpret_cast<uint8_t*>(region(layer, kv_head, kv) + size_t{block} * head_block_floats_);
  }

  // Block 0 of the K (or V) region of one layer and KV head.
  float* k_region(uint32_t layer, uint32_t kv_head) { return region(layer, kv_head, 0); }
  float* v_region(uint32_t layer, uint32_t kv_head) { return region(layer, kv_head, 1); }

 private:
  KvPool() = default;
  float* region(uint32_t layer, uint32_t kv_head, uint32_t kv) {
    return data_.get() + ((size_t{layer} * n_kv_heads_ + kv_head) * 2 + kv) * n_blocks_ * head_block_floats_;
  }
  struct FreeDeleter { void operator()(float* p) const; };
  std::unique_ptr<float, FreeDeleter> data_;
  uint32_t n_blocks_ = 0, block_tokens_ = 16, n_layers_ = 0, n_kv_heads_ = 0;
  size_t head_block_floats_ = 0;
};

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
