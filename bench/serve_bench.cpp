// tandem-serve-bench: what the actors cost, measured against the engine alone in one run.
//
//   tandem-serve-bench [--model FILE] [--tandem PATH] [--streams 1,4,16,32] [--prompt 128] [--output 128]
//                      [--threads 2] [--tiny-streams 64]
//
// 1. The engine alone, in-process: one stream (prompt, output) with tandem's generate().
// 2. `tandem up` with one worker of --threads threads; for each concurrency C, C streams of
//    (prompt, output) submitted at once through the client library: aggregate output
//    tokens/s, the worker's pipeline idle share and the scheduler's CPU per step.
// 3. The tiny preset at --tiny-streams streams: served tokens/s against the engine alone
//    decoding the same number of sequences per step (compute is negligible there, so this
//    is the cost of the actors themselves).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/deployment.h"
#include "cli/args.h"
#include "tandem/client.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"
#include "model/make_model.h"
#include "workers/engine/sampler.h"

using namespace tandem;
using tandem::bench::Deployment;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<int32_t> prompt_of(uint32_t len, uint32_t salt, uint32_t vocab) {
  std::vector<int32_t> p;
  for (uint32_t i = 0; i < len; ++i) p.push_back(3 + static_cast<int32_t>((i * 7919 + salt * 104729) % (vocab - 3)));
  return p;
}

struct Served {
  double seconds = 0, tokens_per_s = 0, idle_share = 0, cpu_ms_per_step = 0;
  uint64_t tokens = 0;
  bool ok = true;
};

Served serve(Client& client, uint32_t streams, uint32_t prompt, uint32_t output, uint32_t vocab, uint32_t salt) {
  Served s;
  auto before = client.status(std::chrono::seconds(5));
  // Callbacks on the client's I/O thread: the consumer costs no thread wake-up per token.
  std::mutex mu;
  std::condition_variable cv;
  uint32_t done = 0;
  uint64_t tokens = 0;
  bool ok = true;
  const auto t0 = Clock::now();
  for (uint32_t i = 0; i < streams; ++i) {
    GenerateRequest r;
    r.prompt_tokens = prompt_of(prompt, salt + i, vocab);
    r.max_tokens = output;
    r.ignore_eos = true;
    client.generate(r, [&](const Event& ev) {
      if (!ev.final) return;
      std::lock_guard<std::mutex> lock(mu);
      ok &= ev.fin.reason == FinishReason::kLength;
      tokens += ev.fin.completion_tokens;
      if (++done == streams) cv.notify_one();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done == streams; });
  }
  s.ok = ok;
  s.tokens = tokens;
  s.seconds = seconds_since(t0);
  s.tokens_per_s = s.tokens / s.seconds;
  auto after = client.status(std::chrono::seconds(5));
  if (before && after && !after->workers.empty() && !before->workers.empty()) {
    const auto& a = after->workers[0];
    const auto& b = before->workers[0];
    const double idle = double(a.idle_us - b.idle_us), busy = double(a.compute_us - b.compute_us);
    s.idle_share = idle + busy > 0 ? idle / (idle + busy) : 0;
    s.cpu_ms_per_step = after->scheduler_cpu_ms_per_step;
  }
  return s;
}

// The engine alone decoding `batch` sequences together for `steps` steps (greedy sampling
// included), after prefilling their prompts: tokens/s of the decode phase.
double engine_batch_decode(engine::Engine& e, uint32_t batch, uint32_t prompt, uint32_t steps) {
  const auto& c = e.config();
  const uint32_t per_seq = (prompt + steps + 15) / 16;
  auto pool = engine::KvPool::create(c, batch * per_seq).value();
  std::vector<std::vector<int32_t>> blocks(batch), prompts(batch);
  std::vector<engine::SeqStep> step(batch);
  for (uint32_t b = 0; b < batch; ++b) {
    blocks[b].resize(per_seq);
    std::iota(blocks[b].begin(), blocks[b].end(), static_cast<int32_t>(b * per_seq));
    prompts[b] = prompt_of(prompt, b, c.vocab_size);
    step[b] = {prompts[b], 0, blocks[b], 1};
  }
  (void)e.forward(step, *pool);
  engine::Sampler sampler(c.vocab_size);
  engine::SamplingParams greedy;
  std::vector<int32_t> last(batch);
  const auto t0 = Clock::now();
  for (uint32_t s = 0; s < steps; ++s) {
    for (uint32_t b = 0; b < batch; ++b) last[b] = sampler.sample(e.logits(b), greedy, prompt + s).token;
    for (uint32_t b = 0; b < batch; ++b) step[b] = {std::span<const int32_t>(&last[b], 1), prompt + s, blocks[b], 1};
    (void)e.forward(step, *pool);
  }
  return double(batch) * steps / seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "models/small-1.gguf", tiny = "models/tiny-1.gguf";
  std::string tandem = (std::filesystem::path(argv[0]).parent_path() / "../cli/tandem").string();
  auto args = cli::Args::parse(argc - 1, argv + 1, cli::kServeBench);
  if (!args) return cli::fail("serve-bench", args.status());
  model = args->str("model").value_or(model);
  tandem = args->str("tandem").value_or(tandem);
  std::vector<uint32_t> streams = {1, 4, 16, 32};
  if (args->has("streams")) {
    auto list = args->int_list("streams");
    if (!list) return cli::fail("serve-bench", list.status());
    streams.assign(list->begin(), list->end());
  }
  auto prompt_flag = args->integer("prompt", 128), output_flag = args->integer("output", 128);
  auto threads_flag = args->integer("threads", 2), tiny_flag = args->integer("tiny-streams", 64);
  for (const Status* st : {&prompt_flag.status(), &output_flag.status(), &threads_flag.status(), &tiny_flag.status()})
    if (!st->is_ok()) return cli::fail("serve-bench", *st);
  const uint32_t prompt = static_cast<uint32_t>(*prompt_flag), output = static_cast<uint32_t>(*output_flag);
  const uint32_t threads = static_cast<uint32_t>(*threads_flag), tiny_streams = static_cast<uint32_t>(*tiny_flag);
  std::filesystem::create_directories("models");
  for (auto [path, preset] : {std::pair{model, "small"}, std::pair{tiny, "tiny"}})
    if (!std::filesystem::exists(path)) {
      auto cfg = model::preset_config(preset);
      if (Status st = model::make_model(*cfg, 1, path); !st) {
        std::fprintf(stderr, "%s\n", st.to_string().c_str());
        return 1;
      }
    }

  // 1. The engine alone: one stream, end to end (prefill + decode), as a client would see it.
  double alone_tps = 0;
  uint32_t vocab = 0;
  {
    auto e = engine::Engine::load(model, {threads, engine::GemmBackend::kPacked}).value();
    vocab = e->config().vocab_size;
    engine::GenerateOptions opt;
    opt.max_tokens = output;
    opt.ignore_eos = true;
    (void)engine::generate(*e, prompt_of(prompt, 999, vocab), opt);  // warm-up
    for (int rep = 0; rep < 2; ++rep) {                              // best of two, as for the served stream below
      const auto t0 = Clock::now();
      auto g = engine::generate(*e, prompt_of(prompt, rep, vocab), opt).value();
      alone_tps = std::max(alone_tps, g.tokens.size() / seconds_since(t0));
    }
  }
  std::printf("model %s, 1 worker x %u threads, prompt %u, output %u\n", model.c_str(), threads, prompt, output);
  std::printf("engine alone, 1 stream: %.1f output tokens/s (prefill + decode)\n", alone_tps);

  std::vector<Served> results;
  {
    Deployment d(tandem, model, threads, {"--workers", "1"});
    if (d.endpoint().empty()) {
      std::fprintf(stderr, "tandem up did not become ready\n");
      return 1;
    }
    auto client = Client::connect({d.endpoint()}).value();
    (void)serve(*client, 1, prompt, 8, vocab, 5000);  // warm-up
    std::printf("%8s %12s %14s %12s %18s\n", "streams", "seconds", "tokens/s", "idle share", "sched CPU ms/step");
    for (uint32_t c : streams) {
      Served s = serve(*client, c, prompt, output, vocab, c * 1000);
      if (c == 1) {  // best of two, as for the engine alone
        Served again = serve(*client, c, prompt, output, vocab, c * 1000 + 1);
        if (again.tokens_per_s > s.tokens_per_s) s = again;
      }
      results.push_back(s);
      std::printf("%8u %12.2f %14.1f %11.2f%% %18.3f%s\n", c, s.seconds, s.tokens_per_s, 100 * s.idle_share,
                  s.cpu_ms_per_step, s.ok ? "" : "  (some streams did not finish by length!)");
    }
  }
  if (!results.empty())
    std::printf("ratio: 1 served stream / engine alone = %.3f (target >= 0.97)\n", results[0].tokens_per_s / alone_tps);
  for (size_t i = 0; i < streams.size(); ++i)
    if (streams[i] == 16 && !results.empty())
      std::printf("ratio: 16 streams / 1 stream aggregate = %.2f (target >= 5)\n",
                  results[i].tokens_per_s / results[0].tokens_per_s);

  // 3. The cost of the actors: tiny preset, many streams.
  {
    auto e = engine::Engine::load(tiny, {threads, engine::GemmBackend::kPacked}).value();
    const double engine_tps = engine_batch_decode(*e, tiny_streams, 16, 200);
    Deployment d(tandem, tiny, threads, {"--workers", "1"});
    auto client = Client::connect({d.endpoint()}).value();
    (void)serve(*client, tiny_streams, 16, 8, e->config().vocab_size, 7000);  // warm-up
    Served s = serve(*client, tiny_streams, 16, 200, e->config().vocab_size, 9000);
    std::printf(
        "tiny, %u streams: served %.0f tokens/s, engine alone at batch %u %.0f tokens/s: ratio %.2f (target >= 0.5); "
        "idle share %.2f%%, scheduler CPU %.3f ms/step\n",
        tiny_streams, s.tokens_per_s, tiny_streams, engine_tps, s.tokens_per_s / engine_tps, 100 * s.idle_share,
        s.cpu_ms_per_step);
  }
  return 0;
}
