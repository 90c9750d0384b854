#include "scheduler/block_pool.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tandem::scheduler {

uint64_t xxh3_block_hash(uint64_t parent, std::span<const int32_t> block) {
  return XXH3_64bits_withSeed(block.data(), block.size_bytes(), parent);
}

void chain_keys(std::span<const int32_t> tokens, uint32_t block_tokens, BlockHash hash, std::vector<uint64_t>& keys) {
  const size_t full = tokens.size() / block_tokens;
  while (keys.size() < full) {
    const size_t i = keys.size();
    keys.push_back(hash(i ? keys[i - 1] : 0, tokens.subspan(i * block_tokens, block_tokens)));
  }
}

BlockPool::BlockPool(uint32_t n_blocks, uint32_t block_tokens)
    : block_tokens_(block_tokens), total_(n_blocks), n_free_(n_blocks) {
  // Block ids travel as int32_t.
  assert(n_blocks <= static_cast<uint32_t>(std::numeric_limits<int32_t>::max()));
  track(std::min(n_blocks, kInitialBlocks) - (n_blocks > 0));
}

void BlockPool::track(uint32_t id) {
  if (id < tracked() || total_ == 0) return;
  const uint32_t n =
      static_cast<uint32_t>(std::min<uint64_t>(total_, std::max<uint64_t>(uint64_t{id} + 1, uint64_t{tracked()} * 2)));
  refs_.resize(n, 0);
  published_.resize(n, 0);
  key_.resize(n, 0);
  parent_.resize(n, kNone);
  parent_gen_.resize(n, 0);
  gen_.resize(n, 0);
  prev_.resize(n, kNone);
  next_.resize(n, kNone);
}

uint32_t BlockPool::next_free(uint32_t from) const {
  const uint32_t n = tracked();
  while (from < n && (refs_[from] != 0 || published_[from])) ++from;
  return from;
}

void BlockPool::lru_push_back(int32_t id) {
  prev_[id] = lru_tail_;
  next_[id] = kNone;
  if (lru_tail_ != kNone)
    next_[lru_tail_] = id;
  else
    lru_head_ = id;
  lru_tail_ = id;
}

void BlockPool::lru_remove(int32_t id) {
  if (prev_[id] != kNone)
    next_[prev_[id]] = next_[id];
  else
    lru_head_ = next_[id];
  if (next_[id] != kNone)
    prev_[next_[id]] = prev_[id];
  else
    lru_tail_ = prev_[id];
  prev_[id] = next_[id] = kNone;
}

void BlockPool::drop_key(int32_t id) {
  if (!published_[id]) return;
  auto it = by_key_.find(key_[id]);
  if (it != by_key_.end() && it->second == id) by_key_.erase(it);
  published_[id] = 0;
  parent_[id] = kNone;
}

bool BlockPool::allocate(uint32_t n, std::vector<int32_t>& table) {
  if (n > available()) return false;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t id = total();
    if (n_free_ > 0) {
      if (!table.empty()) {
        const int64_t after = static_cast<int64_t>(table.back()) + 1;
        if (after >= 0 && after < total() && is_free(static_cast<uint32_t>(after))) id = static_cast<uint32_t>(after);
      }
      if (id == total()) {
        lowest_free_ = next_free(lowest_free_);
        id = lowest_free_;
      }
      --n_free_;
      track(id);
    } else {
      // Evict the least recently used cached block (leaves went in before their parents).
      id = static_cast<uint32_t>(lru_head_);
      lru_remove(lru_head_);
      drop_key(static_cast<int32_t>(id));
      ++gen_[id];  // children published under its old content no longer match
      --n_cached_;
      ++evictions_;
    }
    assert(id < total() && refs_[id] == 0 && !published_[id]);
    refs_[id] = 1;
    table.push_back(static_cast<int32_t>(id));
  }
  return true;
}

void BlockPool::ref(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    const bool cached = is_cached(id);
    assert((is_used(id) || cached) && "ref of a free or unknown block");
    if (!is_used(id) && !cached) {
      ++bad_refs_;
      continue;
    }
    if (cached) {
      lru_remove(id);
      --n_cached_;
    }
    assert(refs_[id] < std::numeric_limits<uint32_t>::max());
    ++refs_[id];
  }
}

void BlockPool::release(std::span<const int32_t> ids) {
  // Last block first: it becomes the least recent of the table (evicted before its parents).
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    const int32_t id = *it;
    assert(is_used(id) && "release of a free or unknown block");
    if (!is_used(id)) {
      ++double_releases_;
      continue;
    }
    if (--refs_[id] > 0) continue;
    if (published_[id]) {
      lru_push_back(id);
      ++n_cached_;
    } else {
      ++n_free_;
      if (static_cast<uint32_t>(id) < lowest_free_) lowest_free_ = static_cast<uint32_t>(id);
    }
  }
}

bool BlockPool::publish(std::span<const int32_t> table, uint32_t index, uint64_t key, std::span<const int32_t> tokens) {
  const int32_t id = table[index];
  if (!is_used(id) || published_[id] || by_key_.count(key)) return false;
  if (index > 0 && !published_[table[index - 1]]) return false;  // the chain must be reachable
  if (tokens_.size() < size_t{tracked()} * block_tokens_) tokens_.resize(size_t{tracked()} * block_tokens_);
  std::memcpy(&tokens_[size_t(id) * block_tokens_], tokens.data() + size_t{index} * block_tokens_,
              block_tokens_ * sizeof(int32_t));
  published_[id] = 1;
  key_[id] = key;
  parent_[id] = index > 0 ? table[index - 1] : kNone;
  parent_gen_[id] = index > 0 ? gen_[table[index - 1]] : 0;
  by_key_.emplace(key, id);
  return true;
}

uint32_t BlockPool::match(std::span<const int32_t> tokens, std::span<const uint64_t> keys,
                          std::vector<int32_t>& out) const {
  uint32_t n = 0;
  int32_t parent = kNone;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = by_key_.find(keys[i]);
    if (it == by_key_.end()) break;
    const int32_t id = it->second;
    if (parent_[id] != parent || (parent != kNone && parent_gen_[id] != gen_[parent])) break;
    if (std::memcmp(&tokens_[size_t(id) * block_tokens_], tokens.data() + i * block_tokens_,
                    block_tokens_ * sizeof(int32_t)) != 0)
      break;
    out.push_back(id);
    parent = id;
    ++n;
  }
  return n;
}

void BlockPool::unpublish(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    if (id < 0 || static_cast<uint32_t>(id) >= tracked() || !published_[id]) continue;
    if (refs_[id] == 0) {  // cached: it becomes free
      lru_remove(id);
      --n_cached_;
      ++n_free_;
      if (static_cast<uint32_t>(id) < lowest_free_) lowest_free_ = static_cast<uint32_t>(id);
    }
    drop_key(id);
    ++gen_[id];
  }
}

bool BlockPool::consistent() const {
  uint32_t n_free = total() - tracked(), n_cached = 0, in_lru = 0;
  for (uint32_t i = 0; i < tracked(); ++i) {
    if (refs_[i] != 0) continue;
    if (published_[i]) {
      ++n_cached;
    } else {
      if (i < lowest_free_) return false;
      ++n_free;
    }
  }
  for (int32_t id = lru_head_; id != kNone && in_lru <= total(); id = next_[id]) {
    if (!is_cached(id)) return false;
    ++in_lru;
  }
  for (const auto& [key, id] : by_key_)
    if (!published_[id] || key_[id] != key) return false;
  return n_free == n_free_ && n_cached == n_cached_ && in_lru == n_cached_ && lowest_free_ <= total();
}

}  // namespace tandem::scheduler
