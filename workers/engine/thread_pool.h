// A fixed pool of compute threads that owns the worker's cores during a step.
// The caller's thread is thread 0 and works too. Idle threads spin briefly, then sleep,
// so another pool (OpenBLAS) or process gets the cores between steps.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace tandem::engine {

// A non-owning reference to a callable: unlike std::function it never allocates, so a
// step's many parallel regions cost no heap traffic. The callable must outlive the call.
template <class Sig>
class FunctionRef;
template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): used like std::function
      : obj_(const_cast<void*>(static_cast<const void*>(&f))), call_([](void* o, Args... a) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(a)...);
        }) {}
  R operator()(Args... a) const { return call_(obj_, std::forward<Args>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

class ThreadPool {
 public:
  explicit ThreadPool(uint32_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  uint32_t size() const { return n_; }

  // Runs fn(thread_index) on every thread (0..size-1) and returns when all are done.
  // fn must not throw. Not reentrant.
  void run(FunctionRef<void(uint32_t)> fn);

  // The step is over: idle threads sleep at once instead of spinning, so the actor's other
  // threads and processes (scheduler, ZeroMQ I/O) get the cores until the next run().
  void rest() { resting_.store(true, std::memory_order_relaxed); }

  // Runs fn(begin, end, t) over [0, n) in contiguous chunks of about n / (4 size()), each
  // taken by whichever thread t is free (so one thread may run several chunks).
  void parallel_for(uint32_t n, FunctionRef<void(uint32_t, uint32_t, uint32_t)> fn);

  // Pause-loops the caller's thread has spun in run() waiting for the others, since the pool
  // was made (a diagnostic: a waiter hands over its core when the others cannot run).
  uint64_t caller_spins() const { return caller_spins_; }

 private:
  void worker_main(uint32_t index);

  uint32_t n_;
  std::vector<std::thread> threads_;
  const FunctionRef<void(uint32_t)>* job_ = nullptr;
  std::atomic<uint32_t> generation_{0};
  std::atomic<uint32_t> pending_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> resting_{false};
  uint64_t caller_spins_ = 0;  // written by the caller's thread only
};

}  // namespace tandem::engine
