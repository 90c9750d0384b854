#include "workers/engine/kv_cache.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace tandem::engine {

void KvPool::FreeDeleter::operator()(float* p) const { std::free(p); }

Result<std::unique_ptr<KvPool>> KvPool::create(const ModelConfig& config, uint32_t n_blocks,
                                               uint32_t block_tokens) {
  if (block_tokens == 0 || block_tokens % 16 != 0)
    return Status::invalid("KV block size " + std::to_string(block_tokens) +
                           " tokens is not a positive multiple of 16");
  if (n_blocks == 0) return Status::invalid("KV pool needs at least one block");
  auto pool = std::unique_ptr<KvPool>(new KvPool());
  pool->n_blocks_ = n_blocks;
  pool->block_tokens_ = block_tokens;
  pool->n_layers_ = config.n_layers;
  pool->n_kv_heads_ = config.n_kv_heads;
  pool->head_dim_ = config.head_dim();
  pool->block_floats_ = size_t{2} * config.n_layers * config.kv_dim() * block_tokens;
  const size_t bytes = pool->block_floats_ * n_blocks * sizeof(float);
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) return Status::error(Code::kUnavailable, "cannot allocate " + std::to_string(bytes) + " bytes of KV cache");
  // Zeroed so lanes past a sequence's last key hold finite values.
  std::memset(p, 0, bytes);
  pool->data_.reset(static_cast<float*>(p));
  return pool;
}

uint32_t KvPool::blocks_for_bytes(const ModelConfig& config, size_t bytes, uint32_t block_tokens) {
  const size_t per_block = size_t{2} * config.n_layers * config.kv_dim() * block_tokens * sizeof(float);
  return per_block == 0 ? 0 : static_cast<uint32_t>(bytes / per_block);
}

size_t KvPool::k_offset(uint32_t layer, uint32_t kv_head) const {
  const size_t head = size_t{head_dim_} * block_tokens_;
  return (size_t{layer} * 2 * n_kv_heads_ + kv_head) * head;
}

size_t KvPool::v_offset(uint32_t layer, uint32_t kv_head) const {
  const size_t head = size_t{head_dim_} * block_tokens_;
  return (size_t{layer} * 2 * n_kv_heads_ + n_kv_heads_ + kv_head) * head;
}

BlockAllocator::BlockAllocator(uint32_t n_blocks) {
  free_.reserve(n_blocks);
  for (uint32_t i = n_blocks; i > 0; --i) free_.push_back(static_cast<int32_t>(i - 1));
}

bool BlockAllocator::ensure(std::vector<int32_t>& table, uint32_t tokens, uint32_t block_tokens) {
  const size_t need = (tokens + block_tokens - 1) / block_tokens;
  if (need <= table.size()) return true;
  if (need - table.size() > free_.size()) return false;
  while (table.size() < need) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void BlockAllocator::release(std::vector<int32_t>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) free_.push_back(*it);
  table.clear();
}

}  // namespace tandem::engine
