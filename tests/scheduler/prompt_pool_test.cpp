// The prompt threads: every job answered once with its ids, a job cancelled before it starts
// never answered, a running one not cancellable.
#include "scheduler/prompt_pool.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "model/gguf.h"
#include "tests/test_util.h"

namespace tandem::scheduler {
namespace {

using namespace std::chrono_literals;

model::Tokenizer tiny() {
  auto f = model::GgufFile::open(test::model_file("tiny", 1));
  return model::Tokenizer::from_gguf(**f).value();
}

PromptInput text(const std::string& t) {
  PromptInput in;
  in.text = t;
  return in;
}

// What the pool answered, by job; waited for with a bound that only detects a hang.
struct Answers {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, std::vector<Result<std::vector<int32_t>>>> by_job;
  bool wait_for(size_t jobs) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, 60s, [&] { return by_job.size() >= jobs; });
  }
  void add(uint64_t job, Result<std::vector<int32_t>> ids) {
    std::lock_guard<std::mutex> lock(mu);
    by_job[job].push_back(std::move(ids));
    cv.notify_all();
  }
};

TEST(PromptPool, EveryJobIsAnsweredOnceWithItsIds) {
  const model::Tokenizer tok = tiny();
  Answers answers;
  {
    PromptPool pool(PromptRenderer(tok, std::nullopt), 2,
                    [&](uint64_t job, Result<std::vector<int32_t>> ids) { answers.add(job, std::move(ids)); });
    for (uint64_t job = 1; job <= 64; ++job) pool.post(job, text(std::string(job, 'a')));
    PromptInput chat;
    chat.chat.emplace().add_messages()->set_role("user");
    pool.post(65, std::move(chat));  // no template: an error, answered like any other
    ASSERT_TRUE(answers.wait_for(65));
  }
  for (uint64_t job = 1; job <= 64; ++job) {
    ASSERT_EQ(answers.by_job[job].size(), 1u) << job;
    ASSERT_TRUE(answers.by_job[job][0]) << job;
    EXPECT_EQ(*answers.by_job[job][0], tok.encode(std::string(job, 'a'), true).value()) << job;
  }
  ASSERT_EQ(answers.by_job[65].size(), 1u);
  EXPECT_EQ(answers.by_job[65][0].status().message(),
            "messages: the model has no chat template (tokenizer.chat_template)");
}

TEST(PromptPool, AJobCancelledBeforeItStartsIsNeverAnswered) {
  Answers answers;
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool open = false, first_running = false;
  {
    // One thread, held inside job 1's answer until the gate opens: jobs 2 and 3 wait.
    PromptPool pool(PromptRenderer(tiny(), std::nullopt), 1, [&](uint64_t job, Result<std::vector<int32_t>> ids) {
      if (job == 1) {
        std::unique_lock<std::mutex> lock(gate_mu);
        first_running = true;
        gate_cv.notify_all();
        gate_cv.wait_for(lock, 60s, [&] { return open; });
      }
      answers.add(job, std::move(ids));
    });
    pool.post(1, text("one"));
    {
      std::unique_lock<std::mutex> lock(gate_mu);
      ASSERT_TRUE(gate_cv.wait_for(lock, 60s, [&] { return first_running; }));
    }
    pool.post(2, text("two"));
    pool.post(3, text("three"));
    EXPECT_TRUE(pool.cancel(2));
    EXPECT_FALSE(pool.cancel(1));  // running
    EXPECT_FALSE(pool.cancel(9));  // unknown
    {
      std::lock_guard<std::mutex> lock(gate_mu);
      open = true;
    }
    gate_cv.notify_all();
    ASSERT_TRUE(answers.wait_for(2));
  }
  EXPECT_EQ(answers.by_job.count(2), 0u);
  EXPECT_EQ(answers.by_job[1].size(), 1u);
  EXPECT_EQ(answers.by_job[3].size(), 1u);
}

}  // namespace
}  // namespace tandem::scheduler
