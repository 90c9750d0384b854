// The tokenizer models behind model::Tokenizer, one per tokenizer.ggml.model: each turns raw
// text (special tokens already cut out) into ids. Internal to model/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"
#include "model/vocabulary.h"

namespace tandem::model {

class TextEncoder {
 public:
  virtual ~TextEncoder() = default;
  // Appends the ids of `text` (valid UTF-8 unless the encoder takes any bytes). `first`: the
  // text begins the input or follows a special token (where SentencePiece adds its space).
  [[nodiscard]] virtual Status encode(std::string_view text, bool first, std::vector<int32_t>& out) const = 0;
  // Whether encode() takes any bytes (not only valid UTF-8).
  virtual bool takes_any_bytes() const { return false; }
};

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
