// SentencePiece-style BPE ("llama"): adjacent pieces merge while their concatenation is a
// token, highest score first; characters that are no token fall back to <0xHH> byte tokens.
// And tandem's byte-level vocabularies, one byte token per byte.
#include <queue>
#include <string>

#include "runtime/utf8.h"
#include "model/text_encoder.h"

namespace tandem::model {

namespace {

const std::string kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space

}  // namespace

std::string spm_piece_text(const std::string& piece) {
  std::string out;
  out.reserve(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    if (piece.compare(i, 3, kSpace) == 0) {
      out += ' ';
      i += 2;
    } else {
      out += piece[i];
    }
  }
  return out;
}

WordBreaks WordBreaks::of(const Vocabulary& vocab) {
  WordBreaks b;
  for (const std::string& p : vocab.pieces) {
    size_t i = 0;
    while (p.compare(i, 3, kSpace) == 0) i += 3;
    for (i = p.find(kSpace, i); i != std::string::npos && i > 0; i = p.find(kSpace, i + 3)) {
      b.unsafe_before.set(static_cast<unsigned char>(p[i - 1]));
    }
  }
  return b;
}

void WordBreaks::for_each_word(std::string_view text, const std::function<void(std::string_view)>& word) const {
  size_t begin = 0;
  for (size_t i = 1; i + 3 <= text.size(); ++i) {
    if (text.compare(i, 3, kSpace) != 0) continue;
    if ((i < 3 || text.compare(i - 3, 3, kSpace) != 0) && !unsafe_before[static_cast<unsigned char>(text[i - 1])]) {
      word(text.substr(begin, i - begin));
      begin = i;
    }
    i += 2;
  }
  if (begin < text.size()) word(text.substr(begin));
}

void append_escaping_spaces(std::string_view raw, std::string& out) {
  for (char c : raw) {
    if (c == ' ') {
      out += kSpace;
    } else {
      out += c;
    }
  }
}

namespace {

class SpmEncoder final : public TextEncoder {
 public:
  explicit SpmEncoder(const Vocabulary& vocab) : vocab_(vocab), breaks_(WordBreaks::of(vocab)) {}

  Status encode(std::string_view text, const std::vector<Fragment>& fragments,
                std::vector<int32_t>& out) const override {
    // The raw fragments with spaces as U+2581 (and a leading one at the start of the text and
    // after each special token), all in one string that outlives the word cache's views.
    std::string escaped;
    escaped.reserve(text.size() + text.size() / 4 + 3 * fragments.size());
    std::vector<Span> raw;
    bool first = true;
    for (const Fragment& f : fragments) {
      if (f.token != Vocabulary::kNone) {
        first = true;
        continue;
      }
      const auto begin = static_cast<uint32_t>(escaped.size());
      if (first && vocab_.add_space_prefix) escaped += kSpace;
      append_escaping_spaces(text.substr(f.begin, f.end - f.begin), escaped);
      raw.push_back(Span{begin, static_cast<uint32_t>(escaped.size())});
      first = false;
    }
    WordCache cache;
    auto merge_word = [&](std::string_view w, std::vector<int32_t>& ids) { merge(w, ids); };
    size_t r = 0;
    for (const Fragment& f : fragments) {
      if (f.token != Vocabulary::kNone) {
        out.push_back(f.token);
        continue;
      }
      const std::string_view t = std::string_view(escaped).substr(raw[r].begin, raw[r].end - raw[r].begin);
      ++r;
      breaks_.for_each_word(t, [&](std::string_view w) { cache.emit(w, out, merge_word); });
    }
    return Status::ok();
  }

  bool adds_space_prefix() const override { return vocab_.add_space_prefix; }

 private:
  struct Symbol {
    uint32_t begin, len;
    int32_t prev, next;
  };
  struct Candidate {
    float score;
    int32_t left, right;
    uint32_t len;
    bool operator<(const Candidate& o) const { return score != o.score ? score < o.score : left > o.left; }
  };

  float score(int32_t id) const { return vocab_.scores.empty() ? 0.0f : vocab_.scores[id]; }

  void merge(std::string_view text, std::vector<int32_t>& out) const;
  void emit(std::string_view piece, std::vector<int32_t>& out) const;

  const Vocabulary& vocab_;
  const WordBreaks breaks_;
};

void SpmEncoder::merge(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<Symbol> syms;
  for (size_t i = 0; i < text.size();) {
    size_t len = runtime::utf8_sequence_length(text, i);
    if (len == 0) len = 1;
    const auto n = static_cast<int32_t>(syms.size());
    syms.push_back(Symbol{static_cast<uint32_t>(i), static_cast<uint32_t>(len), n - 1, -1});
    if (n > 0) syms[n - 1].next = n;
    i += len;
  }
  std::priority_queue<Candidate> queue;
  auto consider = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const uint32_t len = syms[l].len + syms[r].len;
    const int32_t id = vocab_.find(text.substr(syms[l].begin, len));
    if (id >= 0) queue.push(Candidate{score(id), l, r, len});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) consider(i - 1, i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol &l = syms[c.left], &r = syms[c.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != c.len) continue;  // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    consider(l.prev, c.left);
    consider(c.left, l.next);
  }
  for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) {
    emit(text.substr(syms[i].begin, syms[i].len), out);
  }
}

void SpmEncoder::emit(std::string_view piece, std::vector<int32_t>& out) const {
  if (int32_t id = vocab_.find(piece); id >= 0) {
    out.push_back(id);
    return;
  }
  for (unsigned char b : piece) {
    const int32_t id = vocab_.byte_token[b];
    if (id >= 0) {
      out.push_back(id);
    } else if (vocab_.unk >= 0) {
      out.push_back(vocab_.unk);
    }
  }
}

class ByteLevelEncoder final : public TextEncoder {
 public:
  explicit ByteLevelEncoder(const Vocabulary& vocab) : vocab_(vocab) {}

  Status encode(std::string_view text, const std::vector<Fragment>& fragments,
                std::vector<int32_t>& out) const override {
    out.reserve(out.size() + text.size());
    for (const Fragment& f : fragments) {
      if (f.token != Vocabulary::kNone) {
        out.push_back(f.token);
        continue;
      }
      for (unsigned char c : text.substr(f.begin, f.end - f.begin)) out.push_back(vocab_.byte_token[c]);
    }
    return Status::ok();
  }
  bool takes_any_bytes() const override { return true; }

 private:
  const Vocabulary& vocab_;
};

}  // namespace

std::unique_ptr<TextEncoder> make_spm_encoder(const Vocabulary& vocab) { return std::make_unique<SpmEncoder>(vocab); }

std::unique_ptr<TextEncoder> make_byte_level_encoder(const Vocabulary& vocab) {
  return std::make_unique<ByteLevelEncoder>(vocab);
}

}  // namespace tandem::model
