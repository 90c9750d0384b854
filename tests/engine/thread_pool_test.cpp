// The compute threads' pool: every thread runs each region once, parallel_for covers its range
// exactly once, and a waiter whose partner shares its core hands the core over.
#include "workers/engine/thread_pool.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <vector>

namespace tandem::engine {
namespace {

TEST(ThreadPool, EveryThreadRunsEachRegionOnce) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> ran(3);
  for (int region = 0; region < 100; ++region) pool.run([&](uint32_t t) { ran[t].fetch_add(1); });
  for (auto& r : ran) EXPECT_EQ(r.load(), 100);
}

TEST(ThreadPool, ParallelForCoversItsRangeExactlyOnce) {
  ThreadPool pool(2);
  for (uint32_t n : {0u, 1u, 7u, 64u, 1000u}) {
    std::vector<std::atomic<int>> seen(n);
    pool.parallel_for(n, [&](uint32_t b, uint32_t e, uint32_t) {
      for (uint32_t i = b; i < e; ++i) seen[i].fetch_add(1);
    });
    for (uint32_t i = 0; i < n; ++i) EXPECT_EQ(seen[i].load(), 1) << "n " << n << " i " << i;
  }
}

// Both of the pool's threads on one core (more runnable threads than cores, as when the
// scheduler and other processes share the worker's cores): the caller, waiting for a thread
// that cannot run while it spins, must hand its core over within a few hundred pause-loops
// (it yields), not spin its whole budget (20000) each region before sleeping.
TEST(ThreadPool, AWaiterSharingItsCoreHandsItOver) {
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &before)) ++cpu;
  CPU_SET(cpu, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);  // the pool's thread inherits it
  uint64_t spins = 0;
  {
    ThreadPool pool(2);
    std::atomic<uint64_t> sum{0};
    constexpr int kRegions = 200;
    for (int region = 0; region < kRegions; ++region) pool.run([&](uint32_t t) { sum.fetch_add(t + 1); });
    EXPECT_EQ(sum.load(), 3u * kRegions);
    spins = pool.caller_spins() / kRegions;
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
  EXPECT_LT(spins, 2000u) << "pause-loops a region while the other thread could not run";
}

}  // namespace
}  // namespace tandem::engine
