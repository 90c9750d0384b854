#include "workers/engine/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>

namespace tandem::engine {

namespace {
constexpr size_t kHuge = size_t{2} << 20;
}

void Unmap::operator()(uint8_t* p) const {
  if (p) munmap(p, bytes);
}

HugeMemory map_huge(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kHuge - 1) / kHuge * kHuge;
  // Map 2 MiB more than needed and cut both ends so the start is 2 MiB aligned.
  void* raw = mmap(nullptr, rounded + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return {};
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHuge - 1) / kHuge * kHuge;
  if (aligned > start) munmap(raw, aligned - start);
  if (const size_t tail = start + kHuge - aligned; tail > 0) munmap(reinterpret_cast<void*>(aligned + rounded), tail);
  auto* p = reinterpret_cast<uint8_t*>(aligned);
  madvise(p, rounded, MADV_HUGEPAGE);  // advisory
  return HugeMemory(p, Unmap{rounded});
}

void* WeightArena::allocate(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  if (used_ + bytes > capacity_) {
    HugeMemory chunk = map_huge(std::max(bytes, kChunk));
    if (!chunk) return nullptr;
    capacity_ = chunk.get_deleter().bytes;
    used_ = 0;
    chunks_.push_back(std::move(chunk));
  }
  void* p = chunks_.back().get() + used_;  // anonymous pages come zeroed
  used_ += bytes;
  return p;
}

}  // namespace tandem::engine
