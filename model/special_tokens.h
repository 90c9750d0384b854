// Cutting text at the special tokens written in it, before the tokenizer sees the rest.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "model/vocabulary.h"

namespace tandem::model {

// A piece of the text: raw text [begin, end) or one special token.
struct Fragment {
  int32_t token = Vocabulary::kNone;  // kNone for raw text
  uint32_t begin = 0, end = 0;
};

// The vocabulary's control, user-defined and unknown tokens, longest first (as llama.cpp):
// each in turn claims its occurrences in the text that is still raw, so a longer token wins
// over a shorter one it overlaps. User-defined tokens are always recognised (as Hugging Face
// does with added tokens); control and unknown tokens only with parse_special.
// Tokens with the strip attributes take the whitespace beside them along.
class SpecialTokenSplitter {
 public:
  SpecialTokenSplitter() = default;
  explicit SpecialTokenSplitter(const Vocabulary& vocab);

  // Appends the fragments of `text` in order; raw fragments are never empty.
  void split(const Vocabulary& vocab, std::string_view text, bool parse_special, std::vector<Fragment>& out) const;

 private:
  std::vector<int32_t> by_length_;                   // longest first, then lowest id
  std::vector<std::vector<int32_t>> by_first_byte_;  // ranks of the one-byte tokens, by byte
  std::vector<std::vector<int32_t>> by_two_bytes_;   // ranks of the longer ones, by first two bytes
};

}  // namespace tandem::model
