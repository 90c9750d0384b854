// A real vocabulary for a model tandem writes (`tandem make-model --vocab-from`): the
// tokenizer.* metadata of a GGUF file copied as is, or a Hugging Face tokenizer.json (with its
// tokenizer_config.json) converted as llama.cpp's convert_hf_to_gguf.py converts it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/gguf.h"
#include "runtime/status.h"

namespace tandem::model {

// The tokenizer.* keys of a vocabulary in the order a GGUF writer should emit them, and how
// many tokens it has (the model's vocab_size).
struct VocabularyKeys {
  std::vector<std::pair<std::string, GgufValue>> keys;
  uint32_t size = 0;
};

struct VocabularySource {
  std::string path;              // a .gguf file, or a tokenizer.json
  std::string tokenizer_config;  // tokenizer.json only: "" = tokenizer_config.json beside it, if any
  std::string pre;               // tokenizer.json only: tokenizer.ggml.pre; "" = derive it from the file
};

// Reads the vocabulary `source` names. A GGUF gives every tokenizer.ggml.* key and
// tokenizer.chat_template(.NAME) unchanged. A tokenizer.json gives, as convert_hf_to_gguf.py:
//   - model BPE without byte_fallback -> "gpt2": tokens by id (added tokens included, gaps
//     "[PADn]" unused), token types (added tokens control when special or looking special
//     "<|...|>", else user-defined), merges ("a b", spaces inside a part as U+0120), and the
//     pre-tokenizer named by its Split regexes (llama-bpe, qwen2, qwen35, gpt-2, ...);
//   - model BPE with byte_fallback (SentencePiece exported) -> "llama" with pre "default",
//     <0xHH> byte tokens, and scores from the merges' ranks (the merge that makes a token
//     earlier = higher score), so SentencePiece's score order is Hugging Face's merge order;
//   - special ids bos/eos/unk/sep/pad/cls/mask, add_bos/add_eos (tokenizer_config.json, else
//     the post-processor's template) and chat_template(s), as gguf-py's SpecialVocab. Without
//     a tokenizer_config.json only the add_* flags (gguf-py reads the ids from config.json,
//     which tandem does not).
// Errors (Code::kModelFile or kInvalidArgument), naming the file: unreadable or invalid
// JSON, a model type other than BPE (Unigram, WordPiece, ...), a pre-tokenizer that cannot be
// derived (the message says which pieces it has and asks for --pre), a --pre tandem does not
// know, a GGUF without tokenizer.ggml.tokens.
Result<VocabularyKeys> read_vocabulary(const VocabularySource& source);

}  // namespace tandem::model
