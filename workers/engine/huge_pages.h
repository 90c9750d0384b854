#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace tandem::engine {

// Anonymous memory aligned to 2 MiB and advised for transparent huge pages (the machine's
// THP mode is usually `madvise`, so plain heap memory stays on 4 KiB pages). Weights and KV
// are walked in long runs every step; on 4 KiB pages each run pays a page walk every 4 KiB,
// and page walks under virtualization are expensive. Pages are committed when first
// touched; the advice is only advice (failure costs speed, never correctness).
struct Unmap {
  size_t bytes = 0;
  void operator()(uint8_t* p) const;
};
using HugeMemory = std::unique_ptr<uint8_t, Unmap>;

// `bytes` rounded up to 2 MiB; empty when the mapping fails (errno says why).
HugeMemory map_huge(size_t bytes);

// The engine's packed weights, carved from a few large huge-page mappings so matrices of
// any size share 2 MiB pages instead of each rounding up to one (up to 2 MiB wasted per
// matrix). Allocations are 64-byte aligned and zeroed, live as long as the arena, and are
// never freed one by one.
class WeightArena {
 public:
  // Empty (nullptr) only when the system refuses the memory.
  void* allocate(size_t bytes);

 private:
  static constexpr size_t kChunk = size_t{256} << 20;
  std::vector<HugeMemory> chunks_;
  size_t used_ = 0, capacity_ = 0;
};

}  // namespace tandem::engine
