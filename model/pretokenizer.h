// Splitting text into words before BPE merges, by the Unicode regexes of a tokenizer.ggml.pre
// value (ICU's regex engine: \p{L}, \p{N}, lookaheads, Unicode White_Space for \s).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace tandem::model {

// A byte range [begin, end) of the text.
struct Span {
  uint32_t begin = 0, end = 0;
};

// The tokenizer.ggml.pre name whose regexes are exactly `patterns`, in order (as a Hugging
// Face tokenizer.json's pre-tokenizer lists them), or "" when no name has them. Where several
// names share the regexes, the one llama.cpp's converter writes (llama-bpe, gpt-2, qwen2, ...).
std::string pre_name_of_patterns(const std::vector<std::string>& patterns);
// GPT-2's word regex: what a ByteLevel pre-tokenizer with use_regex splits by.
const char* gpt2_pattern();

class PreTokenizer {
 public:
  // The regexes of `pre` (llama.cpp's names, e.g. "gpt-2", "llama-bpe", "qwen2"); an error
  // naming it when tandem does not know it.
  static Result<PreTokenizer> for_name(const std::string& pre);
  // Any list of regexes, applied one after the other.
  static Result<PreTokenizer> compile(const std::vector<std::string>& patterns);

  // Splits valid UTF-8 `text`: each regex in turn cuts every piece so far into its matches
  // and the text between them (as Hugging Face's Split with behaviour "isolated"). Appends
  // non-empty, contiguous spans covering all of `text`. Safe to call from several threads.
  // Error (and `out` unchanged) only when ICU gives up (a word too long to backtrack over).
  [[nodiscard]] Status split(std::string_view text, std::vector<Span>& out) const {
    const Span all{0, static_cast<uint32_t>(text.size())};
    return split(text, std::span<const Span>(&all, text.empty() ? 0 : 1), out);
  }
  // The same for each of `segments` of `text` (in order, not overlapping) on its own.
  [[nodiscard]] Status split(std::string_view text, std::span<const Span> segments, std::vector<Span>& out) const;

  // The name-specific settings that go with the regexes.
  bool ignore_merges() const { return ignore_merges_; }  // a word that is a token is taken whole

 private:
  struct Compiled;
  std::shared_ptr<const Compiled> compiled_;
  bool ignore_merges_ = false;
};

}  // namespace tandem::model
