// Text <-> token ids from the GGUF vocabulary (tokenizer.ggml.*).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"
#include "model/gguf.h"

namespace tandem::model {

// Supported today: "byte-level" vocabularies (tokenizer model "llama" whose only
// text-bearing tokens are the 256 byte tokens <0x00>..<0xFF>; other tokens are
// control/unknown/unused), as make-model writes. Text is encoded one byte token per
// byte, so every string round-trips byte for byte. Any other vocabulary still loads
// (decode works for byte and normal tokens) but encode() refuses text with an error
// naming the tokenizer kind; callers then take token ids.
class Tokenizer {
 public:
  // Errors: missing tokenizer.ggml.tokens, arrays of mismatched lengths, duplicate
  // token strings, special ids out of range.
  static Result<Tokenizer> from_gguf(const GgufFile& file);

  uint32_t vocab_size() const { return static_cast<uint32_t>(pieces_.size()); }
  int32_t bos_id() const { return bos_; }
  int32_t eos_id() const { return eos_; }
  bool can_encode() const { return byte_level_; }
  const std::string& kind() const { return kind_; }  // tokenizer.ggml.model

  // Adds BOS first when add_bos. Error when !can_encode().
  Result<std::vector<int32_t>> encode(std::string_view text, bool add_bos) const;
  // Appends the bytes of one token: byte tokens give their byte, normal tokens their
  // piece with U+2581 turned into a space, user-defined tokens their piece as is,
  // control/unknown/unused/undefined tokens and ids out of range nothing.
  void append_token_bytes(int32_t token, std::string& out) const;
  std::string decode(std::span<const int32_t> tokens) const;
  const std::string& piece(int32_t token) const { return pieces_[token]; }

 private:
  std::string kind_;
  std::vector<std::string> pieces_;
  std::vector<int32_t> types_;          // GGUF token types: 1 normal, 2 unknown, 3 control, 4 user, 5 unused, 6 byte
  std::vector<int16_t> byte_of_token_;  // -1 unless a byte token
  int32_t byte_token_[256] = {};
  int32_t bos_ = 1, eos_ = 2, unk_ = 0;
  size_t n_normal_ = 0;  // text-bearing tokens (normal or user-defined) encode() cannot produce
  bool byte_level_ = false;
};

}  // namespace tandem::model
