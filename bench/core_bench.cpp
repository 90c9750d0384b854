// The scheduler core's CPU per step: scheduler::Core driven by an instant fake worker with N
// concurrent streams (prompts of 64 tokens, 256 generated, a finished stream replaced at once,
// so prompt chunks join decodes as in serving). One iteration = one worker result taken in
// (on_result) and the next plan built (tick): what the planning thread spends per step.
// No sockets, no model weights: the tiny preset's vocabulary and metadata only. The Spec
// variants register a worker that speculates (4 drafts a round) and answer each round with
// 0, 1 or 2 accepted drafts (by sequence id): the reservation, trim and multi-token results.
#include <benchmark/benchmark.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/make_model.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "scheduler/actor_wire.h"
#include "scheduler/core.h"

namespace tandem::scheduler {
namespace {

constexpr uint32_t kPromptTokens = 64, kMaxTokens = 256;

// Records the plans' sampling sequences (in reused vectors) and which requests finished.
// With `wire`, each plan and result also goes through the actor's protobuf mapping
// (actor_wire.h), as in serving: the core's CPU plus the actor's mapping.
struct FakeWorker : Sink {
  bool wire = false;
  v1::StepPlan wire_plan;
  struct Plan {
    uint64_t step_id = 0;
    std::vector<uint64_t> sampled;
    std::vector<uint32_t> drafts;  // per sampled entry: max_drafts of a speculating round, else 0
  };
  std::array<Plan, 8> ring;
  size_t head = 0, size = 0;
  std::vector<std::string> finished;
  void send_plan(uint32_t, const StepPlan& plan) override {
    if (wire) to_proto(plan, wire_plan);
    Plan& p = ring[(head + size++) % ring.size()];
    p.step_id = plan.step_id;
    p.sampled.clear();
    p.drafts.clear();
    for (const SeqPlan& s : plan.seqs())
      if (s.sample) p.sampled.push_back(s.seq_id), p.drafts.push_back(s.speculate ? s.max_drafts : 0);
  }
  v1::RequestEvents wire_events;
  void send_events(const std::string&, const RequestEvents& ev) override {
    if (wire) {
      wire_events.Clear();
      to_proto(ev, wire_events);
    }
    if (ev.final) finished.push_back(ev.request_id);
  }
  void send_command(uint32_t, const Command&) override {}
};

struct Model {
  model::ModelConfig config;
  model::Tokenizer tokenizer;
  Model() {
    auto preset = model::preset_config("tiny");
    const std::string path = (std::filesystem::temp_directory_path() / "tandem-core-bench-tiny.gguf").string();
    if (!preset || !model::make_model(*preset, 1, path, model::TensorType::kF32)) std::abort();
    auto f = model::GgufFile::open(path);
    config = model::read_model_config(**f).value();
    tokenizer = model::Tokenizer::from_gguf(**f).value();
    std::filesystem::remove(path);
  }
};

v1::Submit request(uint64_t n) {
  v1::Submit s;
  s.set_request_id("r" + std::to_string(n));
  for (uint32_t i = 0; i < kPromptTokens; ++i) s.mutable_tokens()->add_ids(3 + static_cast<int32_t>((i + n) % 200));
  s.set_max_tokens(kMaxTokens);
  s.set_ignore_eos(true);
  s.set_stream(true);
  return s;
}

void run_core(benchmark::State& state, bool wire, uint32_t spec_tokens = 0) {
  static const Model model;
  const auto streams = static_cast<uint32_t>(state.range(0));
  FakeWorker worker;
  worker.wire = wire;
  Core core(SchedulerConfig{}, model.config, model.tokenizer, worker);
  WorkerInfo info{Role::kBoth, streams * (model.config.context_length / 16 + 2), 16, {}};
  info.spec_tokens = spec_tokens;
  core.add_worker(1, info, 0);
  int64_t now = 1'000'000;
  uint64_t next = 0;
  for (; next < streams; ++next) core.submit("c", request(next), now);
  core.tick(now);
  v1::StepResult result;
  StepResult plain;
  for (auto _ : state) {
    if (worker.size == 0) state.SkipWithError("no plan in flight");
    const FakeWorker::Plan& p = worker.ring[worker.head];
    worker.head = (worker.head + 1) % worker.ring.size();
    --worker.size;
    result.Clear();
    result.set_step_id(p.step_id);
    for (size_t i = 0; i < p.sampled.size(); ++i) {
      const uint64_t id = p.sampled[i];
      v1::SeqResult* r = result.add_seqs();
      r->set_seq_id(id);
      r->set_token(3 + static_cast<int32_t>(id % 250));
      const uint32_t accepted = std::min<uint32_t>(p.drafts[i], static_cast<uint32_t>(id % 3));
      for (uint32_t a = 0; a < accepted; ++a) {
        r->add_more_tokens(3 + static_cast<int32_t>((id + a) % 250));
        r->add_more_logprobs(0.0f);
      }
      result.set_drafted(result.drafted() + p.drafts[i]);
      result.set_accepted(result.accepted() + accepted);
    }
    now += 1000;
    if (wire) {
      from_proto(result, plain);
    } else {
      plain.step_id = result.step_id();
      plain.seqs.resize(result.seqs_size());
      for (int i = 0; i < result.seqs_size(); ++i) {
        plain.seqs[i].seq_id = result.seqs(i).seq_id();
        plain.seqs[i].token = result.seqs(i).token();
        plain.seqs[i].more_tokens.assign(result.seqs(i).more_tokens().begin(), result.seqs(i).more_tokens().end());
        plain.seqs[i].more_logprobs.assign(result.seqs(i).more_logprobs().begin(),
                                           result.seqs(i).more_logprobs().end());
      }
      plain.drafted = result.drafted();
      plain.accepted = result.accepted();
    }
    core.on_result(1, plain, now);
    for (; !worker.finished.empty(); worker.finished.pop_back()) core.submit("c", request(next++), now);
    core.tick(now);
  }
  state.counters["steps"] = static_cast<double>(core.stats().steps);
  state.counters["streams_running"] = core.running();
}
void BM_CoreStep(benchmark::State& state) { run_core(state, false); }
BENCHMARK(BM_CoreStep)->Arg(64)->Arg(256)->Unit(benchmark::kNanosecond);
// The same with the actor's protobuf mapping of every plan and result (actor_wire.h).
void BM_CoreStepWire(benchmark::State& state) { run_core(state, true); }
BENCHMARK(BM_CoreStepWire)->Arg(64)->Arg(256)->Unit(benchmark::kNanosecond);
// A speculating worker (4 drafts a round), with and without the wire mapping.
void BM_CoreStepSpec(benchmark::State& state) { run_core(state, false, 4); }
BENCHMARK(BM_CoreStepSpec)->Arg(64)->Arg(256)->Unit(benchmark::kNanosecond);
void BM_CoreStepSpecWire(benchmark::State& state) { run_core(state, true, 4); }
BENCHMARK(BM_CoreStepSpecWire)->Arg(64)->Arg(256)->Unit(benchmark::kNanosecond);

}  // namespace
}  // namespace tandem::scheduler

BENCHMARK_MAIN();
