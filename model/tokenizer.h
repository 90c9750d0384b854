// Text <-> token ids from the GGUF vocabulary (tokenizer.ggml.*), as Hugging Face's tokenizers
// and llama.cpp encode them.
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

struct EncodeOptions {
  // Add BOS / EOS where the vocabulary asks for them (tokenizer.ggml.add_bos_token,
  // add_eos_token; SentencePiece vocabularies add BOS unless told not to).
  bool add_special = true;
  // Control tokens written in the text (e.g. "<|im_start|>") become those tokens. Off: they
  // are ordinary text, so users cannot inject them. User-defined tokens are always matched.
  bool parse_special = false;
};

struct DecodeOptions {
  bool special = false;  // control and unknown tokens give their piece (otherwise nothing)
  // SentencePiece vocabularies that add a space before the text: the first token that gives
  // text loses one leading space, so decode(encode(s)) == s. Off for a continuation (the
  // tokens a model generates after a prompt).
  bool strip_space_prefix = false;
};

// One interface over the tokenizer models (tokenizer.ggml.model):
//   - "llama": SentencePiece BPE by scores with <0xHH> byte fallback and add_space_prefix;
//     a vocabulary whose only text tokens are the 256 byte tokens (tandem's make-model) is
//     byte-level: one token per byte, any bytes, byte-for-byte round trips;
//   - "gpt2": byte-level BPE over tokenizer.ggml.merges, words split by the regexes of
//     tokenizer.ggml.pre (default, gpt-2, llama-bpe/llama3, qwen2, qwen35, deepseek-llm,
//     deepseek-coder, starcoder, falcon, refact, mpt, command-r);
//   - "gemma4": Gemma 4's BPE over raw UTF-8 lines with byte fallback.
// A vocabulary tandem cannot encode (another model or pre-tokenizer) still loads and decodes;
// encode() then refuses with an error naming what is missing, and callers pass token ids.
// Copies share the loaded vocabulary; every method is const and safe from several threads.
class Tokenizer {
 public:
  // Errors (Code::kModelFile, naming the file): missing tokenizer.ggml.model or .tokens,
  // arrays of mismatched lengths, duplicate token strings, special ids out of range, a merges
  // entry that is not two tokens whose concatenation is a token.
  static Result<Tokenizer> from_gguf(const GgufFile& file);

  uint32_t vocab_size() const;
  int32_t bos_id() const;  // -1 when the vocabulary has none
  int32_t eos_id() const;
  int32_t eot_id() const;  // end of turn (tokenizer.ggml.eot_token_id or found by its text)
  int32_t eom_id() const;  // end of message (Llama 3.1's <|eom_id|>)
  // End of generation: eos, eot, eom and the vocabulary's other end tokens as llama.cpp
  // lists them by text (<|im_end|>, <end_of_turn>, <|endoftext|>, ...).
  bool is_eog(int32_t token) const;
  const std::vector<int32_t>& eog_ids() const;  // sorted
  bool can_encode() const;
  const std::string& kind() const;  // tokenizer.ggml.model
  const std::string& pre() const;   // tokenizer.ggml.pre, "" when absent

  // Errors (Code::kInvalidArgument): the vocabulary cannot encode (see above); text that is
  // not valid UTF-8 (every byte is accepted by byte-level vocabularies), naming the offset.
  Result<std::vector<int32_t>> encode(std::string_view text, EncodeOptions options = {}) const;
  Result<std::vector<int32_t>> encode(std::string_view text, bool add_special) const {
    return encode(text, EncodeOptions{.add_special = add_special});
  }

  // Appends the bytes of one token: byte tokens their byte, normal tokens their text (GPT-2's
  // byte characters mapped back, U+2581 as a space), user-defined tokens their piece;
  // control/unknown tokens their piece only when `special`; unused/undefined tokens and ids
  // out of range nothing.
  void append_token_text(int32_t token, bool special, std::string& out) const;
  void append_token_bytes(int32_t token, std::string& out) const { append_token_text(token, false, out); }
  // The tokens' bytes one after the other (no space stripped, no special pieces).
  std::string decode(std::span<const int32_t> tokens) const;
  std::string decode(std::span<const int32_t> tokens, DecodeOptions options) const;
  const std::string& piece(int32_t token) const;
  bool strips_space_prefix() const;  // SentencePiece with add_space_prefix (not byte-level)

 private:
  struct State;
  std::shared_ptr<const State> state_;
};

// Turns tokens into UTF-8 text one token at a time without ever splitting a character
// across outputs: bytes of an incomplete character wait for the next token (or flush()).
// Bytes that can never be part of a valid character (invalid UTF-8) are released as they
// are, at once, so nothing is held forever. The concatenated output equals
// Tokenizer::decode of the same tokens with the same options. Keeps a pointer to the
// tokenizer, which must outlive it.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, DecodeOptions options = {});
  // Appends the bytes that are now complete characters (or undecodable bytes) to `out`.
  void push(int32_t token, std::string& out);
  // Appends whatever is held back (an incomplete character at the very end).
  void flush(std::string& out);

 private:
  const Tokenizer* tok_;
  DecodeOptions options_;
  std::string pending_;  // at most 3 bytes between calls: the valid start of a character
};

}  // namespace tandem::model
