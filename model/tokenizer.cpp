#include "model/tokenizer.h"

#include <cstdio>
#include <string_view>
#include <unordered_map>

namespace tandem::model {

namespace {

// GGUF token types (llama_token_type).
constexpr int32_t kNormal = 1, kUserDefined = 4, kByte = 6;

// "<0xHH>" -> HH, else -1. Either hex case is accepted.
int parse_byte_piece(const std::string& piece) {
  if (piece.size() != 6 || piece[0] != '<' || piece[1] != '0' || piece[2] != 'x' || piece[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int hi = hex(piece[3]), lo = hex(piece[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// A token piece quoted for an error message (pieces may hold any bytes).
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (unsigned char c : s.substr(0, 64)) {
    if (c >= 0x20 && c < 0x7f && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out + (s.size() > 64 ? "...'" : "'");
}

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  auto fail = [&](const std::string& problem) { return Status::model_file(file.path() + ": " + problem); };
  Tokenizer tok;

  const GgufValue* model = file.find("tokenizer.ggml.model");
  if (!model) return fail("missing key tokenizer.ggml.model");
  std::optional<std::string> kind = file.get_string("tokenizer.ggml.model");
  if (!kind) return fail("key tokenizer.ggml.model is not a string");
  tok.kind_ = *kind;

  const GgufValue* tokens = file.find("tokenizer.ggml.tokens");
  if (!tokens) return fail("missing key tokenizer.ggml.tokens");
  const auto* pieces = std::get_if<std::vector<std::string>>(&tokens->value);
  if (tokens->type != GgufValueType::kArray || !pieces) {
    return fail("key tokenizer.ggml.tokens is not an array of strings");
  }
  if (pieces->empty()) return fail("tokenizer.ggml.tokens is empty");
  if (pieces->size() > static_cast<size_t>(INT32_MAX)) return fail("tokenizer.ggml.tokens has too many entries");
  const size_t n = pieces->size();

  if (const GgufValue* scores = file.find("tokenizer.ggml.scores")) {
    const auto* s = std::get_if<std::vector<double>>(&scores->value);
    if (scores->type != GgufValueType::kArray || !s) return fail("key tokenizer.ggml.scores is not an array of floats");
    if (s->size() != n) {
      return fail("tokenizer.ggml.scores has " + std::to_string(s->size()) + " entries, tokenizer.ggml.tokens has " +
                  std::to_string(n));
    }
  }

  tok.types_.assign(n, kNormal);
  if (const GgufValue* types = file.find("tokenizer.ggml.token_type")) {
    const auto* t = std::get_if<std::vector<int64_t>>(&types->value);
    if (types->type != GgufValueType::kArray || !t) {
      return fail("key tokenizer.ggml.token_type is not an array of integers");
    }
    if (t->size() != n) {
      return fail("tokenizer.ggml.token_type has " + std::to_string(t->size()) +
                  " entries, tokenizer.ggml.tokens has " + std::to_string(n));
    }
    for (size_t i = 0; i < n; ++i) {
      if ((*t)[i] < 0 || (*t)[i] > kByte) {
        return fail("token " + std::to_string(i) + " has unknown token type " + std::to_string((*t)[i]));
      }
      tok.types_[i] = static_cast<int32_t>((*t)[i]);
    }
  }

  tok.pieces_ = *pieces;
  tok.byte_of_token_.assign(n, -1);
  for (int32_t& b : tok.byte_token_) b = -1;
  std::unordered_map<std::string_view, int32_t> seen;
  seen.reserve(n);
  size_t n_normal = 0;
  for (size_t i = 0; i < n; ++i) {
    const std::string& p = tok.pieces_[i];
    auto [it, fresh] = seen.emplace(p, static_cast<int32_t>(i));
    if (!fresh) {
      return fail("duplicate token " + quoted(p) + " (ids " + std::to_string(it->second) + " and " + std::to_string(i) +
                  ")");
    }
    const int32_t type = tok.types_[i];
    if (type == kNormal || type == kUserDefined) ++n_normal;
    if (type == kByte) {
      int b = parse_byte_piece(p);
      if (b < 0)
        return fail("token " + std::to_string(i) + " has type byte but its piece " + quoted(p) + " is not <0xHH>");
      tok.byte_of_token_[i] = static_cast<int16_t>(b);
      if (tok.byte_token_[b] < 0) tok.byte_token_[b] = static_cast<int32_t>(i);
    }
  }

  struct Special {
    const char* key;
    int32_t* id;
  };
  for (Special s :
       {Special{"tokenizer.ggml.bos_token_id", &tok.bos_}, Special{"tokenizer.ggml.eos_token_id", &tok.eos_},
        Special{"tokenizer.ggml.unknown_token_id", &tok.unk_}}) {
    if (file.find(s.key)) {
      std::optional<uint64_t> id = file.get_uint(s.key);
      if (!id) return fail(std::string("key ") + s.key + " is not a non-negative integer");
      if (*id >= n) {
        return fail(std::string(s.key) + " " + std::to_string(*id) + " is out of range (vocabulary of " +
                    std::to_string(n) + " tokens)");
      }
      *s.id = static_cast<int32_t>(*id);
    } else if (static_cast<size_t>(*s.id) >= n) {
      return fail(std::string("missing key ") + s.key + " and the default id " + std::to_string(*s.id) +
                  " is out of range (vocabulary of " + std::to_string(n) + " tokens)");
    }
  }

  bool all_bytes = true;
  for (int32_t t : tok.byte_token_) all_bytes = all_bytes && t >= 0;
  tok.n_normal_ = n_normal;
  tok.byte_level_ = tok.kind_ == "llama" && all_bytes && n_normal == 0;
  return tok;
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_bos) const {
  if (!byte_level_) {
    return Status::invalid("text prompts need the '" + kind_ + "' tokenizer (" + std::to_string(n_normal_) +
                           " normal tokens), which tandem does not support yet; pass token ids");
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() + (add_bos ? 1 : 0));
  if (add_bos) ids.push_back(bos_);
  for (unsigned char c : text) ids.push_back(byte_token_[c]);
  return ids;
}

void Tokenizer::append_token_bytes(int32_t token, std::string& out) const {
  if (token < 0 || static_cast<size_t>(token) >= pieces_.size()) return;
  const int32_t type = types_[token];
  if (type == kByte) {
    out += static_cast<char>(static_cast<unsigned char>(byte_of_token_[token]));
  } else if (type == kNormal) {
    // SentencePiece marks spaces with U+2581 (e2 96 81).
    const std::string& p = pieces_[token];
    for (size_t i = 0; i < p.size();) {
      if (p.compare(i, 3, "\xe2\x96\x81") == 0) {
        out += ' ';
        i += 3;
      } else {
        out += p[i++];
      }
    }
  } else if (type == kUserDefined) {
    out += pieces_[token];
  }
}

std::string Tokenizer::decode(std::span<const int32_t> tokens) const {
  std::string out;
  for (int32_t t : tokens) append_token_bytes(t, out);
  return out;
}

}  // namespace tandem::model
