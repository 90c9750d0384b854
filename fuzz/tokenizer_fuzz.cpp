// The tokenizers fed arbitrary text. An input is [which: 1 byte][text...]: `which` picks a
// tokenizer (modulo how many loaded) and whether special tokens are parsed (bit 7). Aborts
// when valid UTF-8 is refused or does not survive decode(encode(text)) (special tokens not
// parsed; text holding U+2581 excepted for SentencePiece-style vocabularies), when
// the streamed decoding differs from the one-shot one, or when an id is outside the vocabulary.
// Tokenizers: a byte-level vocabulary written here, and llama.cpp's gpt-2, llama-bpe, qwen2,
// llama-spm and gemma-4 vocabularies where they are found (TANDEM_LLAMA_VOCAB_DIR, the build
// tree's llama-tree/llama.cpp/models from tests/data/fetch-llama-tree.sh, ../shared/data/vocab).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/make_model.h"
#include "model/tokenizer.h"
#include "runtime/utf8.h"

namespace {

using tandem::model::DecodeOptions;
using tandem::model::EncodeOptions;
using tandem::model::GgufFile;
using tandem::model::StreamDecoder;
using tandem::model::Tokenizer;

struct Loaded {
  std::unique_ptr<GgufFile> file;
  Tokenizer tok;
};

std::string byte_level_vocab() {
  tandem::model::GgufWriter w;
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  tandem::model::append_byte_level_tokens(tokens, types);
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  const std::string path = std::filesystem::temp_directory_path() / ("tokenizer_fuzz_" + std::to_string(getpid()));
  if (!w.write(path).is_ok()) std::abort();
  return path;
}

void load(const std::string& path, std::vector<Loaded>& out) {
  auto file = GgufFile::open(path);
  if (!file) return;
  auto tok = Tokenizer::from_gguf(**file);
  if (!tok || !tok->can_encode()) std::abort();  // every vocabulary listed here must encode
  out.push_back(Loaded{std::move(*file), std::move(*tok)});
}

std::vector<Loaded>& tokenizers() {
  static std::vector<Loaded>* all = [] {
    auto* v = new std::vector<Loaded>();
    const std::string byte_level = byte_level_vocab();
    load(byte_level, *v);
    std::filesystem::remove(byte_level);  // mapped already
    std::vector<std::string> dirs;
    if (const char* env = std::getenv("TANDEM_LLAMA_VOCAB_DIR")) dirs.emplace_back(env);
    dirs.emplace_back(TANDEM_BUILD_DIR "/llama-tree/llama.cpp/models");
    dirs.emplace_back(TANDEM_SOURCE_DIR "/../shared/data/vocab");
    for (const char* name : {"gpt-2", "llama-bpe", "qwen2", "llama-spm", "gemma-4"}) {
      for (const std::string& d : dirs) {
        const std::string p = d + "/ggml-vocab-" + name + ".gguf";
        if (std::filesystem::exists(p)) {
          load(p, *v);
          break;
        }
      }
    }
    std::fprintf(stderr, "tokenizer_fuzz: %zu tokenizers\n", v->size());
    return v;
  }();
  return *all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  auto& all = tokenizers();
  const Tokenizer& tok = all[data[0] % all.size()].tok;
  const bool parse_special = data[0] & 0x80;
  // SentencePiece-style vocabularies read U+2581 as a space: text holding one cannot round-trip.
  const bool representable =
      tok.kind() == "gpt2" || data[0] % all.size() == 0 ||
      std::string_view(reinterpret_cast<const char*>(data), size).find("\xe2\x96\x81") == std::string_view::npos;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  auto ids = tok.encode(text, EncodeOptions{.add_special = true, .parse_special = parse_special});
  if (!ids) {
    if (tandem::runtime::utf8_valid(text)) std::abort();  // only invalid UTF-8 may be refused
    return 0;
  }
  for (int32_t id : *ids)
    if (id < 0 || static_cast<uint32_t>(id) >= tok.vocab_size()) std::abort();
  const DecodeOptions options{.special = parse_special, .strip_space_prefix = true};
  const std::string once = tok.decode(*ids, options);
  if (!parse_special && representable && once != text) std::abort();
  StreamDecoder stream(tok, options);
  std::string streamed;
  for (int32_t id : *ids) stream.push(id, streamed);
  stream.flush(streamed);
  if (streamed != once) std::abort();
  return 0;
}
