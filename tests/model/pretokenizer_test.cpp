#include "model/pretokenizer.h"

#include <gtest/gtest.h>

namespace tandem::model {
namespace {

std::vector<std::string> words(const PreTokenizer& pre, std::string_view text) {
  std::vector<Span> spans;
  Status st = pre.split(text, spans);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  std::vector<std::string> out;
  for (const Span& s : spans) out.emplace_back(text.substr(s.begin, s.end - s.begin));
  return out;
}

TEST(PreTokenizerTest, Gpt2SplitsWordsNumbersAndSpaces) {
  auto pre = PreTokenizer::for_name("gpt-2");
  ASSERT_TRUE(pre) << pre.status().to_string();
  EXPECT_EQ(words(*pre, "Hello world's  123!!"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " 123", "!!"}));
  EXPECT_TRUE(words(*pre, "").empty());
}

TEST(PreTokenizerTest, UnicodeCategoriesAndLookahead) {
  auto pre = PreTokenizer::for_name("llama-bpe");
  ASSERT_TRUE(pre) << pre.status().to_string();
  // \p{L} takes non-ASCII letters, \p{N}{1,3} cuts digits by three, \s+(?!\S) leaves the
  // last space to the next word, and U+0085 / U+000B count as whitespace.
  EXPECT_EQ(words(*pre, "Äpfel 12345   нещо"), (std::vector<std::string>{"Äpfel", " ", "123", "45", "  ", " нещо"}));
  EXPECT_EQ(words(*pre, "a\xc2\x85\x0b b"), (std::vector<std::string>{"a", "\xc2\x85\x0b", " b"}));
  EXPECT_EQ(words(*pre, "I'LL"), (std::vector<std::string>{"I", "'LL"}));
}

TEST(PreTokenizerTest, RegexesApplyOneAfterAnother) {
  auto pre = PreTokenizer::for_name("starcoder");
  ASSERT_TRUE(pre) << pre.status().to_string();
  EXPECT_EQ(words(*pre, "x 42"), (std::vector<std::string>{"x", " ", "4", "2"}));
}

TEST(PreTokenizerTest, UnknownNamesAndBadRegexesAreRefused) {
  auto unknown = PreTokenizer::for_name("tekken");
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.status().message(), "pre-tokenizer 'tekken' (tokenizer.ggml.pre) is not supported");
  auto bad = PreTokenizer::compile({"(unclosed"});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("'(unclosed' does not compile"), std::string::npos);
}

TEST(PreTokenizerTest, EveryNamedPreTokenizerCompiles) {
  for (const char* name : {"default", "gpt-2", "llama-bpe", "llama3", "qwen2", "qwen35", "deepseek-llm",
                           "deepseek-coder", "starcoder", "falcon", "refact", "mpt", "command-r", "gemma4"}) {
    auto pre = PreTokenizer::for_name(name);
    EXPECT_TRUE(pre) << name << ": " << pre.status().to_string();
  }
}

}  // namespace
}  // namespace tandem::model
