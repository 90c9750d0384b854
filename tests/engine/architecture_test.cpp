// Every architecture of the table (model/architecture.h) against an independent float64
// forward pass: `tandem make-model` writes the file, the engine computes every position's
// logits (a prompt in chunks, then one token per step), and tests/model/reference_forward.py
// (numpy, its own GGUF reader) computes them again; they must agree within 1e-4 absolute.
#include "workers/engine/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace tandem::engine {
namespace {

struct Case {
  const char* name;
  const char* flags;  // for tandem make-model, after --preset tiny
  const char* arch;
  size_t tokens = 40;  // positions compared; the first `prompt` go in chunks of 16, then one a step
  size_t prompt = 24;
};

// qwen3's default head is twice dim / heads (32 here, as Qwen3-0.6B's 128 against 1024 / 16).
const Case kCases[] = {
    {"llama", "", "llama"},
    {"llama_f16_tied", "--dtype f16 --tied", "llama"},
    {"llama3_rope_freqs", "--rope-scaling llama3:8:256", "llama"},
    {"llama_linear", "--rope-scaling linear:4 --context 2048", "llama"},
    {"llama_yarn", "--rope-scaling yarn:4:256 --context 1024", "llama"},
    {"qwen2", "--arch qwen2", "qwen2"},
    {"qwen2_yarn", "--arch qwen2 --rope-scaling yarn:2:128", "qwen2"},
    {"qwen3", "--arch qwen3", "qwen3"},
    {"qwen3_head_dim_64_tied", "--arch qwen3 --head-dim 64 --tied", "qwen3"},
    // The hybrid against scripts/qwen35-reference.py (float64, written from the equations).
    // 150 positions: the prompt's chunks of 16 and the decode steps cross the delta rule's
    // 64-token grid (positions 64 and 128 fold a grid chunk).
    {"qwen35", "--arch qwen35", "qwen35", 150, 100},
    {"qwen35_f16", "--arch qwen35 --dtype f16", "qwen35", 150, 100},
    // Sliding-window layers (window 32, docs/WINDOWS.md) over more than 3 windows, prompt and decode.
    {"gemma2", "--arch gemma2", "gemma2", 120, 100},
    {"gemma2_f16", "--arch gemma2 --dtype f16", "gemma2", 120, 100},
    {"gemma3", "--arch gemma3", "gemma3", 120, 100},
    {"gemma3_window_20", "--arch gemma3 --sliding-window 20", "gemma3", 120, 100},
};

constexpr double kTolerance = 1e-4;

std::string run(const std::string& command) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return "popen failed";
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int rc = pclose(p);
  return rc == 0 ? out : "exit " + std::to_string(rc) + ": " + out;
}

// Every position's logits from the engine: a prompt of `prompt` tokens in chunks of 16, then
// one token per step; [tokens][vocab].
std::vector<std::vector<float>> engine_logits(Engine& e, const std::vector<int32_t>& tokens, size_t prompt) {
  auto pool = KvPool::create(e.config(), 16);
  EXPECT_TRUE(pool) << pool.status().to_string();
  std::unique_ptr<StatePool> states;
  if (e.config().arch->hybrid()) {
    auto made = StatePool::create(e.config(), 2);
    EXPECT_TRUE(made) << made.status().to_string();
    states = std::move(*made);
  }
  std::vector<int32_t> blocks(16);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::vector<std::vector<float>> out;
  for (size_t at = 0; at < tokens.size();) {
    const size_t n = at < prompt ? std::min<size_t>(16, prompt - at) : 1;
    SeqStep s{std::span(tokens).subspan(at, n), static_cast<uint32_t>(at), blocks, static_cast<uint32_t>(n)};
    s.state_slot = states ? 1 : -1;
    Status st = e.forward({&s, 1}, **pool, states.get());
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) return out;
    for (uint32_t r = 0; r < n; ++r) out.emplace_back(e.logits(r).begin(), e.logits(r).end());
    at += n;
  }
  return out;
}

class ArchitectureVsReference : public ::testing::TestWithParam<std::tuple<Case, GemmBackend>> {};

TEST_P(ArchitectureVsReference, LogitsWithin1e4) {
  const auto& [c, backend] = GetParam();
  const std::string dir = test::temp_dir();
  const std::string model = dir + "/" + c.name + ".gguf";
  if (!std::ifstream(model)) {
    const std::string made =
        run(std::string(TANDEM_TANDEM_BIN) + " make-model --preset tiny " + c.flags + " --seed 7 --out " + model);
    ASSERT_EQ(made.rfind("exit ", 0), std::string::npos) << made;
  }
  auto e = Engine::load(model, {2, backend});
  ASSERT_TRUE(e) << e.status().to_string();
  EXPECT_EQ((*e)->config().arch->name, c.arch);
  const auto tokens = test::random_tokens(c.tokens, (*e)->config().vocab_size, 11);
  const auto got = engine_logits(**e, tokens, c.prompt);
  ASSERT_EQ(got.size(), tokens.size());

  std::string list;
  for (int32_t t : tokens) list += (list.empty() ? "" : ",") + std::to_string(t);
  const std::string ref_path = dir + "/" + c.name + ".f64";
  const std::string script =
      (*e)->config().arch->hybrid() ? "/scripts/qwen35-reference.py " : "/tests/model/reference_forward.py ";
  const std::string said = run("/usr/bin/python3 " + std::string(TANDEM_SOURCE_DIR) + script + model + " --tokens " +
                               list + " --out " + ref_path);
  ASSERT_EQ(said.rfind("exit ", 0), std::string::npos) << said;
  const size_t vocab = (*e)->config().vocab_size;
  std::vector<double> want(tokens.size() * vocab);
  std::ifstream in(ref_path, std::ios::binary);
  in.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * sizeof(double)));
  ASSERT_TRUE(in) << "short reference output " << ref_path;

  double worst = 0, largest = 0;
  for (size_t t = 0; t < tokens.size(); ++t)
    for (size_t i = 0; i < vocab; ++i) {
      worst = std::max(worst, std::abs(got[t][i] - want[t * vocab + i]));
      largest = std::max(largest, std::abs(want[t * vocab + i]));
    }
  std::printf("%s (%s): max |logit error| %.3g (largest |logit| %.2f)\n", c.name,
              backend == GemmBackend::kPacked ? "packed" : "openblas", worst, largest);
  RecordProperty("max_abs_logit_error", std::to_string(worst));
  EXPECT_LE(worst, kTolerance);
  EXPECT_GT(largest, 1.0);  // the logits are not degenerate
}

INSTANTIATE_TEST_SUITE_P(Files, ArchitectureVsReference,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values(GemmBackend::kPacked, GemmBackend::kOpenBlas)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) +
                                  (std::get<1>(info.param) == GemmBackend::kPacked ? "_packed" : "_openblas");
                         });

// 8-bit KV with an F32 window of 2 blocks: every key of the first 32 positions is read from
// the window rows, which point into q|k|v rows whose Q part is heads x head_dim wide (wider
// than the model in Qwen3). Logits agree with F32 KV to rounding; a wrong row offset would not.
TEST(Architectures, Qwen3WindowRowsPointAtKAndV) {
  const std::string model = test::temp_dir() + "/q3.gguf";
  const std::string made = run(std::string(TANDEM_TANDEM_BIN) + " make-model --arch qwen3 --out " + model);
  ASSERT_EQ(made.rfind("exit ", 0), std::string::npos) << made;
  auto e = Engine::load(model);
  ASSERT_TRUE(e) << e.status().to_string();
  const auto tokens = test::random_tokens(30, (*e)->config().vocab_size, 3);
  const auto f32 = engine_logits(**e, tokens, 30);
  const KvFormat format{8, 64, false};
  const uint32_t tail = KvPool::tail_blocks_for((*e)->config(), 16, format);
  auto pool = KvPool::create((*e)->config(), 2 + tail, 16, format);
  ASSERT_TRUE(pool) << pool.status().to_string();
  std::vector<int32_t> blocks = {0, 1}, tails(tail);
  std::iota(tails.begin(), tails.end(), 2);
  SeqStep s{tokens, 0, blocks, static_cast<uint32_t>(tokens.size()), tails};
  ASSERT_TRUE((*e)->forward({&s, 1}, **pool).is_ok());
  double worst = 0;
  for (uint32_t r = 0; r < tokens.size(); ++r)
    for (size_t i = 0; i < f32[r].size(); ++i)
      worst = std::max(worst, double(std::abs((*e)->logits(r)[i] - f32[r][i])));
  EXPECT_LE(worst, 1e-4);
}

// A head the attention kernels are not instantiated for is refused at load, naming it
// (before, a head_dim of 48 loaded and attention left its output unwritten).
TEST(Architectures, RefusesAHeadDimTheKernelsDoNotTake) {
  const std::string model = test::temp_dir() + "/hd48.gguf";
  const std::string made =
      run(std::string(TANDEM_TANDEM_BIN) + " make-model --arch qwen3 --head-dim 48 --out " + model);
  ASSERT_EQ(made.rfind("exit ", 0), std::string::npos) << made;
  auto e = Engine::load(model);
  ASSERT_FALSE(e);
  EXPECT_NE(
      e.status().message().find("head dimension 48 is not supported (tandem's attention takes 16, 32, 64, 128 or 256)"),
      std::string::npos)
      << e.status().message();
}

}  // namespace
}  // namespace tandem::engine
