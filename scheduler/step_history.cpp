#include "scheduler/step_history.h"

#include <algorithm>
#include <bit>
#include <limits>

namespace tandem::scheduler {

size_t StepHistory::bucket(uint32_t tokens) {
  const size_t b = tokens == 0 ? 0 : static_cast<size_t>(std::bit_width(tokens)) - 1;
  return std::min(b, kBuckets - 1);
}

void StepHistory::record(uint32_t tokens, int64_t us) {
  Ring& r = rings_[bucket(tokens)];
  const int64_t clamped = std::clamp<int64_t>(us, 0, std::numeric_limits<uint32_t>::max());
  r.us[r.count % kSamples] = static_cast<uint32_t>(clamped);
  ++r.count;
}

std::optional<int64_t> StepHistory::p99_us(uint32_t tokens) const {
  const Ring& r = rings_[bucket(tokens)];
  const size_t n = std::min<size_t>(r.count, kSamples);
  if (n < kMinSamples) return std::nullopt;
  std::array<uint32_t, kSamples> sorted = r.us;  // a copy on the stack: no allocation
  const size_t k = (n * 99 + 99) / 100 - 1;      // the nearest-rank 99th percentile
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<ptrdiff_t>(k),
                   sorted.begin() + static_cast<ptrdiff_t>(n));
  return int64_t{sorted[k]};
}

int64_t StepHistory::deadline_us(uint32_t tokens, int64_t floor_us) const {
  const std::optional<int64_t> p99 = p99_us(tokens);
  return p99 ? std::max(kMultiple * *p99, floor_us) : floor_us;
}

}  // namespace tandem::scheduler
