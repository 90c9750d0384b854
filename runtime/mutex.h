// A mutex and a condition variable that clang's -Wthread-safety can check (libstdc++'s
// std::mutex carries no capability attributes), and the annotation macros for the state
// they guard. Under other compilers the macros expand to nothing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define TANDEM_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TANDEM_THREAD_ANNOTATION(x)
#endif
#define TANDEM_CAPABILITY(x) TANDEM_THREAD_ANNOTATION(capability(x))
#define TANDEM_SCOPED_CAPABILITY TANDEM_THREAD_ANNOTATION(scoped_lockable)
#define TANDEM_GUARDED_BY(x) TANDEM_THREAD_ANNOTATION(guarded_by(x))
#define TANDEM_REQUIRES(...) TANDEM_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define TANDEM_ACQUIRE(...) TANDEM_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define TANDEM_RELEASE(...) TANDEM_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TANDEM_EXCLUDES(...) TANDEM_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

namespace tandem::runtime {

class TANDEM_CAPABILITY("mutex") Mutex {
 public:
  void lock() TANDEM_ACQUIRE() { mu_.lock(); }
  void unlock() TANDEM_RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class TANDEM_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) TANDEM_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() TANDEM_RELEASE() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// Waited on with its Mutex held, which is released while waiting and held again on return
// (also on a spurious wake-up: callers re-check their condition in a loop).
class CondVar {
 public:
  void wait(Mutex& mu) TANDEM_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // False once `until` has passed.
  bool wait_until(Mutex& mu, std::chrono::steady_clock::time_point until) TANDEM_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, until) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  void notify_all() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace tandem::runtime
