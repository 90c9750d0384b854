// The tokenizer.ggml.* metadata of a GGUF file, checked and parsed into native types: token
// pieces and their attributes, scores, merges, special ids, the add_* flags and the set of
// end-of-generation tokens. What the tokenizers (model/tokenizer.h) encode and decode with.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/status.h"
#include "model/gguf.h"

namespace tandem::model {

// Token attributes, as llama.cpp derives them from the GGUF token types (1 normal, 2 unknown,
// 3 control, 4 user-defined, 5 unused, 6 byte; 0 undefined) and from some tokens' text.
enum TokenAttr : uint8_t {
  kAttrNormal = 1 << 0,
  kAttrUnknown = 1 << 1,
  kAttrControl = 1 << 2,
  kAttrUserDefined = 1 << 3,
  kAttrUnused = 1 << 4,
  kAttrByte = 1 << 5,
  kAttrLstrip = 1 << 6,  // a special token that swallows the whitespace before it in text
  kAttrRstrip = 1 << 7,  // ... and after it
};

struct Vocabulary {
  static constexpr int32_t kNone = -1;

  Vocabulary() = default;
  Vocabulary(Vocabulary&&) = default;
  Vocabulary& operator=(Vocabulary&&) = default;
  Vocabulary(const Vocabulary&) = delete;  // the index holds views into `pieces`

  std::string model;  // tokenizer.ggml.model
  std::string pre;    // tokenizer.ggml.pre, "" when absent
  std::vector<std::string> pieces;
  std::vector<uint8_t> attrs;           // TokenAttr bits
  std::vector<float> scores;            // empty when the file has none
  std::vector<std::string> merges;      // tokenizer.ggml.merges ("left right"), empty when absent
  bool has_merges = false;              // the key exists (even if empty)
  std::vector<int16_t> byte_of_token;   // -1 unless a byte token <0xHH>
  std::array<int32_t, 256> byte_token;  // the first byte token of each byte, or kNone
  int32_t bos = kNone, eos = kNone, unk = kNone, eot = kNone, eom = kNone;
  bool add_bos = false, add_eos = false, add_space_prefix = false;
  std::vector<int32_t> eog;  // sorted, unique: every token that ends generation

  // Errors (Code::kModelFile, naming the file): missing or mistyped keys, arrays of
  // mismatched lengths, duplicate pieces, bad byte pieces, special ids out of range.
  static Result<Vocabulary> from_gguf(const GgufFile& file);

  size_t size() const { return pieces.size(); }
  bool has(int32_t id) const { return id >= 0 && static_cast<size_t>(id) < pieces.size(); }
  // kNone when no token has exactly this piece.
  int32_t find(std::string_view piece) const {
    auto it = ids_.find(piece);
    return it == ids_.end() ? kNone : it->second;
  }
  // Builds the piece -> id index; called once the pieces are final.
  void index_pieces() {
    ids_.clear();
    ids_.reserve(pieces.size());
    for (size_t i = 0; i < pieces.size(); ++i) ids_.emplace(pieces[i], static_cast<int32_t>(i));
  }

 private:
  std::unordered_map<std::string_view, int32_t> ids_;
};

}  // namespace tandem::model
