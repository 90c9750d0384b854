// The tokenizer models behind model::Tokenizer, one per tokenizer.ggml.model: each turns text,
// already cut at its special tokens, into ids. Internal to model/.
#pragma once

#include <bitset>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/status.h"
#include "model/pretokenizer.h"
#include "model/special_tokens.h"
#include "model/vocabulary.h"

namespace tandem::model {

class TextEncoder {
 public:
  virtual ~TextEncoder() = default;
  // Appends the ids of `text` (valid UTF-8 unless the encoder takes any bytes), cut into
  // `fragments` (SpecialTokenSplitter): the special tokens' ids and the raw text's, in order.
  // One call per text, so per-call state (matchers, the word cache) is set up once.
  [[nodiscard]] virtual Status encode(std::string_view text, const std::vector<Fragment>& fragments,
                                      std::vector<int32_t>& out) const = 0;
  // Whether encode() takes any bytes (not only valid UTF-8).
  virtual bool takes_any_bytes() const { return false; }
  // Whether encode() puts a space before the text (and after each special token).
  virtual bool adds_space_prefix() const { return false; }
};

// Words are merged once per encode() call: English repeats its words, so a call keeps what
// each distinct word gave (views into the caller's text: one cache per text).
class WordCache {
 public:
  template <typename F>
  void emit(std::string_view word, std::vector<int32_t>& out, F&& encode_word) {
    auto it = seen_.find(word);
    if (it == seen_.end()) {
      const auto begin = static_cast<uint32_t>(ids_.size());
      encode_word(word, ids_);
      it = seen_.emplace(word, std::make_pair(begin, static_cast<uint32_t>(ids_.size()))).first;
    }
    out.insert(out.end(), ids_.begin() + it->second.first, ids_.begin() + it->second.second);
  }

 private:
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> seen_;
  std::vector<int32_t> ids_;
};

// Where SentencePiece-style text (spaces as U+2581) may be cut into words that merge on their
// own: before a U+2581 that follows another character, unless some piece reaches across such
// a place (holds a U+2581 after a character that ends in a byte marked here). No merge crosses
// these cuts, so each word's merges are those it gets inside the whole text.
struct WordBreaks {
  std::bitset<256> unsafe_before;  // last bytes of characters a piece continues with U+2581
  static WordBreaks of(const Vocabulary& vocab);
  // Calls word(w) for each part of `text` between the cuts.
  void for_each_word(std::string_view text, const std::function<void(std::string_view)>& word) const;
};
// Appends `raw` with each space as U+2581.
void append_escaping_spaces(std::string_view raw, std::string& out);

// The text a normal token's piece stands for: GPT-2's byte characters mapped back to bytes
// (characters outside the map kept as they are), or SentencePiece's U+2581 as a space.
std::string byte_level_piece_text(const std::string& piece);
std::string spm_piece_text(const std::string& piece);

// tandem's byte-level vocabularies: one byte token per byte; any bytes.
std::unique_ptr<TextEncoder> make_byte_level_encoder(const Vocabulary& vocab);
// "llama": SentencePiece merges by score, U+2581 for spaces, byte fallback <0xHH>.
std::unique_ptr<TextEncoder> make_spm_encoder(const Vocabulary& vocab);
// "gpt2": the pre-tokenizer's words, GPT-2's byte-to-character mapping, merges by rank.
// Errors: a tokenizer.ggml.pre tandem does not know; a merges entry that is not two tokens
// whose concatenation is a token (Code::kModelFile).
Result<std::unique_ptr<TextEncoder>> make_gpt2_encoder(const Vocabulary& vocab);
// "gemma4": merges by rank over whole lines of raw UTF-8 with U+2581 for spaces, byte fallback.
Result<std::unique_ptr<TextEncoder>> make_gemma4_encoder(const Vocabulary& vocab);

}  // namespace tandem::model
