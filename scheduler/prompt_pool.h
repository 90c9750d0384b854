// Threads that make prompts into token ids (template rendering and tokenization) off the
// scheduler's planning thread: a BPE pass over a long prompt, or a template with loops, takes
// milliseconds, and every worker's next plan would wait for it. The actor posts a job and the
// result comes back through `done`, called on a pool thread: the actor re-posts it onto its
// own loop (its mailbox), so its state stays its own.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "runtime/mutex.h"
#include "scheduler/prompt.h"

namespace tandem::scheduler {

class PromptPool {
 public:
  using Done = std::function<void(uint64_t job, Result<std::vector<int32_t>> ids)>;

  // Niceness of the pool's threads (Linux: per thread): a CPU-bound worker on the same host
  // keeps its cores while a burst of long prompts is tokenized.
  static constexpr int kNice = 10;

  // `threads` >= 1. The renderer is shared by the threads (it is thread-safe).
  PromptPool(PromptRenderer renderer, uint32_t threads, Done done);
  // Jobs not started are dropped (their `done` is never called); running ones finish first.
  ~PromptPool();
  PromptPool(const PromptPool&) = delete;
  PromptPool& operator=(const PromptPool&) = delete;

  // Queues a job; jobs start in the order posted. The caller bounds how many it has out.
  void post(uint64_t job, PromptInput input) TANDEM_EXCLUDES(mu_);
  // Drops `job` if it has not started (its `done` is then never called); a running or
  // finished job is left alone. True when dropped.
  bool cancel(uint64_t job) TANDEM_EXCLUDES(mu_);

 private:
  struct Job {
    uint64_t id;
    PromptInput input;
  };
  void run() TANDEM_EXCLUDES(mu_);

  const PromptRenderer renderer_;
  const Done done_;
  runtime::Mutex mu_;
  runtime::CondVar cv_;
  std::deque<Job> jobs_ TANDEM_GUARDED_BY(mu_);
  bool stopping_ TANDEM_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tandem::scheduler
