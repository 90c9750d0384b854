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
#include "workers/engine/model_config.h"

namespace tandem::engine {

// Layout of one block (contiguous, so a block moves between workers as one frame):
//   for each layer: K [kv_heads][head_dim][block_tokens] (transposed: 16 keys per vector)
//                   V [kv_heads][block_tokens][head_dim]
class KvPool {
 public:
  // block_tokens must be a positive multiple of 16.
  static Result<std::unique_ptr<KvPool>> create(const ModelConfig& config, uint32_t n_blocks,
                                                uint32_t block_tokens = 16);
  // Number of blocks that fit in `bytes` for this model.
  static uint32_t blocks_for_bytes(const ModelConfig& config, size_t bytes, uint32_t block_tokens = 16);

  uint32_t n_blocks() const { return n_blocks_; }
  uint32_t block_tokens() const { return block_tokens_; }
  size_t block_floats() const { return block_floats_; }
  size_t block_bytes() const { return block_floats_ * sizeof(float); }

  float* block(int32_t id) { return data_.get() + static_cast<size_t>(id) * block_floats_; }
  const float* block(int32_t id) const { return data_.get() + static_cast<size_t>(id) * block_floats_; }
  // Offsets inside a block.
  size_t k_offset(uint32_t layer, uint32_t kv_head) const;
  size_t v_offset(uint32_t layer, uint32_t kv_head) const;

 private:
  KvPool() = default;
  struct FreeDeleter { void operator()(float* p) const; };
  std::unique_ptr<float, FreeDeleter> data_;
  uint32_t n_blocks_ = 0, block_tokens_ = 16, n_layers_ = 0, n_kv_heads_ = 0, head_dim_ = 0;
  size_t block_floats_ = 0;
};

// A plain free list of block ids, for in-process use (tandem run, tests, benchmarks).
// The service's scheduler has its own accounting.
class BlockAllocator {
 public:
  explicit BlockAllocator(uint32_t n_blocks);
  uint32_t free_blocks() const { return static_cast<uint32_t>(free_.size()); }
  // Appends blocks to `table` until it covers `tokens` positions; false (table unchanged)
  // if not enough blocks are free.
  bool ensure(std::vector<int32_t>& table, uint32_t tokens, uint32_t block_tokens);
  void release(std::vector<int32_t>& table);

 private:
  std::vector<int32_t> free_;
};

}  // namespace tandem::engine
