// Byte-pair encoding by merge rank: GPT-2's byte-level BPE ("gpt2") and Gemma 4's BPE over
// raw UTF-8 ("gemma4").
#include <queue>
#include <string>
#include <unordered_map>

#include "runtime/utf8.h"
#include "model/pretokenizer.h"
#include "model/text_encoder.h"

namespace tandem::model {

namespace {

constexpr int32_t kGone = -2;  // a symbol merged into its left neighbour

// The merges list as (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  static Result<MergeTable> build(const Vocabulary& vocab) {
    MergeTable t;
    t.table_.reserve(vocab.merges.size());
    auto fail = [](size_t i, const std::string& m, const std::string& why) {
      return Status::model_file("tokenizer.ggml.merges[" + std::to_string(i) + "] '" + m.substr(0, 80) + "' " + why);
    };
    for (size_t i = 0; i < vocab.merges.size(); ++i) {
      const std::string& m = vocab.merges[i];
      const size_t space = m.find(' ', 1);
      if (space == std::string::npos) return fail(i, m, "is not two tokens separated by a space");
      const std::string_view left(m.data(), space), right(m.data() + space + 1, m.size() - space - 1);
      const int32_t l = vocab.find(left), r = vocab.find(right);
      const int32_t merged = vocab.find(std::string(left) + std::string(right));
      if (l < 0 || r < 0 || merged < 0) return fail(i, m, "names a token the vocabulary does not have");
      t.table_.emplace(key(l, r), Merge{static_cast<int32_t>(i), merged});
    }
    return t;
  }

  // Merges `ids` (one per character; kNone for characters that are no token) in place,
  // lowest rank first, leftmost first among equals.
  void apply(std::vector<int32_t>& ids) const;

 private:
  struct Merge {
    int32_t rank, merged;
  };
  static uint64_t key(int32_t l, int32_t r) { return (static_cast<uint64_t>(l) << 32) | static_cast<uint32_t>(r); }
  std::unordered_map<uint64_t, Merge> table_;
};

void MergeTable::apply(std::vector<int32_t>& ids) const {
  const auto n = static_cast<int32_t>(ids.size());
  if (n < 2) return;
  struct Candidate {
    int32_t rank, left, right, left_id, right_id, merged;
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::vector<int32_t> prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  std::priority_queue<Candidate> queue;
  auto consider = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0 || ids[l] < 0 || ids[r] < 0) return;
    auto it = table_.find(key(ids[l], ids[r]));
    if (it != table_.end()) queue.push(Candidate{it->second.rank, l, r, ids[l], ids[r], it->second.merged});
  };
  for (int32_t i = 1; i < n; ++i) consider(i - 1, i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    if (ids[c.left] != c.left_id || ids[c.right] != c.right_id || next[c.left] != c.right) continue;  // stale
    ids[c.left] = c.merged;
    ids[c.right] = kGone;
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    consider(prev[c.left], c.left);
    consider(c.left, next[c.left]);
  }
  std::erase(ids, kGone);
}

// GPT-2's reversible map of the 256 bytes to printable characters.
struct ByteChars {
  std::string of_byte[256];                   // UTF-8 of the character standing for each byte
  std::unordered_map<uint32_t, int> to_byte;  // code point -> byte
  ByteChars() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : 256 + static_cast<uint32_t>(extra++);
      of_byte[b] = cp < 0x80 ? std::string(1, static_cast<char>(cp))
                             : std::string{static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
      to_byte[cp] = b;
    }
  }
};

const ByteChars& byte_chars() {
  static const ByteChars chars;
  return chars;
}

// Decodes one UTF-8 character at s[i] (valid input), advancing i.
uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t len = runtime::utf8_sequence_length(s, i);
  if (len == 0) len = 1;
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

// Walks the fragments in order: a special token's id goes out as it is, and each raw
// fragment's words (ordered spans inside it, as PreTokenizer::split gives them) go to `word`.
template <typename F>
void emit_in_order(const std::vector<Fragment>& fragments, const std::vector<Span>& words, std::vector<int32_t>& out,
                   F&& word) {
  size_t w = 0;
  for (const Fragment& f : fragments) {
    if (f.token != Vocabulary::kNone) {
      out.push_back(f.token);
      continue;
    }
    for (; w < words.size() && words[w].begin < f.end; ++w) word(words[w]);
  }
}

class Gpt2Encoder final : public TextEncoder {
 public:
  Gpt2Encoder(const Vocabulary& vocab, PreTokenizer pre, MergeTable merges)
      : vocab_(vocab), pre_(std::move(pre)), merges_(std::move(merges)) {
    for (int b = 0; b < 256; ++b) byte_id_[b] = vocab.find(byte_chars().of_byte[b]);
  }

  Status encode(std::string_view text, const std::vector<Fragment>& fragments,
                std::vector<int32_t>& out) const override {
    std::vector<Span> raw, words;
    for (const Fragment& f : fragments)
      if (f.token == Vocabulary::kNone) raw.push_back(Span{f.begin, f.end});
    TANDEM_RETURN_IF_ERROR(pre_.split(text, raw, words));
    WordCache cache;
    auto encode_word = [&](std::string_view word, std::vector<int32_t>& ids) { this->encode_word(word, ids); };
    emit_in_order(fragments, words, out,
                  [&](const Span& w) { cache.emit(text.substr(w.begin, w.end - w.begin), out, encode_word); });
    return Status::ok();
  }

 private:
  void encode_word(std::string_view word, std::vector<int32_t>& out) const {
    if (pre_.ignore_merges()) {
      std::string mapped;
      for (unsigned char c : word) mapped += byte_chars().of_byte[c];
      if (int32_t id = vocab_.find(mapped); id >= 0) {
        out.push_back(id);
        return;
      }
    }
    std::vector<int32_t> ids;
    ids.reserve(word.size());
    for (unsigned char c : word) ids.push_back(byte_id_[c]);
    merges_.apply(ids);
    for (int32_t id : ids) {
      if (id >= 0) {
        out.push_back(id);
      } else if (vocab_.unk >= 0) {
        out.push_back(vocab_.unk);  // a vocabulary without all 256 byte characters
      }
    }
  }

  const Vocabulary& vocab_;
  PreTokenizer pre_;
  MergeTable merges_;
  int32_t byte_id_[256];
};

class Gemma4Encoder final : public TextEncoder {
 public:
  Gemma4Encoder(const Vocabulary& vocab, PreTokenizer lines, MergeTable merges)
      : vocab_(vocab), lines_(std::move(lines)), merges_(std::move(merges)), breaks_(WordBreaks::of(vocab)) {}

  Status encode(std::string_view raw, const std::vector<Fragment>& fragments,
                std::vector<int32_t>& out) const override {
    // Spaces as U+2581, all raw fragments in one string (the word cache keeps views into it).
    std::string text;
    text.reserve(raw.size() + raw.size() / 4);
    std::vector<Fragment> escaped;
    for (const Fragment& f : fragments) {
      if (f.token != Vocabulary::kNone) {
        escaped.push_back(f);
        continue;
      }
      const auto begin = static_cast<uint32_t>(text.size());
      append_escaping_spaces(raw.substr(f.begin, f.end - f.begin), text);
      escaped.push_back(Fragment{Vocabulary::kNone, begin, static_cast<uint32_t>(text.size())});
    }
    std::vector<Span> segments, lines;
    for (const Fragment& f : escaped)
      if (f.token == Vocabulary::kNone) segments.push_back(Span{f.begin, f.end});
    TANDEM_RETURN_IF_ERROR(lines_.split(text, segments, lines));
    WordCache cache;
    auto encode_word = [&](std::string_view word, std::vector<int32_t>& ids) { this->encode_word(word, ids); };
    emit_in_order(escaped, lines, out, [&](const Span& l) {
      const std::string_view line = std::string_view(text).substr(l.begin, l.end - l.begin);
      if (line.find('\n') == std::string_view::npos) {
        breaks_.for_each_word(line, [&](std::string_view w) { cache.emit(w, out, encode_word); });
      } else {
        cache.emit(line, out, encode_word);
      }
    });
    return Status::ok();
  }

 private:
  void encode_word(std::string_view word, std::vector<int32_t>& out) const {
    if (word.find_first_not_of('\n') == std::string_view::npos) {
      if (int32_t id = vocab_.find(word); id >= 0) {
        out.push_back(id);
        return;
      }
    }
    std::vector<int32_t> ids;
    std::vector<std::string_view> chars;
    for (size_t i = 0; i < word.size();) {
      const size_t at = i;
      next_code_point(word, i);
      chars.push_back(word.substr(at, i - at));
      ids.push_back(vocab_.find(chars.back()));
    }
    std::vector<size_t> unmatched;  // characters that are no token: they never merge
    for (size_t c = 0; c < ids.size(); ++c)
      if (ids[c] < 0) unmatched.push_back(c);
    merges_.apply(ids);
    size_t k = 0;
    for (int32_t id : ids) {
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      for (unsigned char b : chars[unmatched[k++]]) {  // byte fallback: <0xHH> tokens
        if (vocab_.byte_token[b] >= 0) out.push_back(vocab_.byte_token[b]);
      }
    }
  }

  const Vocabulary& vocab_;
  PreTokenizer lines_;
  MergeTable merges_;
  const WordBreaks breaks_;
};

}  // namespace

std::string byte_level_piece_text(const std::string& piece) {
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    const size_t at = i;
    auto it = byte_chars().to_byte.find(next_code_point(piece, i));
    if (it != byte_chars().to_byte.end()) {
      out += static_cast<char>(it->second);
    } else {
      out.append(piece, at, i - at);
    }
  }
  return out;
}

Result<std::unique_ptr<TextEncoder>> make_gpt2_encoder(const Vocabulary& vocab) {
  auto pre = PreTokenizer::for_name(vocab.pre.empty() ? "default" : vocab.pre);
  if (!pre) return pre.status();
  auto merges = MergeTable::build(vocab);
  if (!merges) return merges.status();
  return std::unique_ptr<TextEncoder>(new Gpt2Encoder(vocab, std::move(*pre), std::move(*merges)));
}

Result<std::unique_ptr<TextEncoder>> make_gemma4_encoder(const Vocabulary& vocab) {
  auto lines = PreTokenizer::for_name("gemma4");
  if (!lines) return lines.status();
  auto merges = MergeTable::build(vocab);
  if (!merges) return merges.status();
  return std::unique_ptr<TextEncoder>(new Gemma4Encoder(vocab, std::move(*lines), std::move(*merges)));
}

}  // namespace tandem::model
