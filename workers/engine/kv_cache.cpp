#include "workers/engine/kv_cache.h"

#include <cstdlib>
#include <cstring>
#include <sys/mman.h>

#include <algorithm>
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
  pool->head_block_floats_ = size_t{config.head_dim()} * block_tokens;
  const size_t bytes = pool->block_bytes() * n_blocks;
  // 2 MiB alignment and huge pages where the kernel offers them: attention walks this
  // memory in long runs, and page walks under virtualization are expensive.
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, rounded);
  if (!p) return Status::error(Code::kUnavailable, "cannot allocate " + std::to_string(bytes) + " bytes of KV cache");
  madvise(p, rounded, MADV_HUGEPAGE);  // advisory; failure only costs speed
  // Zeroed so lanes past a sequence's last key hold finite values.
  std::memset(p, 0, bytes);
  pool->data_.reset(static_cast<float*>(p));
  return pool;
}

size_t KvPool::bytes_per_block(const ModelConfig& config, uint32_t block_tokens) {
  return size_t{2} * config.n_layers * config.kv_dim() * block_tokens * sizeof(float);
}

uint32_t KvPool::blocks_for_bytes(const ModelConfig& config, size_t bytes, uint32_t block_tokens) {
  const size_t per_block = bytes_per_block(config, block_tokens);
  return per_block == 0 ? 0 : static_cast<uint32_t>(bytes / per_block);
}

BlockAllocator::BlockAllocator(uint32_t n_blocks) : used_(n_blocks, 0), n_free_(n_blocks) {}

bool BlockAllocator::ensure(std::vector<int32_t>& table, uint32_t tokens, uint32_t block_tokens) {
  const size_t need = (tokens + block_tokens - 1) / block_tokens;
  if (need <= table.size()) return true;
  if (need - table.size() > n_free_) return false;
  while (table.size() < need) {
    uint32_t id;
    const int64_t after = table.empty() ? -1 : int64_t{table.back()} + 1;
    if (after >= 0 && after < static_cast<int64_t>(used_.size()) && !used_[after]) {
      id = static_cast<uint32_t>(after);
    } else {
      while (used_[lowest_free_]) ++lowest_free_;
      id = lowest_free_;
    }
    used_[id] = 1;
    --n_free_;
    table.push_back(static_cast<int32_t>(id));
  }
  return true;
}

void BlockAllocator::release(std::vector<int32_t>& table) {
  for (int32_t id : table) {
    used_[id] = 0;
    lowest_free_ = std::min(lowest_free_, static_cast<uint32_t>(id));
  }
  n_free_ += static_cast<uint32_t>(table.size());
  table.clear();
}

}  // namespace tandem::engine
