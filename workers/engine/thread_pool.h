// A fixed pool of compute threads that owns the worker's cores during a step.
// The caller's thread is thread 0 and works too. Idle threads spin briefly, then sleep,
// so another pool (OpenBLAS) or process gets the cores between steps.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace tandem::engine {

class ThreadPool {
 public:
  explicit ThreadPool(uint32_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  uint32_t size() const { return n_; }

  // Runs fn(thread_index) on every thread (0..size-1) and returns when all are done.
  // fn must not throw. Not reentrant.
  void run(const std::function<void(uint32_t)>& fn);

  // Splits [0, n) into size() contiguous ranges of near-equal length, fn(begin, end, t).
  void parallel_for(uint32_t n, const std::function<void(uint32_t, uint32_t, uint32_t)>& fn);

 private:
  void worker_main(uint32_t index);

  uint32_t n_;
  std::vector<std::thread> threads_;
  const std::function<void(uint32_t)>* job_ = nullptr;
  std::atomic<uint32_t> generation_{0};
  std::atomic<uint32_t> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace tandem::engine
