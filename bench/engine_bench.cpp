// tandem-engine-bench: the engine on the small preset against this machine's limits.
//
// Measures, in one run: read bandwidth and OpenBLAS sgemm rate (the machine), prefill
// tokens/s for chunks of 128 and 512, decode tokens/s at batch 1/4/16/64 with context 512 (--decode-context),
// and the same steps' weight GEMMs alone; then prints the ratios the engine is judged by.
//
//   tandem-engine-bench [--model FILE] [google benchmark flags]
//   tandem-engine-bench --kv [--kv-threads N] [--kv-rounds R] [--kv-batches 16,64] [--decode-context N]
//                                                              KV formats: sizes, decode
// Without --model it writes the small preset (seed 1) to models/small-1.gguf once. A hybrid model
// (make-model --arch qwen35) runs prefill and decode with state slots, its prefill in both forms
// of the delta rule (delta:0 chunked, delta:1 token by token), beside the delta rule alone.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <array>
#include <chrono>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <time.h>
#include <unistd.h>
#include <vector>

#include "cli/args.h"
#include "workers/engine/engine.h"
#include "workers/engine/hybrid.h"
#include "workers/engine/sampler.h"
#include "model/make_model.h"

using namespace tandem;
using namespace tandem::engine;

namespace {

std::string g_model, g_model_f16;
uint32_t g_decode_context = 512;  // --decode-context
size_t g_kv_bytes_per_token = 0;

Engine& engine_for(uint32_t threads, GemmBackend gemm = GemmBackend::kPacked, DeltaForm delta = DeltaForm::kChunked) {
  static std::map<std::array<int, 3>, std::unique_ptr<Engine>> cache;
  const std::array<int, 3> key = {static_cast<int>(threads), static_cast<int>(gemm), static_cast<int>(delta)};
  auto& slot = cache[key];
  if (!slot) {
    cache.clear();  // one engine at a time: each holds up to ~0.6 GB of weights
    auto e = Engine::load(g_model, {threads, gemm, delta});
    if (!e) {
      std::fprintf(stderr, "engine-bench: %s\n", e.status().to_string().c_str());
      std::exit(1);
    }
    auto& fresh = cache[key];
    fresh = std::move(e.value());
    return *fresh;
  }
  return *slot;
}

// Loading: map, check and lay out every matrix for its kernel (F32 and F16/BF16 packed in panels, quantized
// types read in place).
void BM_Load(benchmark::State& state) {
  const std::string& path = state.range(0) ? g_model_f16 : g_model;
  for (auto _ : state) {
    auto e = Engine::load(path, {2, GemmBackend::kPacked});
    if (!e) state.SkipWithError(e.status().to_string().c_str());
  }
}

// --- the machine -----------------------------------------------------------------------

void BM_ReadBandwidth(benchmark::State& state) {
  const uint32_t threads = static_cast<uint32_t>(state.range(0));
  const size_t n = size_t{1} << 28;  // 1 GiB of floats, far beyond the caches
  static std::vector<float> buf(n, 1.0f);
  ThreadPool pool(threads);
  std::vector<double> sums(threads);
  for (auto _ : state) {
    pool.parallel_for(static_cast<uint32_t>(n / 4096), [&](uint32_t b, uint32_t e, uint32_t t) {
      float acc[16] = {};
      for (size_t i = size_t{b} * 4096; i < size_t{e} * 4096; i += 16)
        for (int j = 0; j < 16; ++j) acc[j] += buf[i + j];
      sums[t] += std::accumulate(acc, acc + 16, 0.0);
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["GB/s"] = benchmark::Counter(double(n) * 4 / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// --- the engine ------------------------------------------------------------------------

// CPU seconds of the calling thread: with one thread, a step's compute time however loaded the
// machine is (its wall time also counts the time other processes held the cores).
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// A hybrid model's state slots (null for a model without recurrent layers).
std::unique_ptr<StatePool> state_pool(const Engine& e, uint32_t slots) {
  if (!e.config().arch->hybrid()) return nullptr;
  return StatePool::create(e.config(), slots).value();
}

// Flops of the chunked delta rule over `tokens` rows (whole grid chunks) of every recurrent layer
// and V head: S0 products 2 x 2Ld^2, key products 2 x 2L^2 d, the two triangular chains 2 x L^2 d,
// the fold 2Ld^2 per chunk of L rows.
double delta_flops(const ModelConfig& c, uint32_t tokens) {
  const double d = c.ssm_state_size, L = hybrid::kGrid, chunks = double(tokens) / L;
  double layers = 0;
  for (uint32_t l = 0; l < c.n_layers; ++l) layers += c.is_recurrent(l) ? 1 : 0;
  return layers * c.ssm_time_step_rank * chunks * (6 * L * d * d + 6 * L * L * d);
}

void BM_Prefill(benchmark::State& state) {
  const uint32_t threads = static_cast<uint32_t>(state.range(0)), chunk = static_cast<uint32_t>(state.range(1));
  const DeltaForm delta = state.range(3) ? DeltaForm::kTokenByToken : DeltaForm::kChunked;
  Engine& e = engine_for(threads, state.range(2) ? GemmBackend::kOpenBlas : GemmBackend::kPacked, delta);
  auto pool = KvPool::create(e.config(), (chunk + 15) / 16).value();
  auto states = state_pool(e, 1);
  std::vector<int32_t> tokens(chunk), blocks(pool->n_blocks());
  for (uint32_t i = 0; i < chunk; ++i) tokens[i] = static_cast<int32_t>((i * 7919) % e.config().vocab_size);
  std::iota(blocks.begin(), blocks.end(), 0);
  SeqStep s{tokens, 0, blocks, 1};
  s.state_slot = states ? 0 : -1;
  // OpenBLAS sgemm at M=512 (N=1536, K=576), alternating with the steps: the reference
  // rate measured under the same noise.
  const int m = 512, n = 1536, k = 576;
  std::vector<float> a(size_t(m) * k, 0.5f), w(size_t(n) * k, 0.25f), c(size_t(m) * n);
  openblas_set_num_threads(static_cast<int>(threads));
  double sgemm_s = 0, best = 1e30, cpu_s = 0;  // best: the fastest step (noise on a shared machine only adds)
  int sgemm_calls = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_s();
    if (!e.forward({&s, 1}, *pool, states.get()).is_ok()) state.SkipWithError("forward failed");
    cpu_s += thread_cpu_s() - c0;
    const auto t1 = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    for (int i = 0; i < 20; ++i, ++sgemm_calls)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, w.data(), k, 0.0f, c.data(), n);
    sgemm_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  }
  state.counters["tokens/s"] = benchmark::Counter(chunk, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(e.gemm_flops(chunk, 1) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  if (states)  // the weight GEMMs and the chunked delta rule's flops (the same count for both forms)
    state.counters["all_GFLOP/s"] = benchmark::Counter((e.gemm_flops(chunk, 1) + delta_flops(e.config(), chunk)) / 1e9,
                                                       benchmark::Counter::kIsIterationInvariantRate);
  state.counters["sgemm_GFLOP/s"] = 2.0 * m * n * k * sgemm_calls / sgemm_s / 1e9;
  state.counters["best_ms"] = best * 1e3;
  state.counters["cpu_ms"] = cpu_s / double(state.iterations()) * 1e3;  // thread 0's CPU per step
}

// One decode step of `batch` sequences at position ctx - 1, sequence b on blocks
// [b * ctx / 16, (b + 1) * ctx / 16).
struct DecodeStep {
  std::vector<std::vector<int32_t>> blocks;
  std::vector<int32_t> tokens;
  std::vector<SeqStep> step;
  DecodeStep(uint32_t batch, uint32_t ctx) : blocks(batch), tokens(batch), step(batch) {
    const uint32_t per_seq = (ctx + 15) / 16;
    for (uint32_t b = 0; b < batch; ++b) {
      blocks[b].resize(per_seq);
      std::iota(blocks[b].begin(), blocks[b].end(), static_cast<int32_t>(b * per_seq));
      tokens[b] = static_cast<int32_t>(3 + b);
      step[b] = SeqStep{std::span<const int32_t>(&tokens[b], 1), ctx - 1, blocks[b], 1};
    }
  }
};

// Decode steps of `batch` sequences, each with ctx - 1 cached positions (--decode-context, 512). The
// cache content does not change the work, so it is left as the pool's zeros. Each
// iteration also runs the same step's weight GEMMs alone (same shapes, threads and
// kernels), alternating, so the ratio of the two is measured under the same noise.
void BM_Decode(benchmark::State& state) {
  const uint32_t threads = static_cast<uint32_t>(state.range(0)), batch = static_cast<uint32_t>(state.range(1));
  const DeltaForm delta = state.range(3) ? DeltaForm::kTokenByToken : DeltaForm::kChunked;
  Engine& e = engine_for(threads, state.range(2) ? GemmBackend::kOpenBlas : GemmBackend::kPacked, delta);
  const uint32_t ctx = g_decode_context, per_seq = (ctx + 15) / 16;
  g_kv_bytes_per_token = KvPool::bytes_per_block(e.config()) / 16;
  auto pool = KvPool::create(e.config(), batch * per_seq).value();
  DecodeStep decode(batch, ctx);
  std::vector<SeqStep>& step = decode.step;
  // A hybrid's slots: its state must be at the step's position; the steps cycle through the
  // last 64 positions so the grid chunk's fold (one step in 64) counts at its share.
  auto states = state_pool(e, batch);
  uint32_t cycle = 0;
  double step_s = 0, gemm_s = 0, best = 1e30,
         cpu_s = 0;  // best: the fastest step (noise on a shared machine only adds)
  for (auto _ : state) {
    if (states)
      for (uint32_t b = 0; b < batch; ++b) {
        step[b].start_pos = ctx - hybrid::kGrid + cycle % hybrid::kGrid;
        step[b].state_slot = static_cast<int32_t>(b);
        states->set_position(b, step[b].start_pos);
      }
    ++cycle;
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_s();
    if (!e.forward(step, *pool, states.get()).is_ok()) state.SkipWithError("forward failed");
    cpu_s += thread_cpu_s() - c0;
    const auto t1 = std::chrono::steady_clock::now();
    e.run_gemms_only(batch, batch);
    const auto t2 = std::chrono::steady_clock::now();
    step_s += std::chrono::duration<double>(t1 - t0).count();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    gemm_s += std::chrono::duration<double>(t2 - t1).count();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  state.counters["tokens/s"] = benchmark::Counter(batch, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_GB/s"] =
      benchmark::Counter(double(e.weight_bytes_per_step()) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["gemms_ms"] = gemm_s / state.iterations() * 1e3;
  state.counters["step/gemms"] = gemm_s > 0 ? step_s / gemm_s : 0;
  state.counters["best_ms"] = best * 1e3;
  state.counters["cpu_ms"] = cpu_s / double(state.iterations()) * 1e3;  // thread 0's CPU per step
}

// The delta rule alone, one thread, one V head of the model's size over a 512-token prompt (8 grid
// chunks): the chunked form (delta_rows) or the recurrent step per token (delta_step). GFLOP/s
// counts each form's own flops (chunked: delta_flops' terms; per token: 7d^2).
void BM_DeltaRule(benchmark::State& state) {
  const bool chunked = state.range(0) == 0;
  const uint32_t d = engine_for(1).config().ssm_state_size, n = 512, C = 3 * d;
  const hybrid::ChunkLayout lay{d, 1, 1};
  std::vector<float> layer(lay.floats()), rows(size_t{n} * C), gates(size_t{n} * 2), o(size_t{n} * d);
  std::vector<float> scratch(hybrid::chunk_scratch_floats(d));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(float(d)));
  for (float& x : rows) x = nd(rng);
  for (uint32_t r = 0; r < n; ++r) gates[2 * r] = -0.05f, gates[2 * r + 1] = 0.5f;
  const hybrid::HeadRows in{rows.data(), rows.data() + d, rows.data() + 2 * d, C, gates.data(), gates.data() + 1, 2};
  const hybrid::HeadState st = hybrid::head_state(layer.data(), lay, 0);
  const kernels::Kernels& kern = kernels::best();
  for (auto _ : state) {
    std::fill(layer.begin(), layer.end(), 0.0f);
    if (chunked) {
      hybrid::store_keys(in.k, C, 0, hybrid::kGrid, d, hybrid::key_rows(layer.data(), lay, 0));
      hybrid::delta_rows(kern, lay, st, hybrid::key_rows(layer.data(), lay, 0), in, 0, n, o.data(), d, scratch.data());
    } else {
      for (uint32_t r = 0; r < n; ++r)
        hybrid::delta_step(st.s0, in.q + r * C, in.k + r * C, in.v + r * C, -0.05f, 0.5f, d, o.data() + r * d);
    }
    benchmark::DoNotOptimize(o.data());
  }
  const double L = hybrid::kGrid, flops = chunked ? n / L * (6 * L * d * d + 6 * L * L * d) : 7.0 * n * d * d;
  state.counters["rows/s"] = benchmark::Counter(n, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// The weight GEMMs of a prefill step alone (same shapes, threads and kernels).
void BM_GemmsOnly(benchmark::State& state) {
  const uint32_t threads = static_cast<uint32_t>(state.range(0)), rows = static_cast<uint32_t>(state.range(1));
  const uint32_t logit_rows = static_cast<uint32_t>(state.range(2));
  Engine& e = engine_for(threads, state.range(3) ? GemmBackend::kOpenBlas : GemmBackend::kPacked);
  for (auto _ : state) e.run_gemms_only(rows, logit_rows);
  state.counters["GFLOP/s"] =
      benchmark::Counter(e.gemm_flops(rows, logit_rows) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// --- KV cache formats (--kv) ------------------------------------------------------------

// Sizes of the KV formats on this model, and decode steps at each of `batches` (16 and 64 by
// default; context --decode-context, 512 by default, as BM_Decode) for F32, 8-bit and 4-bit
// uniform KV (group 64) and rotated 4- and 3-bit KV, all with the F32 window of 2 blocks (the
// default), measured alternating round by round (one step each per round) so the ratios see
// the same noise. Each step is followed by its weight GEMMs alone.
int run_kv_section(uint32_t threads, uint32_t rounds, const std::vector<uint32_t>& batches) {
  Engine& e = engine_for(threads);
  const ModelConfig& c = e.config();
  constexpr int kFormats = 5;
  constexpr auto kRot = KvScheme::kRotated;
  const KvFormat formats[kFormats] = {{0, 64}, {8, 64}, {4, 64}, {4, 64, false, 2, kRot}, {3, 64, false, 2, kRot}};
  const size_t gib = size_t{1} << 30;
  const size_t f32_block = KvPool::bytes_per_block(c, 16, formats[0]);
  std::printf("KV formats on %s (%u layers x %u KV heads x head_dim %u, blocks of 16 tokens)\n", g_model.c_str(),
              c.n_layers, c.n_kv_heads, c.head_dim());
  std::printf("  %-13s %12s %12s %10s %12s %28s\n", "format", "bytes/token", "bytes/block", "vs f32", "tail blocks",
              "1024-token seqs in 1 GiB");
  for (const KvFormat& f : formats) {
    const size_t block = KvPool::bytes_per_block(c, 16, f);
    const uint32_t tail = KvPool::tail_blocks_for(c, 16, f);
    std::printf("  %-13s %12zu %12zu %9.2fx %12u %28u\n", f.to_string().c_str(), block / 16, block,
                double(f32_block) / block, tail, KvPool::blocks_for_bytes(c, gib, 16, f) / (1024 / 16 + tail));
  }

  const uint32_t ctx = g_decode_context, per_seq = (ctx + 15) / 16, steps_per_round = 1;
  const uint32_t max_batch = *std::max_element(batches.begin(), batches.end());
  const size_t n_batches = batches.size();
  std::vector<std::unique_ptr<KvPool>> pools;
  DecodeStep decode(max_batch, ctx);
  // Per format: the same steps, with each sequence's tail after all the positions' blocks
  // (held rows: the 15 positions of the open block before this one).
  std::vector<std::vector<SeqStep>> steps(kFormats, decode.step);
  std::vector<std::vector<std::vector<int32_t>>> tails(kFormats);
  for (int fi = 0; fi < kFormats; ++fi) {
    const uint32_t tail = KvPool::tail_blocks_for(c, 16, formats[fi]);
    pools.push_back(KvPool::create(c, max_batch * (per_seq + tail), 16, formats[fi]).value());
    for (uint32_t b = 0; b < max_batch && tail; ++b) {
      tails[fi].emplace_back(tail);
      std::iota(tails[fi].back().begin(), tails[fi].back().end(), static_cast<int32_t>(max_batch * per_seq + b * tail));
    }
    for (uint32_t b = 0; b < max_batch && tail; ++b) steps[fi][b].tail = tails[fi][b], steps[fi][b].tail_end = ctx - 1;
  }
  std::vector<std::array<double, kFormats>> step_s(n_batches), gemm_s(n_batches);
  using clock = std::chrono::steady_clock;
  for (uint32_t r = 0; r <= rounds; ++r)  // round 0 warms up and is not counted
    for (size_t bi = 0; bi < n_batches; ++bi)
      for (int fi = 0; fi < kFormats; ++fi)
        for (uint32_t i = 0; i < steps_per_round; ++i) {
          const auto t0 = clock::now();
          if (!e.forward(std::span(steps[fi]).first(batches[bi]), *pools[fi]).is_ok()) return 1;
          const auto t1 = clock::now();
          e.run_gemms_only(batches[bi], batches[bi]);
          const auto t2 = clock::now();
          if (r == 0) continue;
          step_s[bi][fi] += std::chrono::duration<double>(t1 - t0).count();
          gemm_s[bi][fi] += std::chrono::duration<double>(t2 - t1).count();
        }
  const double n_steps = double(rounds) * steps_per_round;
  std::printf("decode, context %u, %u threads, kernels %s, %u rounds x %u steps per setting, alternating\n", ctx,
              threads, kernels::best().name, rounds, steps_per_round);
  for (size_t bi = 0; bi < n_batches; ++bi)
    for (int fi = 0; fi < kFormats; ++fi) {
      const double tps = batches[bi] * n_steps / step_s[bi][fi];
      const double base = batches[bi] * n_steps / step_s[bi][0];
      const double rest_ms = (step_s[bi][fi] - gemm_s[bi][fi]) / n_steps * 1e3;
      std::printf(
          "  batch %2u %-13s %8.1f tokens/s  %.2fx of f32   step / its GEMMs alone = %.2f   step - GEMMs = %.1f ms"
          " (KV read %.0f MB)\n",
          batches[bi], formats[fi].to_string().c_str(), tps, tps / base, step_s[bi][fi] / gemm_s[bi][fi], rest_ms,
          double(batches[bi]) * ctx * KvPool::bytes_per_block(c, 16, formats[fi]) / 16 / 1e6);
    }
  return 0;
}

// Collects results so the ratios can be printed after the table.
class Collector : public benchmark::ConsoleReporter {
 public:
  explicit Collector(OutputOptions options) : ConsoleReporter(options) {}
  std::map<std::string, benchmark::BenchmarkReporter::Run> runs;
  void ReportRuns(const std::vector<Run>& report) override {
    for (const Run& r : report) runs[r.benchmark_name()] = r;
    ConsoleReporter::ReportRuns(report);
  }
  // Runs are found by the prefix "name/arg:value/..." (the full name adds min_time etc.).
  std::map<std::string, Run>::const_iterator find(const std::string& prefix) const {
    for (auto it = runs.lower_bound(prefix); it != runs.end() && it->first.rfind(prefix, 0) == 0; ++it)
      if (it->first.size() == prefix.size() || it->first[prefix.size()] == '/') return it;
    return runs.end();
  }
  double seconds(const std::string& name) const {
    auto it = find(name);
    return it == runs.end() || it->second.iterations == 0 ? 0
                                                          : it->second.real_accumulated_time / it->second.iterations;
  }
  double counter(const std::string& name, const std::string& c) const {
    auto it = find(name);
    if (it == runs.end()) return 0;
    auto jt = it->second.counters.find(c);
    return jt == it->second.counters.end() ? 0 : double(jt->second);
  }
};

// Writes the small preset to `path` unless it exists.
bool ensure_model(const std::string& path, TensorType type) {
  if (std::filesystem::exists(path)) return true;
  std::filesystem::create_directories("models");
  std::fprintf(stderr, "engine-bench: writing the small preset to %s\n", path.c_str());
  auto config = model::preset_config("small");
  if (Status st = model::make_model(*config, 1, path, type); !st) {
    std::fprintf(stderr, "engine-bench: %s\n", st.to_string().c_str());
    return false;
  }
  return true;
}

// One row sampled (one thread): vocabulary size, temperature x 10, logit scale x 10 (1: a flat,
// high-entropy row, whose weighted walk goes deep; 30: a peaked one), top_p x 100, whether the
// logprob is reported. Greedy without a logprob is the argmax kernel alone.
void BM_Sample(benchmark::State& state) {
  const auto vocab = static_cast<uint32_t>(state.range(0));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, static_cast<float>(state.range(2)) / 10.0f);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = nd(rng);
  Sampler sampler(vocab);
  SamplingParams p;
  p.temperature = static_cast<float>(state.range(1)) / 10.0f;
  p.top_p = static_cast<float>(state.range(3)) / 100.0f;
  const auto logprob = state.range(4) ? Sampler::Logprob::kReport : Sampler::Logprob::kSkip;
  uint64_t position = 0;
  for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(logits, p, position++, {}, {}, logprob).token);
}

// Attention for one KV head (one thread, F32 cache, this CPU's kernels): head size, keys, query
// heads sharing the KV head, consecutive rows (1: a decode; more: a prompt chunk or a speculative
// round). Blocks of 16 keys scattered as a pool's are.
void BM_Attention(benchmark::State& state) {
  const auto hd = static_cast<uint32_t>(state.range(0)), n_keys = static_cast<uint32_t>(state.range(1)),
             n_q = static_cast<uint32_t>(state.range(2)), rows = static_cast<uint32_t>(state.range(3)), bt = 16u,
             n_blocks = (n_keys + rows - 1 + bt - 1) / bt;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(size_t{2 * n_blocks} * bt * hd), v(k.size()), q(size_t{rows} * n_q * hd),
      scores(size_t{rows} * n_q * n_blocks * bt), out(q.size());
  for (std::vector<float>* x : {&k, &v, &q})
    for (float& f : *x) f = nd(rng);
  std::vector<int32_t> blocks(n_blocks);
  for (uint32_t b = 0; b < n_blocks; ++b) blocks[b] = static_cast<int32_t>((b * 7) % (2 * n_blocks));
  kernels::AttentionArgs a;
  a.q = q.data(), a.n_q = n_q, a.head_dim = hd, a.blocks = blocks.data(), a.k_base = k.data(), a.v_base = v.data();
  a.block_stride = size_t{bt} * hd, a.block_tokens = bt, a.n_keys = n_keys, a.scale = 0.25f;
  a.scores = scores.data(), a.out = out.data(), a.rows = rows, a.q_row_stride = a.out_row_stride = size_t{n_q} * hd;
  const kernels::Kernels& kern = kernels::best();
  for (auto _ : state) {
    kern.attention(a);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["rows_per_s"] = benchmark::Counter(rows, benchmark::Counter::kIsIterationInvariantRate);
}

const std::vector<int64_t> kThreadCounts = {1, 2};

// A hybrid model's prefill in both forms of the delta rule, and the delta rule alone.
void register_hybrid() {
  for (int64_t form : {0, 1})
    benchmark::RegisterBenchmark("delta_rule", BM_DeltaRule)
        ->Arg(form)
        ->ArgName("token_by_token")
        ->Unit(benchmark::kMillisecond)
        ->MinTime(1.0);
  for (int64_t t : kThreadCounts)
    for (int64_t form : {0, 1})
      benchmark::RegisterBenchmark("prefill", BM_Prefill)
          ->Args({t, 512, 0, form})
          ->ArgNames({"threads", "chunk", "openblas", "delta"})
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond)
          ->MinTime(2.0);
  for (int64_t t : kThreadCounts)
    for (int64_t batch : {1, 16, 64})  // decode's row of the chunked form against the recurrent step
      benchmark::RegisterBenchmark("decode", BM_Decode)
          ->Args({t, batch, 0, 1})
          ->ArgNames({"threads", "batch", "openblas", "delta"})
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond)
          ->MinTime(2.0);
}

void register_benchmarks(bool hybrid) {
  if (hybrid) register_hybrid();
  for (int64_t hd : {16, 64, 128})
    for (int64_t rows : {1, 4})
      benchmark::RegisterBenchmark("attention", BM_Attention)
          ->Args({hd, 384, 2, rows})
          ->ArgNames({"head_dim", "keys", "heads", "rows"})
          ->Unit(benchmark::kMicrosecond);
  for (int64_t vocab : {32000, 151936})
    for (const auto& a : std::vector<std::array<int64_t, 4>>{
             {0, 10, 100, 0}, {0, 10, 100, 1}, {10, 10, 100, 0}, {10, 30, 100, 0}, {10, 10, 90, 0}})
      benchmark::RegisterBenchmark("sample", BM_Sample)
          ->Args({vocab, a[0], a[1], a[2], a[3]})
          ->ArgNames({"vocab", "temp_x10", "scale_x10", "top_p_x100", "logprob"})
          ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("load_small", BM_Load)
      ->Arg(0)
      ->Arg(1)
      ->ArgName("f16")
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond)
      ->Iterations(3);
  for (int64_t t : kThreadCounts) {
    benchmark::RegisterBenchmark("read_bandwidth", BM_ReadBandwidth)
        ->Arg(t)
        ->ArgName("threads")
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (int64_t gemm : {0, 1}) {
    for (int64_t t : kThreadCounts) {
      if (gemm == 1 && t == 1) continue;  // the OpenBLAS backend is shown at 2 threads only
      for (int64_t chunk : {128, 512})
        if (!hybrid)  // a hybrid's prefill: register_hybrid
          benchmark::RegisterBenchmark("prefill", BM_Prefill)
              ->Args({t, chunk, gemm, 0})
              ->ArgNames({"threads", "chunk", "openblas", "delta"})
              ->UseManualTime()
              ->Unit(benchmark::kMillisecond)
              ->MinTime(2.0);
      benchmark::RegisterBenchmark("gemms_only", BM_GemmsOnly)
          ->Args({t, 512, 1, gemm})
          ->ArgNames({"threads", "rows", "logit_rows", "openblas"})
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond)
          ->MinTime(1.0);
      for (int64_t batch : {1, 4, 16, 64})
        benchmark::RegisterBenchmark("decode", BM_Decode)
            ->Args({t, batch, gemm, 0})
            ->ArgNames({"threads", "batch", "openblas", "delta"})
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond)
            ->MinTime(2.0);
    }
  }
}

std::string cpu_name() {
  std::string cpu = "unknown CPU";
  if (FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f))
      if (!std::strncmp(line, "model name", 10)) {
        cpu = std::strchr(line, ':') ? std::strchr(line, ':') + 2 : line;
        cpu.erase(cpu.find_last_not_of("\n") + 1);
        break;
      }
    std::fclose(f);
  }
  return cpu;
}

// The ratios (see bench/RESULTS.md for the targets).
void print_ratios(const Collector& collector) {
  const std::string cpu = cpu_name();
  std::printf("\nratios (%s; %s, %u cores; kernels %s)\n", g_model.c_str(), cpu.c_str(),
              std::thread::hardware_concurrency(), kernels::best().name);
  auto name = [](const char* base, std::initializer_list<std::pair<const char*, int64_t>> args) {
    std::string s = base;
    for (auto& [k, v] : args) s += "/" + std::string(k) + ":" + std::to_string(v);
    return s;
  };
  for (int64_t gemm : {0, 1}) {
    for (int64_t t : kThreadCounts) {
      if (gemm == 1 && t == 1) continue;
      const char* backend = gemm ? "openblas" : "packed";
      const double bw = collector.counter(name("read_bandwidth", {{"threads", t}}), "GB/s");
      const double w_rate = collector.counter(
          name("decode", {{"threads", t}, {"batch", 1}, {"openblas", gemm}, {"delta", 0}}), "weight_GB/s");
      if (bw > 0 && w_rate > 0)
        std::printf(
            "  [%s, %lld threads] batch-1 decode: weight bytes/step / step time = %.2f GB/s over read bandwidth %.2f "
            "GB/s = %.2f (target >= 0.85)\n",
            backend, (long long)t, w_rate, bw, w_rate / bw);
      for (int64_t b : {16, 64}) {
        const std::string run = name("decode", {{"threads", t}, {"batch", b}, {"openblas", gemm}, {"delta", 0}});
        const double step = collector.seconds(run), gemms = collector.counter(run, "gemms_ms") / 1e3;
        // Attention must read every cached key and value once per step: at the measured
        // bandwidth that alone sets a floor on the ratio.
        const double kv_bytes = double(b) * g_decode_context * double(g_kv_bytes_per_token);
        const double floor_ratio = bw > 0 && gemms > 0 ? (gemms + kv_bytes / (bw * 1e9)) / gemms : 0;
        if (step > 0 && gemms > 0)
          std::printf(
              "  [%s, %lld threads] batch-%lld decode: step %.1f ms / GEMMs alone %.1f ms = %.2f (target <= 1.25; "
              "KV reads %.0f MB/step put the floor at %.2f)\n",
              backend, (long long)t, (long long)b, step * 1e3, gemms * 1e3, collector.counter(run, "step/gemms"),
              kv_bytes / 1e6, floor_ratio);
      }
      const std::string pf_run = name("prefill", {{"threads", t}, {"chunk", 512}, {"openblas", gemm}, {"delta", 0}});
      const std::string steps_run = name("prefill", {{"threads", t}, {"chunk", 512}, {"openblas", gemm}, {"delta", 1}});
      if (const double all = collector.counter(pf_run, "all_GFLOP/s"); all > 0)
        std::printf(
            "  [%s, %lld threads] hybrid prefill 512: chunked %.0f tokens/s, token by token %.0f tokens/s = %.2fx; "
            "chunked weights + delta rule %.1f GFLOP/s over sgemm M=512 %.1f GFLOP/s = %.2f\n",
            backend, (long long)t, collector.counter(pf_run, "tokens/s"), collector.counter(steps_run, "tokens/s"),
            collector.counter(pf_run, "tokens/s") / collector.counter(steps_run, "tokens/s"), all,
            collector.counter(pf_run, "sgemm_GFLOP/s"), all / collector.counter(pf_run, "sgemm_GFLOP/s"));
      const double pf = collector.counter(pf_run, "GFLOP/s"), sgemm = collector.counter(pf_run, "sgemm_GFLOP/s");
      if (pf > 0 && sgemm > 0)
        std::printf(
            "  [%s, %lld threads] prefill 512: %.1f GFLOP/s over sgemm M=512 %.1f GFLOP/s = %.2f (target >= 0.6)\n",
            backend, (long long)t, pf, sgemm, pf / sgemm);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Flags of the table's engine-bench rows; the rest (argv[0] first) go to Google Benchmark.
  std::vector<char*> rest = {argv[0]};
  auto args = cli::Args::parse(argc - 1, argv + 1, cli::kEngineBench, &rest);
  if (!args) return cli::fail("engine-bench", args.status());
  auto kv_threads = args->integer("kv-threads", 2), kv_rounds = args->integer("kv-rounds", 40);
  auto decode_context = args->integer("decode-context", 512);
  if (!decode_context) return cli::fail("engine-bench", decode_context.status());
  g_decode_context = static_cast<uint32_t>(*decode_context);
  if (!kv_threads) return cli::fail("engine-bench", kv_threads.status());
  if (!kv_rounds) return cli::fail("engine-bench", kv_rounds.status());
  const bool kv_only = args->has("kv");
  std::vector<uint32_t> kv_batches = {16, 64};
  if (args->has("kv-batches")) {
    auto list = args->int_list("kv-batches");
    if (!list) return cli::fail("engine-bench", list.status());
    kv_batches.assign(list->begin(), list->end());
  }
  g_model = args->str("model").value_or("");
  if (g_model.empty()) g_model = "models/small-1.gguf";
  g_model_f16 = "models/small-1-f16.gguf";
  if (kv_only)
    return ensure_model(g_model, TensorType::kF32)
               ? run_kv_section(static_cast<uint32_t>(*kv_threads), static_cast<uint32_t>(*kv_rounds), kv_batches)
               : 1;
  if (!ensure_model(g_model, TensorType::kF32) || !ensure_model(g_model_f16, TensorType::kF16)) return 1;
  int rc = static_cast<int>(rest.size());
  rest.push_back(nullptr);

  auto file = GgufFile::open(g_model);
  auto config = file ? read_model_config(**file) : Result<ModelConfig>(file.status());
  if (!config) return cli::fail("engine-bench", config.status());
  register_benchmarks(config->arch->hybrid());
  benchmark::Initialize(&rc, rest.data());
  Collector collector(isatty(1) ? benchmark::ConsoleReporter::OO_ColorTabular : benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&collector);

  print_ratios(collector);
  benchmark::Shutdown();
  return 0;
}
