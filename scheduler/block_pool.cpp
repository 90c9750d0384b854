#include "scheduler/block_pool.h"

#include <cassert>
#include <limits>

namespace tandem::scheduler {

BlockPool::BlockPool(uint32_t n_blocks) : refs_(n_blocks, 0), n_free_(n_blocks), lowest_free_(0) {
  // Block ids travel as int32_t.
  assert(n_blocks <= static_cast<uint32_t>(std::numeric_limits<int32_t>::max()));
}

uint32_t BlockPool::next_free(uint32_t from) const {
  const uint32_t n = total();
  while (from < n && refs_[from] != 0) ++from;
  return from;
}

bool BlockPool::allocate(uint32_t n, std::vector<int32_t>& table) {
  if (n > n_free_) return false;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t id = total();
    if (!table.empty()) {
      const int64_t after = static_cast<int64_t>(table.back()) + 1;
      if (after >= 0 && after < total() && refs_[after] == 0) id = static_cast<uint32_t>(after);
    }
    if (id == total()) {
      lowest_free_ = next_free(lowest_free_);
      id = lowest_free_;
    }
    assert(id < total() && refs_[id] == 0);
    refs_[id] = 1;
    --n_free_;
    table.push_back(static_cast<int32_t>(id));
  }
  return true;
}

void BlockPool::ref(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    assert(is_used(id) && "ref of a free or unknown block");
    if (!is_used(id)) {
      ++bad_refs_;
      continue;
    }
    assert(refs_[id] < std::numeric_limits<uint32_t>::max());
    ++refs_[id];
  }
}

void BlockPool::release(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    assert(is_used(id) && "release of a free or unknown block");
    if (!is_used(id)) {
      ++double_releases_;
      continue;
    }
    if (--refs_[id] == 0) {
      ++n_free_;
      if (static_cast<uint32_t>(id) < lowest_free_) lowest_free_ = static_cast<uint32_t>(id);
    }
  }
}

bool BlockPool::consistent() const {
  uint32_t n_zero = 0;
  for (uint32_t i = 0; i < total(); ++i) {
    if (refs_[i] != 0) continue;
    if (i < lowest_free_) return false;
    ++n_zero;
  }
  return n_zero == n_free_ && lowest_free_ <= total();
}

}  // namespace tandem::scheduler
