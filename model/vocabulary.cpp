#include "model/vocabulary.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <optional>

namespace tandem::model {

namespace {

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

uint8_t attr_of_type(int64_t type) {
  switch (type) {
    case 1: return kAttrNormal;
    case 2: return kAttrUnknown;
    case 3: return kAttrControl;
    case 4: return kAttrUserDefined;
    case 5: return kAttrUnused;
    case 6: return kAttrByte;
    default: return 0;  // undefined
  }
}

class Loader {
 public:
  explicit Loader(const GgufFile& file) : file_(file) {}

  Status fail(const std::string& problem) const { return Status::model_file(file_.path() + ": " + problem); }

  Status read_kind(Vocabulary& v) const {
    if (!file_.find("tokenizer.ggml.model")) return fail("missing key tokenizer.ggml.model");
    std::optional<std::string> kind = file_.get_string("tokenizer.ggml.model");
    if (!kind) return fail("key tokenizer.ggml.model is not a string");
    v.model = *kind;
    if (file_.find("tokenizer.ggml.pre")) {
      std::optional<std::string> pre = file_.get_string("tokenizer.ggml.pre");
      if (!pre) return fail("key tokenizer.ggml.pre is not a string");
      v.pre = *pre;
    }
    return Status::ok();
  }

  Status read_pieces(Vocabulary& v) const {
    const GgufValue* tokens = file_.find("tokenizer.ggml.tokens");
    if (!tokens) return fail("missing key tokenizer.ggml.tokens");
    const auto* pieces = std::get_if<std::vector<std::string>>(&tokens->value);
    if (tokens->type != GgufValueType::kArray || !pieces) {
      return fail("key tokenizer.ggml.tokens is not an array of strings");
    }
    if (pieces->empty()) return fail("tokenizer.ggml.tokens is empty");
    if (pieces->size() > static_cast<size_t>(INT32_MAX)) return fail("tokenizer.ggml.tokens has too many entries");
    v.pieces = *pieces;
    return Status::ok();
  }

  // A per-token array of `n` entries, or nullptr when the key is absent.
  template <typename T>
  Result<const std::vector<T>*> per_token(const char* key, const char* kind, size_t n) const {
    const GgufValue* value = file_.find(key);
    if (!value) return static_cast<const std::vector<T>*>(nullptr);
    const auto* a = std::get_if<std::vector<T>>(&value->value);
    if (value->type != GgufValueType::kArray || !a)
      return fail(std::string("key ") + key + " is not an array of " + kind);
    if (a->size() != n) {
      return fail(std::string(key) + " has " + std::to_string(a->size()) + " entries, tokenizer.ggml.tokens has " +
                  std::to_string(n));
    }
    return a;
  }

  Status read_scores_and_types(Vocabulary& v) const {
    const size_t n = v.pieces.size();
    auto scores = per_token<double>("tokenizer.ggml.scores", "floats", n);
    if (!scores) return scores.status();
    if (*scores) v.scores.assign((*scores)->begin(), (*scores)->end());
    auto types = per_token<int64_t>("tokenizer.ggml.token_type", "integers", n);
    if (!types) return types.status();
    v.attrs.assign(n, kAttrNormal);
    if (!*types) return Status::ok();
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = (**types)[i];
      if (t < 0 || t > 6) return fail("token " + std::to_string(i) + " has unknown token type " + std::to_string(t));
      v.attrs[i] = attr_of_type(t);
    }
    return Status::ok();
  }

  Status check_pieces(Vocabulary& v) const {
    const size_t n = v.pieces.size();
    v.byte_of_token.assign(n, -1);
    v.byte_token.fill(Vocabulary::kNone);
    std::unordered_map<std::string_view, int32_t> seen;
    seen.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const std::string& p = v.pieces[i];
      auto [it, fresh] = seen.emplace(p, static_cast<int32_t>(i));
      if (!fresh) {
        return fail("duplicate token " + quoted(p) + " (ids " + std::to_string(it->second) + " and " +
                    std::to_string(i) + ")");
      }
      if (v.attrs[i] & kAttrByte) {
        const int b = parse_byte_piece(p);
        if (b < 0)
          return fail("token " + std::to_string(i) + " has type byte but its piece " + quoted(p) + " is not <0xHH>");
        v.byte_of_token[i] = static_cast<int16_t>(b);
        if (v.byte_token[b] < 0) v.byte_token[b] = static_cast<int32_t>(i);
      }
    }
    return Status::ok();
  }

  Status read_merges(Vocabulary& v) const {
    const GgufValue* merges = file_.find("tokenizer.ggml.merges");
    if (!merges) return Status::ok();
    const auto* m = std::get_if<std::vector<std::string>>(&merges->value);
    if (merges->type != GgufValueType::kArray || !m)
      return fail("key tokenizer.ggml.merges is not an array of strings");
    v.merges = *m;
    v.has_merges = true;
    return Status::ok();
  }

  // Defaults per tokenizer model as llama.cpp has them; a default out of range is dropped,
  // an id given in the file out of range is an error.
  Status read_special_ids(Vocabulary& v) const {
    if (v.model == "llama") {
      v.bos = 1, v.eos = 2, v.unk = 0;
    } else if (v.model == "gpt2") {
      v.bos = 11, v.eos = 11;
    }
    struct Special {
      const char* key;
      int32_t* id;
    };
    for (Special s : {Special{"tokenizer.ggml.bos_token_id", &v.bos}, Special{"tokenizer.ggml.eos_token_id", &v.eos},
                      Special{"tokenizer.ggml.unknown_token_id", &v.unk},
                      Special{"tokenizer.ggml.eot_token_id", &v.eot}, Special{"tokenizer.ggml.eom_token_id", &v.eom}}) {
      if (!v.has(*s.id)) *s.id = Vocabulary::kNone;
      if (!file_.find(s.key)) continue;
      std::optional<uint64_t> id = file_.get_uint(s.key);
      if (!id) return fail(std::string("key ") + s.key + " is not a non-negative integer");
      if (*id >= v.size()) {
        return fail(std::string(s.key) + " " + std::to_string(*id) + " is out of range (vocabulary of " +
                    std::to_string(v.size()) + " tokens)");
      }
      *s.id = static_cast<int32_t>(*id);
    }
    return Status::ok();
  }

  Status read_flags(Vocabulary& v) const {
    const bool spm = v.model == "llama";
    v.add_bos = spm || v.model == "gemma4";  // llama.cpp forces BOS for Gemma 4
    v.add_eos = false;
    v.add_space_prefix = spm;
    struct Flag {
      const char* key;
      bool* value;
    };
    for (Flag f : {Flag{"tokenizer.ggml.add_bos_token", &v.add_bos}, Flag{"tokenizer.ggml.add_eos_token", &v.add_eos},
                   Flag{"tokenizer.ggml.add_space_prefix", &v.add_space_prefix}}) {
      if (!file_.find(f.key)) continue;
      std::optional<bool> b = file_.get_bool(f.key);
      if (!b) return fail(std::string("key ") + f.key + " is not a boolean");
      *f.value = *b;
    }
    if (v.model == "gemma4") v.add_bos = true;
    if (v.model != "llama") v.add_space_prefix = false;  // only SentencePiece adds one
    return Status::ok();
  }

  bool name_contains(const char* what) const {
    std::optional<std::string> name = file_.get_string("general.name");
    if (!name) return false;
    std::string lower = *name;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    return lower.find(what) != std::string::npos;
  }

 private:
  const GgufFile& file_;
};

bool one_of(const std::string& s, std::initializer_list<std::string_view> list) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

// llama.cpp finds EOT/EOM by text when the file does not name them, and ends generation on a
// list of tokens by text; each becomes a control token. Lowest id first where it picks one.
void derive_end_of_generation(Vocabulary& v) {
  auto mark_control = [&](int32_t id) { v.attrs[id] |= kAttrControl; };
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string& p = v.pieces[i];
    const auto id = static_cast<int32_t>(i);
    if (v.eot == Vocabulary::kNone && one_of(p, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                                 "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                                                 "<\xef\xbd\x9c"
                                                 "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                                 "<end_of_utterance>"})) {
      v.eot = id;
      mark_control(id);
    }
    if (v.eom == Vocabulary::kNone && p == "<|eom_id|>") {
      v.eom = id;
      mark_control(id);
    }
  }
  std::vector<int32_t> eog;
  for (size_t i = 0; i < v.size(); ++i) {
    if (one_of(v.pieces[i], {"<|eot_id|>",
                             "<|im_end|>",
                             "<|end|>",
                             "<|return|>",
                             "<|call|>",
                             "<|flush|>",
                             "<|calls|>",
                             "<end_of_turn>",
                             "<|endoftext|>",
                             "</s>",
                             "<|eom_id|>",
                             "<EOT>",
                             "_<EOT>",
                             "[EOT]",
                             "[EOS]",
                             "<|end_of_text|>",
                             "<end_of_utterance>",
                             "<eos>",
                             "<turn|>",
                             "<|tool_response>",
                             "<\xef\xbd\x9c"
                             "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                             "[e~["})) {
      eog.push_back(static_cast<int32_t>(i));
      mark_control(static_cast<int32_t>(i));
    }
  }
  for (int32_t id : {v.eos, v.eot, v.eom})
    if (id != Vocabulary::kNone) eog.push_back(id);
  auto find_piece = [&](std::string_view piece) {
    for (int32_t id : eog)
      if (v.pieces[id] == piece) return id;
    return Vocabulary::kNone;
  };
  // gpt-oss and solar-open end a turn with <|return|>/<|call|>: their <|end|> is text.
  const int32_t end = find_piece("<|end|>");
  if (end != Vocabulary::kNone && ((find_piece("<|return|>") >= 0 && find_piece("<|call|>") >= 0) ||
                                   (find_piece("<|calls|>") >= 0 && find_piece("<|flush|>") >= 0))) {
    std::erase(eog, end);
    v.attrs[end] = kAttrUserDefined;
  }
  // Gemma 4's </s> is ordinary text.
  const int32_t s = find_piece("</s>");
  if (s != Vocabulary::kNone && find_piece("<|tool_response>") >= 0 && s != v.eos) {
    std::erase(eog, s);
    v.attrs[s] = kAttrNormal;
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  v.eog = std::move(eog);
}

// gpt-oss's channel tokens are always rendered; Phi-3's special tokens swallow the whitespace
// after them (llama.cpp sets these by name).
void derive_special_attrs(Vocabulary& v, bool phi3) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (one_of(v.pieces[i], {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}))
      v.attrs[i] = kAttrUserDefined;
  }
  if (!phi3) return;
  for (size_t i = 0; i < v.size(); ++i) {
    const bool special = v.attrs[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown);
    if (special || v.pieces[i] == "</s>") v.attrs[i] |= kAttrRstrip;
    if (one_of(v.pieces[i], {"<unk>", "<s>", "<|endoftext|>"})) v.attrs[i] &= ~kAttrRstrip;
  }
}

}  // namespace

Result<Vocabulary> Vocabulary::from_gguf(const GgufFile& file) {
  Loader loader(file);
  Vocabulary v;
  for (auto step : {&Loader::read_kind, &Loader::read_pieces, &Loader::read_scores_and_types, &Loader::check_pieces,
                    &Loader::read_merges, &Loader::read_special_ids, &Loader::read_flags}) {
    Status st = (loader.*step)(v);
    if (!st.is_ok()) return st;
  }
  v.index_pieces();
  derive_end_of_generation(v);
  derive_special_attrs(v, loader.name_contains("phi-3") || loader.name_contains("phi3"));
  return v;
}

}  // namespace tandem::model
