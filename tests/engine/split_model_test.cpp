// A split model (llama.cpp's gguf-split layout, written by `tandem make-model
// --split-max-tensors N`) runs as the same model unsplit: the engine loads it from its first
// part, and every logit of a prompt and of greedy decode steps is bitwise the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "workers/engine/engine.h"

namespace tandem::engine {
namespace {

// Logits of a 20-token prompt (one chunk, every row) then of 12 greedy steps, one vector each.
std::vector<std::vector<float>> greedy_logits(Engine& e) {
  auto pool = KvPool::create(e.config(), 8);
  EXPECT_TRUE(pool) << pool.status().to_string();
  std::vector<int32_t> blocks(8);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::vector<int32_t> tokens = test::random_tokens(20, e.config().vocab_size, 5);
  std::vector<std::vector<float>> out;
  uint32_t n = static_cast<uint32_t>(tokens.size());
  for (uint32_t at = 0; out.size() < 20 + 12;) {
    SeqStep s{std::span(tokens).subspan(at, n), at, blocks, n};
    Status st = e.forward({&s, 1}, **pool);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) break;
    for (uint32_t r = 0; r < n; ++r) out.emplace_back(e.logits(r).begin(), e.logits(r).end());
    const auto& last = out.back();
    tokens.push_back(static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin()));
    at += n;
    n = 1;
  }
  return out;
}

struct Case {
  const char* name;
  const char* flags;  // for tandem make-model --preset tiny
};

class SplitModel : public ::testing::TestWithParam<Case> {};

TEST_P(SplitModel, SameLogitsAsUnsplit) {
  const std::string dir = test::temp_dir();
  const std::string make = std::string(TANDEM_TANDEM_BIN) + " make-model --preset tiny --seed 3 " + GetParam().flags;
  auto whole = test::run_command(make + " --out " + dir + "/whole.gguf");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  auto split = test::run_command(make + " --split-max-tensors 5 --out " + dir + "/split.gguf");
  ASSERT_EQ(split.exit_code, 0) << split.err;
  EXPECT_NE(split.err.find("wrote part " + dir + "/split-00004-of-0000"), std::string::npos) << split.err;
  EXPECT_FALSE(test::run_command("test -e " + dir + "/split.gguf").exit_code == 0);  // only the parts

  auto a = Engine::load(dir + "/whole.gguf");
  ASSERT_TRUE(a) << a.status().to_string();
  auto listing = test::run_command("ls " + dir + "/split-00001-of-*.gguf");
  ASSERT_EQ(listing.exit_code, 0);
  const std::string first_part = listing.out.substr(0, listing.out.find('\n'));
  auto parts = GgufFile::open(first_part);
  ASSERT_TRUE(parts) << parts.status().to_string();
  ASSERT_GE((*parts)->part_paths().size(), 4u);
  const std::string second = (*parts)->part_paths()[1];
  parts->reset();
  auto b = Engine::load(first_part);
  ASSERT_TRUE(b) << b.status().to_string();
  EXPECT_EQ((*a)->config().vocab_size, (*b)->config().vocab_size);
  EXPECT_EQ((*a)->weight_bytes_per_step(), (*b)->weight_bytes_per_step());

  const auto want = greedy_logits(**a);
  const auto got = greedy_logits(**b);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size());
    EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)), 0) << "row " << i;
  }

  // A missing part: a clear error naming it, from the engine's load.
  ASSERT_EQ(std::rename(second.c_str(), (second + ".away").c_str()), 0) << second;
  auto c = Engine::load(first_part);
  ASSERT_FALSE(c);
  EXPECT_NE(c.status().message().find(second + ", is missing"), std::string::npos) << c.status().to_string();
}

INSTANTIATE_TEST_SUITE_P(Files, SplitModel,
                         ::testing::Values(Case{"llama", ""}, Case{"llama_f16_tied", "--dtype f16 --tied"},
                                           Case{"qwen3", "--arch qwen3"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tandem::engine
