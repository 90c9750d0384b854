// A worker's recent step times, for its per-step deadline (#18 item 8): a plan unanswered past
// max(8 x the p99 of recent steps with a similar token count, the liveness timeout) means the
// worker is stuck (a lost plan, a handler that threw, a hostile peer), and it is fenced as a dead
// one is. Fixed size and allocation-free: a ring of kSamples times per token-count bucket.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace tandem::scheduler {

class StepHistory {
 public:
  // Buckets by the plan's tokens (decodes count one each): 1, 2-3, 4-7, ..., 2^14 and more.
  static constexpr size_t kBuckets = 16;
  static constexpr size_t kSamples = 32;      // per bucket; the oldest is overwritten
  static constexpr uint32_t kMinSamples = 8;  // fewer: no history for that bucket yet
  static constexpr int64_t kMultiple = 8;     // the deadline is this many p99s

  // A step of `tokens` answered `us` microseconds after the worker could start it.
  void record(uint32_t tokens, int64_t us);
  // The 99th percentile of the recent steps in `tokens`' bucket; none with fewer than kMinSamples.
  std::optional<int64_t> p99_us(uint32_t tokens) const;
  // How long a plan of `tokens` may go unanswered: max(kMultiple x p99, floor_us); floor_us
  // alone while its bucket has no history.
  int64_t deadline_us(uint32_t tokens, int64_t floor_us) const;

  static size_t bucket(uint32_t tokens);

 private:
  struct Ring {
    std::array<uint32_t, kSamples> us{};  // microseconds, saturated at ~71 minutes
    uint32_t count = 0;                   // samples ever recorded
  };
  std::array<Ring, kBuckets> rings_{};
};

}  // namespace tandem::scheduler
