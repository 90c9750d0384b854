// The per-step deadline's arithmetic: max(8 x p99 of recent steps of a similar token count,
// the floor), the floor alone until a bucket has a history.
#include "scheduler/step_history.h"

#include <gtest/gtest.h>

namespace tandem::scheduler {
namespace {

constexpr int64_t kFloor = 3'000'000;  // a 3 s liveness timeout

TEST(StepHistory, TheFloorAloneUntilABucketHasAHistory) {
  StepHistory h;
  EXPECT_EQ(h.deadline_us(1, kFloor), kFloor);
  for (uint32_t i = 0; i + 1 < StepHistory::kMinSamples; ++i) h.record(1, 1'000'000);
  EXPECT_FALSE(h.p99_us(1));
  EXPECT_EQ(h.deadline_us(1, kFloor), kFloor) << "too few samples to judge by";
  h.record(1, 1'000'000);
  EXPECT_EQ(h.p99_us(1), 1'000'000);
  EXPECT_EQ(h.deadline_us(1, kFloor), 8'000'000);
}

TEST(StepHistory, EightTimesTheP99NeverBelowTheFloor) {
  StepHistory h;
  for (int i = 0; i < 32; ++i) h.record(256, 10'000);  // 10 ms prefill chunks
  EXPECT_EQ(h.deadline_us(256, kFloor), kFloor) << "80 ms is below the liveness timeout";
  for (int i = 0; i < 31; ++i) h.record(300, 100'000);
  h.record(300, 900'000);  // one slow step in 32 is the p99 of 32 (nearest rank)
  EXPECT_EQ(h.p99_us(300), 900'000);
  EXPECT_EQ(h.deadline_us(300, kFloor), 7'200'000);
}

TEST(StepHistory, BucketsByTokenCount) {
  EXPECT_EQ(StepHistory::bucket(0), 0u);
  EXPECT_EQ(StepHistory::bucket(1), 0u);
  EXPECT_EQ(StepHistory::bucket(2), 1u);
  EXPECT_EQ(StepHistory::bucket(3), 1u);
  EXPECT_EQ(StepHistory::bucket(4), 2u);
  EXPECT_EQ(StepHistory::bucket(512), 9u);
  EXPECT_EQ(StepHistory::bucket(~0u), StepHistory::kBuckets - 1);
  StepHistory h;
  for (int i = 0; i < 16; ++i) h.record(512, 2'000'000);  // long prefill steps
  EXPECT_EQ(h.deadline_us(512, kFloor), 16'000'000);
  EXPECT_EQ(h.deadline_us(8, kFloor), kFloor) << "decode steps have their own history";
}

TEST(StepHistory, TheRingForgetsOldSteps) {
  StepHistory h;
  for (size_t i = 0; i < StepHistory::kSamples; ++i) h.record(1, 5'000'000);
  for (size_t i = 0; i < StepHistory::kSamples; ++i) h.record(1, 1'000);
  EXPECT_EQ(h.p99_us(1), 1'000) << "a slow start-up no longer counts";
  h.record(1, -5);  // a clock step back saturates at 0
  h.record(1, int64_t{1} << 40);
  EXPECT_EQ(h.p99_us(1), int64_t{~0u}) << "saturated, not wrapped";
}

}  // namespace
}  // namespace tandem::scheduler
