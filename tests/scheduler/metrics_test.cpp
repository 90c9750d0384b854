// The scheduler's metrics: histogram buckets as Prometheus reads them (upper-inclusive,
// cumulative on the wire), vLLM's boundaries, and the values a scripted request moves, on a
// clock the test sets (time to first token, gaps between tokens, e2e by how a request ended,
// queue time, refusals).
#include "scheduler/metrics.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>

#include "model/gguf.h"
#include "scheduler/core.h"
#include "tests/scheduler/wire_harness.h"
#include "tests/test_util.h"

namespace tandem::scheduler {
namespace {

TEST(Histogram, BucketsAreUpperInclusiveAndCumulativeOnTheWire) {
  Histogram h({0.1, 1.0, 10.0});
  for (double v : {0.05, 0.1, 0.5, 1.0, 20.0}) h.observe(v);
  v1::Metric m;
  h.fill(m);
  ASSERT_EQ(m.bucket_counts_size(), 3);
  EXPECT_EQ(m.bucket_counts(0), 2u);  // 0.05 and 0.1 (le = 0.1)
  EXPECT_EQ(m.bucket_counts(1), 4u);
  EXPECT_EQ(m.bucket_counts(2), 4u);
  EXPECT_EQ(m.count(), 5u);  // +Inf
  EXPECT_DOUBLE_EQ(m.sum(), 21.65);
}

TEST(Histogram, BoundariesAreVllms) {
  EXPECT_EQ(ttft_buckets().size(), 22u);
  EXPECT_EQ(ttft_buckets().front(), 0.001);
  EXPECT_EQ(ttft_buckets().back(), 2560.0);
  EXPECT_EQ(inter_token_buckets().size(), 19u);
  EXPECT_EQ(request_latency_buckets().size(), 21u);
  EXPECT_EQ(request_latency_buckets().back(), 7680.0);
  EXPECT_EQ(one_two_five_buckets(2048), (std::vector<double>{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000}));
  EXPECT_EQ(one_two_five_buckets(100), (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
}

struct Recorder : Sink {
  std::deque<v1::StepPlan> plans;
  std::map<std::string, v1::FinalEvent> finals;
  void send_plan(uint32_t, const StepPlan& plan) override { plans.push_back(test_wire::wire(plan)); }
  void send_command(uint32_t, const Command&) override {}
  void send_events(const std::string&, const RequestEvents& plain) override {
    const v1::RequestEvents ev = test_wire::wire(plain);
    if (ev.has_final()) finals[ev.request_id()] = ev.final();
  }
};

const v1::MetricFamily& family(const v1::MetricsReply& r, const std::string& name) {
  for (const v1::MetricFamily& f : r.families())
    if (f.name() == "tandem:" + name) return f;
  ADD_FAILURE() << "no family " << name;
  static v1::MetricFamily none;
  return none;
}

// The series of `name` whose label `key` is `value` (the first series when key is empty).
const v1::Metric& series(const v1::MetricsReply& r, const std::string& name, const std::string& key = "",
                         const std::string& value = "") {
  const v1::MetricFamily& f = family(r, name);
  for (const v1::Metric& m : f.metrics()) {
    bool match = key.empty();
    for (const v1::MetricLabel& l : m.labels()) match |= l.name() == key && l.value() == value;
    if (match) return m;
  }
  ADD_FAILURE() << "no series " << name << "{" << key << "=" << value << "}";
  static v1::Metric none;
  return none;
}

TEST(Metrics, AScriptedRequestMovesEachValueByWhatItsClockSays) {
  auto f = model::GgufFile::open(test::model_file("tiny", 1));
  const model::ModelConfig config = model::read_model_config(**f).value();
  const model::Tokenizer tokenizer = model::Tokenizer::from_gguf(**f).value();
  Recorder rec;
  Core core({}, config, tokenizer, rec);
  int64_t now = 1'000'000;
  core.add_worker(1, 64, 16, now);
  auto submit = [&](const std::string& id, uint32_t max_tokens) {
    v1::Submit s;
    s.set_request_id(id);
    for (int32_t t : {3, 4, 5, 6}) s.mutable_tokens()->add_ids(t);
    s.set_max_tokens(max_tokens);
    s.set_ignore_eos(true);
    s.set_stream(true);
    core.submit("c", s, now);
    core.tick(now);
  };
  // Answers plans in order until one samples a token, that one `after_us` from now (plans that
  // only release sequences are answered at once).
  auto answer = [&](int64_t after_us) {
    for (bool sampled = false; !sampled;) {
      ASSERT_FALSE(rec.plans.empty());
      v1::StepPlan plan = rec.plans.front();
      rec.plans.pop_front();
      v1::StepResult res;
      res.set_step_id(plan.step_id());
      for (const v1::SeqPlan& sp : plan.seqs()) {
        if (!sp.sample()) continue;
        v1::SeqResult* r = res.add_seqs();
        r->set_seq_id(sp.seq_id());
        r->set_token(7);
        sampled = true;
      }
      if (sampled) now += after_us;
      core.on_result(1, test_wire::plain(res), now);
      core.tick(now);
    }
  };
  submit("a", 3);
  answer(50'000);  // the prompt, then its first token: 50 ms after arrival
  answer(20'000);
  answer(30'000);  // the third token: length
  ASSERT_EQ(rec.finals.at("a").finish_reason(), v1::FINISH_REASON_LENGTH);
  submit("b", 100);
  answer(10'000);
  core.cancel("c", "b", now + 5'000);
  v1::Submit bad;
  bad.set_request_id("bad");
  core.submit("c", bad, now);  // no prompt: refused before it is taken
  core.count_refusal(v1::ERROR_CODE_OVERLOADED);

  v1::MetricsReply r;
  fill_metrics_reply(core, "tiny", 9, r);
  EXPECT_EQ(r.query_id(), 9u);
  ASSERT_EQ(r.const_labels_size(), 1);
  EXPECT_EQ(r.const_labels(0).value(), "tiny");
  const v1::Metric& ttft = series(r, "time_to_first_token_seconds");
  EXPECT_EQ(ttft.count(), 2u);
  EXPECT_DOUBLE_EQ(ttft.sum(), 0.06);
  const v1::Metric& itl = series(r, "inter_token_latency_seconds");
  EXPECT_EQ(itl.count(), 2u);
  EXPECT_DOUBLE_EQ(itl.sum(), 0.05);
  EXPECT_EQ(itl.bucket_counts(0), 0u);  // le 0.01
  EXPECT_EQ(itl.bucket_counts(1), 1u);  // le 0.025: the 20 ms gap
  const v1::Metric& length = series(r, "e2e_request_latency_seconds", "finish_reason", "length");
  EXPECT_EQ(length.count(), 1u);
  EXPECT_DOUBLE_EQ(length.sum(), 0.1);
  const v1::Metric& cancelled = series(r, "e2e_request_latency_seconds", "finish_reason", "cancelled");
  EXPECT_EQ(cancelled.count(), 1u);
  EXPECT_DOUBLE_EQ(cancelled.sum(), 0.015);
  EXPECT_EQ(series(r, "e2e_request_latency_seconds", "finish_reason", "stop").count(), 0u);
  EXPECT_EQ(series(r, "request_queue_time_seconds").count(), 2u);
  EXPECT_EQ(series(r, "request_refused_total", "code", "invalid_argument").value(), 1);
  EXPECT_EQ(series(r, "request_refused_total", "code", "overloaded").value(), 1);
  EXPECT_EQ(series(r, "request_success_total", "finished_reason", "length").value(), 1);
  EXPECT_EQ(series(r, "generation_tokens_total").value(), 4);
  EXPECT_EQ(series(r, "prompt_tokens_total").value(), 8);
  EXPECT_EQ(series(r, "num_requests_running").value(), 0);
  EXPECT_EQ(series(r, "worker_steps_total", "worker", "1").value(), double(core.workers().at(0).stats->steps));
  EXPECT_EQ(series(r, "request_generation_tokens").count(), 2u);
  EXPECT_EQ(family(r, "e2e_request_latency_seconds").bucket_bounds_size(), 21);
  EXPECT_EQ(family(r, "time_to_first_token_seconds").type(), v1::METRIC_TYPE_HISTOGRAM);
  EXPECT_EQ(family(r, "generation_tokens_total").type(), v1::METRIC_TYPE_COUNTER);
  EXPECT_EQ(family(r, "kv_cache_usage_perc").type(), v1::METRIC_TYPE_GAUGE);
  // Small: it goes to the client as one message, as the StatusReply does.
  EXPECT_LT(r.ByteSizeLong(), 8u << 10);
}

// Prompts made into ids off the planning thread: one refused when its ids come counts as a
// refusal, as the same prompt refused inline at submit would; one cancelled while it waits for its
// ids was admitted as a request and ends in e2e as cancelled.
struct AsyncRecorder : Recorder {
  std::vector<uint64_t> jobs;
  bool renders_async() const override { return true; }
  void render_async(uint64_t job, PromptInput) override { jobs.push_back(job); }
};

TEST(Metrics, APromptRefusedWhenItsIdsComeIsARefusalNotAnEnd) {
  auto f = model::GgufFile::open(test::model_file("tiny", 1));
  AsyncRecorder rec;
  Core core({}, model::read_model_config(**f).value(), model::Tokenizer::from_gguf(**f).value(), rec);
  int64_t now = 1'000'000;
  core.add_worker(1, 64, 16, now);
  for (const char* id : {"refused", "cancelled"}) {
    v1::Submit s;
    s.set_request_id(id);
    s.set_text(std::string(600, 'a'));  // past inline_prompt_bytes: to the prompt threads
    s.set_max_tokens(4);
    core.submit("c", s, now);
  }
  ASSERT_EQ(rec.jobs.size(), 2u);
  core.on_prompt(rec.jobs[0], Status::invalid("prompt of 600 tokens does not fit"), now += 1000);
  core.cancel("c", "cancelled", now += 1000);
  ASSERT_EQ(rec.finals.at("refused").error_code(), v1::ERROR_CODE_INVALID_ARGUMENT);
  ASSERT_EQ(rec.finals.at("cancelled").finish_reason(), v1::FINISH_REASON_CANCELLED);
  v1::MetricsReply r;
  fill_metrics_reply(core, "tiny", 1, r);
  EXPECT_EQ(series(r, "request_refused_total", "code", "invalid_argument").value(), 1);
  EXPECT_EQ(series(r, "e2e_request_latency_seconds", "finish_reason", "error").count(), 0u);
  EXPECT_EQ(series(r, "e2e_request_latency_seconds", "finish_reason", "cancelled").count(), 1u);
}

}  // namespace
}  // namespace tandem::scheduler
