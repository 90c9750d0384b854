// The engine against today's llama.cpp (the npm build de3ff815) on make-model's qwen2, qwen3,
// llama-with-Llama-3-RoPE, gemma2 and gemma3 files (the Gemmas' windows of 32 on prompts of 161
// to 342 tokens, arch-window-prompts.txt) and qwen35 (the hybrid) files: teacher-forced on
// llama.cpp's greedy tokens
// (tests/data/quant-npm/arch-*-llamacpp.jsonl), the engine's top-1 must equal llama.cpp's at
// >= 99 % of positions and its log-probabilities of llama.cpp's top-5 tokens be within
// kLogprobTolerance (Gemma: kGeluTableTolerance, llama.cpp's F16 GELU table). The files are
// remade with make-model and must hash as the references say.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "tests/sha256.h"
#include "tests/test_util.h"
#include "workers/engine/engine.h"

namespace tandem::engine {
namespace {

// Both sides compute in F32 with different summation orders, and the references keep 6
// significant digits: the largest difference measured is 6.6e-6 (qwen2; the test prints it).
constexpr double kLogprobTolerance = 1e-4;
// Gemma's GeGLU: llama.cpp's CPU GELU reads a table of F16 values indexed by the input rounded
// to F16 (ggml-cpu/vec.h, GGML_GELU_FP16), where tandem computes it in F32. Measured 1.2e-3
// (gemma2) and 3.3e-3 (gemma3); the float64 reference with that F16 table instead of the exact
// GELU comes 2 to 3.5 times closer to llama.cpp (5.8e-4, 9.5e-4), and tandem is within 2e-5 of
// the exact reference (architecture_test).
constexpr double kGeluTableTolerance = 5e-3;
constexpr double kMinAgreement = 0.99;

struct Reference {
  std::vector<int32_t> tokens;
  std::vector<std::vector<std::pair<int32_t, double>>> top;  // per position, 5 best
};

// Every number of a line of {"tokens":[...],"top":[[[id,logprob]...]...]}, in order.
std::vector<double> numbers(const std::string& line) {
  std::vector<double> out;
  for (const char* p = line.c_str(); *p;) {
    if ((*p >= '0' && *p <= '9') || *p == '-') {
      char* end = nullptr;
      out.push_back(std::strtod(p, &end));
      p = end;
    } else {
      ++p;
    }
  }
  return out;
}

std::vector<Reference> read_references(const std::string& path) {
  std::vector<Reference> refs;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto n = numbers(line);
    const size_t count = n.size() / 11;  // a token, then 5 (id, logprob) pairs per position
    EXPECT_EQ(n.size(), count * 11) << path;
    Reference r;
    for (size_t i = 0; i < count; ++i) r.tokens.push_back(static_cast<int32_t>(n[i]));
    for (size_t i = 0; i < count; ++i) {
      auto& top = r.top.emplace_back();
      for (size_t k = 0; k < 5; ++k) {
        const size_t at = count + i * 10 + k * 2;
        top.emplace_back(static_cast<int32_t>(n[at]), n[at + 1]);
      }
    }
    refs.push_back(std::move(r));
  }
  return refs;
}

std::vector<std::vector<int32_t>> read_prompts(const std::string& path) {
  std::vector<std::vector<int32_t>> prompts;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::vector<int32_t> p;
    std::stringstream ss(line);
    for (std::string id; std::getline(ss, id, ',');) p.push_back(std::stoi(id));
    prompts.push_back(std::move(p));
  }
  return prompts;
}

// Log-softmax of the engine's logits for the `count` positions after `prompt` when it is fed
// the prompt and then `forced` (one chunk; logits of its last `count` rows).
std::vector<std::vector<double>> forced_logprobs(Engine& e, std::vector<int32_t> tokens, size_t count) {
  const auto n_blocks = static_cast<uint32_t>((tokens.size() + 15) / 16);
  auto pool = KvPool::create(e.config(), n_blocks);
  EXPECT_TRUE(pool) << pool.status().to_string();
  std::vector<int32_t> blocks(n_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  SeqStep s{tokens, 0, blocks, static_cast<uint32_t>(count)};
  std::unique_ptr<StatePool> states;  // a hybrid's recurrent state
  if (e.config().arch->hybrid()) {
    states = std::move(StatePool::create(e.config(), 1).value());
    s.state_slot = 0;
  }
  Status st = e.forward({&s, 1}, **pool, states.get());
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  std::vector<std::vector<double>> out;
  for (uint32_t r = 0; st.is_ok() && r < count; ++r) {
    auto logits = e.logits(r);
    const double max = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (float x : logits) sum += std::exp(x - max);
    auto& lp = out.emplace_back(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) lp[i] = logits[i] - max - std::log(sum);
  }
  return out;
}

struct Case {
  const char* name;
  const char* flags;  // for tandem make-model --preset tiny ... --seed 7
  const char* prompts = "arch-prompts.txt";
  double tolerance = kLogprobTolerance;
};

class AgreesWithLlamaCpp : public ::testing::TestWithParam<Case> {};

TEST_P(AgreesWithLlamaCpp, TeacherForcedTop1AndLogprobs) {
  const std::string data = std::string(TANDEM_SOURCE_DIR) + "/tests/data/quant-npm/";
  const std::string name = GetParam().name;
  const std::string model = test::temp_dir() + "/" + name + ".gguf";
  auto made = test::run_command(std::string(TANDEM_TANDEM_BIN) + " make-model --preset tiny " + GetParam().flags +
                                " --seed 7 --out " + model);
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string bytes = test::read_file(model);
  const std::string want_hash = test::read_file(data + "arch-" + name + ".gguf.sha256").substr(0, 64);
  ASSERT_EQ(test::sha256_hex(bytes.data(), bytes.size()), want_hash)
      << "make-model no longer writes the file the references were computed on";

  auto e = Engine::load(model);
  ASSERT_TRUE(e) << e.status().to_string();
  const auto prompts = read_prompts(data + GetParam().prompts);
  const auto refs = read_references(data + "arch-" + name + "-llamacpp.jsonl");
  ASSERT_EQ(refs.size(), prompts.size());
  size_t positions = 0, agree = 0;
  double worst = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const Reference& r = refs[p];
    std::vector<int32_t> tokens = prompts[p];
    tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end() - 1);
    const auto lp = forced_logprobs(**e, tokens, r.tokens.size());
    ASSERT_EQ(lp.size(), r.tokens.size());
    for (size_t i = 0; i < lp.size(); ++i) {
      ++positions;
      agree += std::max_element(lp[i].begin(), lp[i].end()) - lp[i].begin() == r.tokens[i];
      for (const auto& [id, logprob] : r.top[i]) worst = std::max(worst, std::abs(lp[i][id] - logprob));
    }
  }
  const double agreement = static_cast<double>(agree) / static_cast<double>(positions);
  std::printf("%s: top-1 agreement %zu/%zu, max |logprob difference| of llama.cpp's top 5: %.3g\n", name.c_str(), agree,
              positions, worst);
  RecordProperty("agreement", std::to_string(agreement));
  RecordProperty("max_abs_logprob_difference", std::to_string(worst));
  EXPECT_GE(agreement, kMinAgreement);
  EXPECT_LE(worst, GetParam().tolerance);
}

INSTANTIATE_TEST_SUITE_P(
    Files, AgreesWithLlamaCpp,
    ::testing::Values(Case{"qwen2", "--arch qwen2"}, Case{"qwen3", "--arch qwen3"},
                      Case{"llama3_rope_freqs", "--rope-scaling llama3:8:256"},
                      Case{"gemma2", "--arch gemma2", "arch-window-prompts.txt", kGeluTableTolerance},
                      Case{"gemma3", "--arch gemma3", "arch-window-prompts.txt", kGeluTableTolerance},
                      Case{"qwen35", "--arch qwen35"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tandem::engine
