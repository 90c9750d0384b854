#include "workers/engine/thread_pool.h"

#include <algorithm>
#include <atomic>

#include <immintrin.h>
#include <sched.h>

namespace tandem::engine {

namespace {
// Spin this many pause-loops (~50-100 us) before sleeping: long enough to bridge the gaps
// between the parallel regions of one step, short enough to hand the core back between steps.
constexpr int kSpinIterations = 20000;
// A spinning waiter yields its core every this many pause-loops (a few microseconds): when the
// thread it waits for shares that core (more runnable threads than cores: the scheduler, ZeroMQ,
// other processes), that thread runs at once instead of after the spinner's ~1 ms of spinning.
// Alone on its core, a yield returns at once. Serving 16 streams on a loaded machine, the
// worker's CPU per token fell 2-8x (bench/RESULTS.md, "Spin-waits that yield").
constexpr int kYieldEvery = 256;

// One pause of a spin-wait; every kYieldEvery-th also yields the core.
inline void spin_once(int spins) {
#if defined(__x86_64__)
  _mm_pause();
#endif
  if (spins % kYieldEvery == 0) sched_yield();
}
}  // namespace

ThreadPool::ThreadPool(uint32_t threads) : n_(threads == 0 ? 1 : threads) {
  for (uint32_t i = 1; i < n_; ++i) threads_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::run(FunctionRef<void(uint32_t)> fn) {
  if (n_ == 1) {
    fn(0);
    return;
  }
  job_ = &fn;
  resting_.store(false, std::memory_order_relaxed);
  pending_.store(n_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  fn(0);
  int spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0) {
    if (++spins < kSpinIterations) {
      spin_once(spins);
    } else {
      uint32_t left = pending_.load(std::memory_order_acquire);
      if (left != 0) pending_.wait(left, std::memory_order_acquire);
    }
  }
  job_ = nullptr;
  caller_spins_ += static_cast<uint64_t>(spins);
}

void ThreadPool::parallel_for(uint32_t n, FunctionRef<void(uint32_t, uint32_t, uint32_t)> fn) {
  if (n_ == 1 || n <= 1) {
    fn(0, n, 0);
    return;
  }
  // Chunks of about n / (4 * threads) units, taken in order by whichever thread is free: a
  // thread the OS holds up (the scheduler, ZeroMQ and other processes share these cores)
  // leaves the rest of its share to the others instead of making them wait.
  const uint32_t chunk = std::max<uint32_t>(1, n / (4 * n_));
  std::atomic<uint32_t> next{0};
  run([&](uint32_t t) {
    for (uint32_t b; (b = next.fetch_add(chunk, std::memory_order_relaxed)) < n;) fn(b, std::min(n, b + chunk), t);
  });
}

void ThreadPool::worker_main(uint32_t index) {
  uint32_t seen = 0;
  for (;;) {
    int spins = 0;
    uint32_t g;
    while ((g = generation_.load(std::memory_order_acquire)) == seen) {
      if (++spins < kSpinIterations && !resting_.load(std::memory_order_relaxed)) {
        spin_once(spins);
      } else {
        generation_.wait(seen, std::memory_order_acquire);
      }
    }
    seen = g;
    if (stop_.load()) return;
    (*job_)(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace tandem::engine
