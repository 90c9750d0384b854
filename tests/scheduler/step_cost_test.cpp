// The step-time target: StepCost learns a worker's cost per decode and per prompt token, and
// the core sizes prompt chunks from it so a step stays near --target-step-ms, following a
// worker whose cost per prompt token changes 4x mid-run (#19).
#include "scheduler/step_cost.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <memory>

#include "model/gguf.h"
#include "scheduler/core.h"
#include "tests/scheduler/wire_harness.h"
#include "tests/test_util.h"

namespace tandem::scheduler {
namespace {

TEST(StepCost, LearnsPerDecodeAndPerPromptTokenAndFollowsAChange) {
  StepCost cost;
  EXPECT_FALSE(cost.prompt_tokens_within(10'000, 8));  // nothing seen yet
  for (int i = 0; i < 20; ++i) cost.record(0, 10, 5'000);
  for (int i = 0; i < 20; ++i) cost.record(100, 10, 5'000 + 100 * 20);
  EXPECT_NEAR(*cost.us_per_decode(), 500, 1);
  EXPECT_NEAR(*cost.us_per_prompt_token(), 20, 0.5);
  EXPECT_NEAR(*cost.prompt_tokens_within(15'000, 10), 500, 10);         // (15000 - 10 x 500) / 20
  EXPECT_EQ(*cost.prompt_tokens_within(4'000, 10), 0u);                 // the decodes alone exceed it
  for (int i = 0; i < 20; ++i) cost.record(100, 10, 5'000 + 100 * 80);  // 4x slower prompts
  EXPECT_NEAR(*cost.us_per_prompt_token(), 80, 2);
}

TEST(StepCost, WithoutADecodeOnlyStepADecodeCostsAPromptTokensTime) {
  StepCost cost;
  cost.record(90, 10, 10'000);
  EXPECT_FALSE(cost.us_per_decode());
  EXPECT_NEAR(*cost.us_per_prompt_token(), 100, 1e-9);
  EXPECT_EQ(*cost.prompt_tokens_within(20'000, 10), 190u);
}

// Plans answered by a fake worker whose step costs kFixed + kPerDecode x decodes +
// per_prompt x prompt tokens (reported as compute_us, and the clock moves by as much).
struct CostHarness : Sink {
  static constexpr int64_t kFixed = 1000, kPerDecode = 200;
  model::Tokenizer tokenizer;
  model::ModelConfig model;
  std::unique_ptr<Core> core;
  std::deque<v1::StepPlan> plans;
  std::map<std::string, bool> finished;
  int64_t now = 1'000'000, per_prompt = 20;
  uint32_t submitted = 0;

  explicit CostHarness(SchedulerConfig sc) {
    auto f = model::GgufFile::open(test::model_file("tiny", 1));
    model = model::read_model_config(**f).value();
    tokenizer = model::Tokenizer::from_gguf(**f).value();
    core = std::make_unique<Core>(sc, model, tokenizer, *this);
    core->add_worker(1, 4000, 16, now);
  }
  void send_plan(uint32_t, const StepPlan& plan) override { plans.push_back(test_wire::wire(plan)); }
  void send_events(const std::string&, const RequestEvents& ev) override {
    if (ev.final) finished[ev.request_id] = true;
  }
  void send_command(uint32_t, const Command&) override {}

  void submit(const std::string& id, uint32_t prompt, uint32_t max_tokens) {
    v1::Submit s;
    s.set_request_id(id);
    for (uint32_t i = 0; i < prompt; ++i)
      s.mutable_tokens()->add_ids(3 + static_cast<int32_t>((i * 7 + submitted) % 200));
    s.set_max_tokens(max_tokens);
    s.set_ignore_eos(true);
    ++submitted;
    core->submit("c", s, now);
  }
  // Answers the oldest plan; returns its prompt tokens and its cost.
  std::pair<uint32_t, int64_t> step() {
    const v1::StepPlan plan = plans.front();
    plans.pop_front();
    uint32_t prompt = 0, decodes = 0;
    v1::StepResult res;
    res.set_step_id(plan.step_id());
    for (const v1::SeqPlan& sp : plan.seqs()) {
      (sp.tokens_size() ? prompt : decodes) += sp.tokens_size() ? sp.tokens_size() : 1;
      if (!sp.sample()) continue;
      v1::SeqResult* r = res.add_seqs();
      r->set_seq_id(sp.seq_id());
      r->set_token(3 + static_cast<int32_t>(sp.start_pos() % 250));
    }
    const int64_t us = kFixed + kPerDecode * decodes + per_prompt * prompt;
    res.set_compute_us(static_cast<uint64_t>(us));
    now += us;
    core->on_result(1, test_wire::plain(res), now);
    core->tick(now);
    return {prompt, us};
  }
};

TEST(CoreStepTarget, PromptChunksConvergeToTheTargetAndFollowA4xCostChange) {
  SchedulerConfig sc;
  sc.target_step_ms = 10;
  sc.max_batch_tokens = 4096;
  sc.prefill_chunk = 4096;  // the target alone sizes the chunks
  CostHarness h(sc);
  for (int i = 0; i < 16; ++i) h.submit("d" + std::to_string(i), 8, 490);  // 16 streams decode throughout
  h.core->tick(h.now);
  for (int i = 0; i < 4; ++i) h.step();  // their prompts, then decodes only
  // Long prompts keep arriving (4 live at a time): each step could take far more than the target allows.
  uint32_t next = 0;
  auto run = [&](int steps) -> std::pair<uint64_t, int64_t> {
    uint64_t prompt = 0;
    int64_t us = 0;
    const int measured = 20;  // the last steps, once converged
    for (int i = 0; i < steps; ++i) {
      uint32_t live = 0;
      for (uint32_t k = 0; k < next; ++k) live += !h.finished["p" + std::to_string(k)];
      for (; live < 4; ++live) h.submit("p" + std::to_string(next++), 400, 1);
      if (h.plans.empty()) {
        ADD_FAILURE() << "no plan in flight";
        return {};
      }
      const auto [p, cost] = h.step();
      if (i >= steps - measured) prompt += p, us += cost;
    }
    return {prompt / measured, us / measured};
  };
  // 16 decodes cost 1000 + 3200 us: 5800 us of a 10 ms step are left, 290 tokens at 20 us each.
  const auto [prompt1, us1] = run(80);
  EXPECT_NEAR(static_cast<double>(prompt1), 290.0, 290 * 0.15);
  EXPECT_NEAR(static_cast<double>(us1), 10'000.0, 1'000.0);
  h.per_prompt = 80;  // the worker's prompts become 4x as costly: 72 tokens fit
  const auto [prompt2, us2] = run(80);
  EXPECT_NEAR(static_cast<double>(prompt2), 72.5, 72.5 * 0.15);
  EXPECT_NEAR(static_cast<double>(us2), 10'000.0, 1'000.0);
  EXPECT_EQ(h.core->stats().decode_stalls, 0u);
}

TEST(CoreStepTarget, OffTheFixedBudgetAloneSizesSteps) {
  SchedulerConfig sc;
  sc.max_batch_tokens = 4096;
  sc.prefill_chunk = 4096;
  CostHarness h(sc);
  for (int i = 0; i < 16; ++i) h.submit("d" + std::to_string(i), 8, 490);
  h.core->tick(h.now);
  for (int i = 0; i < 4; ++i) h.step();
  for (int i = 0; i < 4; ++i) h.submit("p" + std::to_string(i), 400, 1);
  uint32_t most = 0;
  for (int i = 0; i < 6; ++i) most = std::max(most, h.step().first);
  EXPECT_GE(most, 400u);  // whole prompts in one step: a step of 20 ms and more
}

}  // namespace
}  // namespace tandem::scheduler
