// Teacher-forced agreement with llama.cpp on its own quantized files (../shared/data/quant/,
// beside the repository; skipped, saying so, where absent): each prompt followed by llama.cpp's
// greedy continuation is run through the engine in one pass, and at every generated position
// the engine's top-1 must be the token llama.cpp chose. llama.cpp quantizes activations too
// (Q8_0 / Q8_K, as tandem's quantized kernels do), so agreement is high but not total.
// Also reported: the mean |logprob difference| of llama.cpp's chosen token.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "workers/engine/engine.h"

namespace tandem::engine {
namespace {

const std::string kData = std::string(TANDEM_SOURCE_DIR) + "/../shared/data/quant";

// A JSON array of numbers or arrays, as nested vectors (enough for the .jsonl files here).
struct Node {
  double number = 0;
  std::vector<Node> items;
};

Node parse(const std::string& s, size_t& i) {
  Node n;
  while (i < s.size() && s[i] == ' ') ++i;
  if (s[i] == '[') {
    ++i;
    while (i < s.size() && s[i] != ']') {
      n.items.push_back(parse(s, i));
      while (i < s.size() && (s[i] == ',' || s[i] == ' ')) ++i;
    }
    ++i;
    return n;
  }
  size_t used = 0;
  n.number = std::stod(s.substr(i, 32), &used);
  i += used;
  return n;
}

Node field(const std::string& line, const std::string& name) {
  size_t i = line.find("\"" + name + "\":");
  if (i == std::string::npos) return {};
  i += name.size() + 3;
  return parse(line, i);
}

struct Agreement {
  uint32_t positions = 0, agree = 0;
  double logprob_diff = 0;  // summed |ours - llama.cpp's| for llama.cpp's token
};

Agreement teacher_forced(const std::string& model, const std::string& prompts, const std::string& jsonl) {
  auto engine = Engine::load(model, {2, GemmBackend::kPacked});
  EXPECT_TRUE(engine) << engine.status().to_string();
  if (!engine) return {};
  Engine& e = **engine;
  std::ifstream pf(prompts), jf(jsonl);
  std::string pline, jline;
  Agreement out;
  while (std::getline(pf, pline) && std::getline(jf, jline)) {
    std::vector<int32_t> tokens;
    std::stringstream ss(pline);
    for (std::string t; std::getline(ss, t, ',');) tokens.push_back(std::stoi(t));
    const size_t prompt_len = tokens.size();
    const Node gen = field(jline, "tokens"), top = field(jline, "top");
    const uint32_t n_gen = static_cast<uint32_t>(gen.items.size());
    for (uint32_t i = 0; i + 1 < n_gen; ++i) tokens.push_back(static_cast<int32_t>(gen.items[i].number));
    const uint32_t n_blocks = static_cast<uint32_t>((tokens.size() + 15) / 16);
    auto pool = KvPool::create(e.config(), n_blocks);
    EXPECT_TRUE(pool);
    std::vector<int32_t> blocks(n_blocks);
    for (uint32_t b = 0; b < n_blocks; ++b) blocks[b] = static_cast<int32_t>(b);
    const SeqStep step{tokens, 0, blocks, n_gen};
    EXPECT_TRUE(e.forward({&step, 1}, **pool).is_ok());
    (void)prompt_len;
    for (uint32_t i = 0; i < n_gen; ++i) {
      const auto logits = e.logits(i);
      const int32_t want = static_cast<int32_t>(gen.items[i].number);
      size_t best = 0;
      double mx = logits[0];
      for (size_t v = 1; v < logits.size(); ++v)
        if (logits[v] > logits[best]) best = v, mx = logits[v];
      double sum = 0;
      for (float l : logits) sum += std::exp(l - mx);
      const double ours = logits[want] - mx - std::log(sum);
      out.positions++;
      out.agree += static_cast<int32_t>(best) == want;
      out.logprob_diff += std::fabs(ours - top.items[i].items[0].items[1].number);
    }
  }
  return out;
}

struct FileCase {
  const char* model;  // "trained" or "mid"
  const char* type;
  double min_agreement;  // 0: report only
};

class QuantAgreement : public ::testing::TestWithParam<FileCase> {};

TEST_P(QuantAgreement, TeacherForcedTop1MatchesLlamaCpp) {
  const FileCase& fc = GetParam();
  const std::string base = kData + "/" + fc.model;
  const std::string gguf = base + "-" + fc.type + ".gguf";
  if (!std::filesystem::exists(gguf))
    GTEST_SKIP() << "no " << gguf << ": ../shared/data/quant (llama.cpp's files) is not beside the repository";
  const Agreement a =
      teacher_forced(gguf, base + "-prompts.txt", kData + "/" + fc.model + "-llamacpp-" + fc.type + ".jsonl");
  ASSERT_GT(a.positions, 0u);
  const double pct = 100.0 * a.agree / a.positions;
  const double mean_diff = a.logprob_diff / a.positions;
  std::printf("%s-%s: top-1 agreement %.1f %% (%u/%u), mean |logprob diff| %.4f\n", fc.model, fc.type, pct, a.agree,
              a.positions, mean_diff);
  RecordProperty("agreement_pct", std::to_string(pct));
  RecordProperty("mean_abs_logprob_diff", std::to_string(mean_diff));
  if (fc.min_agreement > 0) EXPECT_GE(pct, fc.min_agreement);
}

INSTANTIATE_TEST_SUITE_P(Files, QuantAgreement,
                         ::testing::Values(FileCase{"trained", "f32", 98}, FileCase{"trained", "F16", 98},
                                           FileCase{"trained", "BF16", 98}, FileCase{"trained", "Q8_0", 98},
                                           FileCase{"trained", "Q6_K", 96}, FileCase{"trained", "Q4_K_M", 96},
                                           FileCase{"trained", "Q4_0", 96}, FileCase{"mid", "f32", 0},
                                           FileCase{"mid", "F16", 0}, FileCase{"mid", "BF16", 0},
                                           FileCase{"mid", "Q8_0", 0}, FileCase{"mid", "Q6_K", 0},
                                           FileCase{"mid", "Q5_K_M", 0}, FileCase{"mid", "Q4_K_M", 0},
                                           FileCase{"mid", "Q4_0", 0}),
                         [](const auto& info) { return std::string(info.param.model) + "_" + info.param.type; });

// A sequence's logits on a quantized model are bitwise the same alone and in a ragged batch
// (other sequences before it, its prompt chunked differently), for each of llama.cpp's mixes.
TEST(QuantBatchInvariance, SequenceAloneEqualsInRaggedBatch) {
  for (const char* type : {"Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "BF16"}) {
    const std::string gguf = kData + "/mid-" + type + ".gguf";
    if (!std::filesystem::exists(gguf)) GTEST_SKIP() << "no " << gguf << ": ../shared/data/quant is absent";
    auto engine = Engine::load(gguf, {2, GemmBackend::kPacked});
    ASSERT_TRUE(engine) << engine.status().to_string();
    Engine& e = **engine;
    const uint32_t vocab = e.config().vocab_size;
    std::vector<int32_t> seq(37), other(21);
    for (size_t i = 0; i < seq.size(); ++i) seq[i] = static_cast<int32_t>((i * 7919 + 13) % vocab);
    for (size_t i = 0; i < other.size(); ++i) other[i] = static_cast<int32_t>((i * 104729 + 5) % vocab);
    auto pool = KvPool::create(e.config(), 16).value();
    const std::vector<int32_t> blocks_a = {0, 1, 2}, blocks_b = {3, 4, 5}, blocks_c = {6, 7};
    const SeqStep alone{seq, 0, blocks_a, 1};
    ASSERT_TRUE(e.forward({&alone, 1}, *pool).is_ok());
    const std::vector<float> want(e.logits(0).begin(), e.logits(0).end());
    // The same sequence as a 30-token chunk, then the last 7 tokens batched behind another sequence.
    const SeqStep first{std::span(seq).first(30), 0, blocks_b, 0};
    ASSERT_TRUE(e.forward({&first, 1}, *pool).is_ok());
    const SeqStep batch[2] = {{other, 0, blocks_c, 3}, {std::span(seq).subspan(30), 30, blocks_b, 1}};
    ASSERT_TRUE(e.forward(batch, *pool).is_ok());
    const auto got = e.logits(3);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << type;
  }
}

}  // namespace
}  // namespace tandem::engine
