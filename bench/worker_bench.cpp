// The worker actor's CPU per step around the engine: a worker (tiny preset, 1 thread) fed
// step plans through WorkerHarness (no scheduler, no network), against the engine alone
// running the same ragged decode steps. One iteration = one decode step of N sequences.
// BM_WorkerStep - BM_EngineStep is what the actor adds per step: parsing the plan, the
// sequence table, sampling, the result's serialization. BM_TableStep is the sequence table's
// share (with the plan's parsing and mapping).
//
//   tandem-worker-bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "model/make_model.h"
#include "runtime/wire.h"
#include "tandem/v1/worker.pb.h"
#include "workers/actor.h"
#include "runtime/step_plan.h"
#include "workers/sequence_table.h"
#include "workers/engine/engine.h"

using namespace tandem;

namespace {

constexpr uint32_t kPrompt = 16, kBlockTokens = 16;

const std::string& tiny_model() {
  static const std::string path = [] {
    const std::string p = (std::filesystem::temp_directory_path() / "tandem-worker-bench-tiny.gguf").string();
    auto preset = model::preset_config("tiny");
    if (!preset || !model::make_model(*preset, 1, p, model::TensorType::kF32)) std::abort();
    return p;
  }();
  return path;
}

std::string serialized(const v1::SchedulerCommand& c) {
  std::string s;
  c.SerializeToString(&s);
  return s;
}

// Feeds one serialized command to the worker as its DEALER would.
void feed(worker::WorkerHarness& w, const std::string& bytes) {
  runtime::Frames frames;
  frames.emplace_back(bytes.data(), bytes.size());
  w.scheduler(frames);
}

// The plans of one cycle: prefill every sequence (all its blocks at once), then decode
// until the context is nearly full; the last plan releases them all.
struct Cycle {
  std::string prefill;
  std::vector<std::string> decodes;
  std::string release;
};

Cycle make_cycle(uint32_t streams, uint32_t context) {
  Cycle c;
  const uint32_t per_seq = context / kBlockTokens;
  uint64_t step = 1;
  v1::SchedulerCommand cmd;
  cmd.set_version(runtime::kProtocolVersion);
  v1::StepPlan* p = cmd.mutable_plan();
  p->set_epoch(1);
  p->set_step_id(step++);
  for (uint32_t s = 0; s < streams; ++s) {
    v1::SeqPlan* sp = p->add_seqs();
    sp->set_seq_id(s + 1);
    for (uint32_t i = 0; i < kPrompt; ++i) sp->add_tokens(3 + static_cast<int32_t>((i * 7 + s) % 500));
    for (uint32_t b = 0; b < per_seq; ++b) sp->add_new_blocks(static_cast<int32_t>(s * per_seq + b));
    sp->set_sample(true);
    sp->mutable_sampling()->set_top_p(1.0f);
  }
  c.prefill = serialized(cmd);
  for (uint32_t pos = kPrompt; pos + 1 < context; ++pos) {
    p->Clear();
    p->set_epoch(1);
    p->set_step_id(step++);
    for (uint32_t s = 0; s < streams; ++s) {
      v1::SeqPlan* sp = p->add_seqs();
      sp->set_seq_id(s + 1);
      sp->set_start_pos(pos);
      sp->set_sample(true);
    }
    c.decodes.push_back(serialized(cmd));
  }
  p->Clear();
  p->set_epoch(1);
  p->set_step_id(step++);
  for (uint32_t s = 0; s < streams; ++s) p->add_release(s + 1);
  c.release = serialized(cmd);
  return c;
}

void BM_WorkerStep(benchmark::State& state) {
  spdlog::set_level(spdlog::level::off);  // its results go nowhere: no scheduler is listening
  const auto streams = static_cast<uint32_t>(state.range(0));
  worker::WorkerOptions o;
  o.model_path = tiny_model();
  o.scheduler_endpoint = "inproc://worker-bench";
  o.threads = 1;
  o.kv_blocks = streams * 512 / kBlockTokens;
  o.heartbeat_ms = 1'000'000;
  auto w = worker::WorkerHarness::create(o);
  if (!w) {
    state.SkipWithError(w.status().message().c_str());
    return;
  }
  v1::SchedulerCommand reply;
  reply.set_version(runtime::kProtocolVersion);
  reply.mutable_register_reply()->set_accepted(true);
  reply.mutable_register_reply()->set_worker_id(1);
  reply.mutable_register_reply()->set_epoch(1);
  feed(**w, serialized(reply));
  const Cycle cycle = make_cycle(streams, 512);
  size_t next = 0;
  feed(**w, cycle.prefill);
  for (auto _ : state) {
    feed(**w, cycle.decodes[next++]);
    if (next == cycle.decodes.size()) {
      state.PauseTiming();
      feed(**w, cycle.release);
      feed(**w, cycle.prefill);
      next = 0;
      state.ResumeTiming();
    }
  }
}
BENCHMARK(BM_WorkerStep)->Arg(1)->Arg(64)->Unit(benchmark::kMicrosecond);

// The sequence table alone (workers/sequence_table.h): each decode plan mapped from the wire
// (runtime::from_proto) and applied, then committed, as the actor does around the engine.
void BM_TableStep(benchmark::State& state) {
  const auto streams = static_cast<uint32_t>(state.range(0));
  worker::SequenceTable table(worker::TableLimits{.vocab_size = 512,
                                                  .context_length = 512,
                                                  .n_blocks = streams * 512 / kBlockTokens,
                                                  .block_tokens = kBlockTokens});
  const Cycle cycle = make_cycle(streams, 512);
  v1::SchedulerCommand cmd;
  runtime::StepPlan plan;
  std::vector<int32_t> sampled(streams, 7);
  auto run = [&](const std::string& bytes) {
    cmd.ParseFromString(bytes);
    runtime::from_proto(cmd.plan(), plan);
    for (uint64_t id : plan.release) table.drop(id);
    if (!table.apply(plan)) std::abort();
    table.commit(std::span<const int32_t>(sampled).first(table.to_sample().size()));
  };
  run(cycle.prefill);
  size_t next = 0;
  for (auto _ : state) {
    run(cycle.decodes[next++]);
    if (next == cycle.decodes.size()) {
      run(cycle.release);
      run(cycle.prefill);
      next = 0;
    }
  }
}
BENCHMARK(BM_TableStep)->Arg(1)->Arg(64)->Unit(benchmark::kMicrosecond);

// The same decode steps with the engine alone (greedy argmax, no plan, no result).
void BM_EngineStep(benchmark::State& state) {
  const auto streams = static_cast<uint32_t>(state.range(0));
  auto e = engine::Engine::load(tiny_model(), {1, engine::GemmBackend::kPacked}).value();
  const uint32_t context = e->config().context_length, per_seq = context / kBlockTokens;
  auto pool = engine::KvPool::create(e->config(), streams * per_seq, kBlockTokens).value();
  std::vector<std::vector<int32_t>> blocks(streams), prompts(streams);
  std::vector<int32_t> last(streams);
  std::vector<engine::SeqStep> step(streams);
  for (uint32_t s = 0; s < streams; ++s) {
    for (uint32_t b = 0; b < per_seq; ++b) blocks[s].push_back(static_cast<int32_t>(s * per_seq + b));
    for (uint32_t i = 0; i < kPrompt; ++i) prompts[s].push_back(3 + static_cast<int32_t>((i * 7 + s) % 500));
    step[s] = {prompts[s], 0, blocks[s], 1};
  }
  if (!e->forward(step, *pool)) std::abort();
  uint32_t pos = kPrompt;
  for (auto _ : state) {
    for (uint32_t s = 0; s < streams; ++s) {
      std::span<const float> l = e->logits(s);
      last[s] = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      step[s] = {std::span<const int32_t>(&last[s], 1), pos, blocks[s], 1};
    }
    if (!e->forward(step, *pool)) std::abort();
    if (++pos + 1 == context) pos = kPrompt;
  }
}
BENCHMARK(BM_EngineStep)->Arg(1)->Arg(64)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
