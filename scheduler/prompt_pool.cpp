#include "scheduler/prompt_pool.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

namespace tandem::scheduler {

PromptPool::PromptPool(PromptRenderer renderer, uint32_t threads, Done done)
    : renderer_(std::move(renderer)), done_(std::move(done)) {
  threads_.reserve(threads);
  for (uint32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
}

PromptPool::~PromptPool() {
  {
    runtime::MutexLock lock(mu_);
    stopping_ = true;
    jobs_.clear();
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void PromptPool::post(uint64_t job, PromptInput input) {
  {
    runtime::MutexLock lock(mu_);
    jobs_.push_back(Job{job, std::move(input)});
  }
  cv_.notify_all();
}

bool PromptPool::cancel(uint64_t job) {
  runtime::MutexLock lock(mu_);
  auto it = std::find_if(jobs_.begin(), jobs_.end(), [job](const Job& j) { return j.id == job; });
  if (it == jobs_.end()) return false;
  jobs_.erase(it);
  return true;
}

void PromptPool::run() {
  // Below the workers' compute on a shared host: tokenizing a burst of long prompts must not
  // take cores from running streams (their tokens wait for it less than their users would).
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), kNice);
  for (;;) {
    Job job;
    {
      runtime::MutexLock lock(mu_);
      while (jobs_.empty() && !stopping_) cv_.wait(mu_);
      if (stopping_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    done_(job.id, renderer_.render(job.input));
  }
}

}  // namespace tandem::scheduler
