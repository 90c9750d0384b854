#include "model/pretokenizer.h"

#include <unicode/regex.h>
#include <unicode/utext.h>

#include <algorithm>
#include <initializer_list>

namespace tandem::model {

namespace {

// The regexes of each tokenizer.ggml.pre value, as Hugging Face's tokenizer.json files have
// them (llama.cpp's src/llama-vocab.cpp lists the same; where llama.cpp rewrote (?i:...) for
// std::regex, the original is kept: ICU has case-insensitive groups).
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen35 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek LLM's letters: the Latin, Greek, Cyrillic, ... ranges its tokenizer.json lists
// (left unformatted: clang-format-14 re-splits this UTF-8 literal on every run).
// clang-format off
constexpr const char* kDeepseekLetters =
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ"
    "-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐ"
    "ῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯ"
    "ꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
// clang-format on
constexpr const char* kCjkHangul = "[一-龥ࠀ-一가-퟿]+";

struct Entry {
  std::initializer_list<const char*> names;
  std::initializer_list<const char*> patterns;
  bool ignore_merges = false;
};

const Entry kTable[] = {
    {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", R"([0-9][0-9][0-9])"}},
    {{"gpt-2", "mpt"}, {kGpt2}},
    {{"starcoder", "refact", "command-r"}, {R"(\p{N})", kGpt2}},
    {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, R"([0-9][0-9][0-9])"}},
    {{"llama-bpe", "llama3", "llama-v3"}, {kLlama3}, true},
    {{"qwen2", "deepseek-r1-qwen"}, {kQwen2}},
    {{"qwen35"}, {kQwen35}},
    {{"deepseek-llm"},
     {R"([\r\n])", kDeepseekLetters, "\\s?[!-/:-~！-／：-～‘-‟　-。]+", R"(\s+$)", kCjkHangul, R"(\p{N}+)"}},
    {{"deepseek-coder"}, {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjkHangul, R"(\p{N})"}},
    // Gemma 4 merges over whole lines (spaces are U+2581 by then); only newlines split.
    {{"gemma4"}, {R"([^\n]+|[\n]+)"}},
};

// \s and \S as Unicode's White_Space (Hugging Face's regex engines include U+000B and U+0085,
// ICU's \s does not).
std::string with_unicode_whitespace(const char* pattern) {
  std::string out;
  for (const char* p = pattern; *p; ++p) {
    if (p[0] == '\\' && (p[1] == 's' || p[1] == 'S')) {
      out += p[1] == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
      ++p;
    } else if (p[0] == '\\' && p[1]) {
      out += p[0];
      out += *++p;
    } else {
      out += *p;
    }
  }
  return out;
}

// ICU's backtracking memory per match: a word of a few MB of letters needs about this much.
constexpr int32_t kBacktrackBytes = 256 << 20;

}  // namespace

struct PreTokenizer::Compiled {
  std::vector<std::unique_ptr<icu::RegexPattern>> patterns;
};

Result<PreTokenizer> PreTokenizer::compile(const std::vector<std::string>& patterns) {
  auto compiled = std::make_shared<Compiled>();
  for (const std::string& pattern : patterns) {
    UErrorCode status = U_ZERO_ERROR;
    UParseError where{};
    const std::string icu_pattern = with_unicode_whitespace(pattern.c_str());
    std::unique_ptr<icu::RegexPattern> p(
        icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(icu_pattern), where, status));
    if (U_FAILURE(status)) {
      return Status::invalid("pre-tokenizer regex '" + pattern + "' does not compile (" + u_errorName(status) +
                             " at offset " + std::to_string(where.offset) + ")");
    }
    compiled->patterns.push_back(std::move(p));
  }
  PreTokenizer pre;
  pre.compiled_ = std::move(compiled);
  return pre;
}

std::string pre_name_of_patterns(const std::vector<std::string>& patterns) {
  for (const Entry& e : kTable) {
    if (std::equal(patterns.begin(), patterns.end(), e.patterns.begin(), e.patterns.end())) return *e.names.begin();
  }
  return "";
}

const char* gpt2_pattern() { return kGpt2; }

Result<PreTokenizer> PreTokenizer::for_name(const std::string& pre) {
  for (const Entry& e : kTable) {
    for (const char* name : e.names) {
      if (pre != name) continue;
      auto p = compile(std::vector<std::string>(e.patterns.begin(), e.patterns.end()));
      if (!p) return p.status();
      p->ignore_merges_ = e.ignore_merges;
      return p;
    }
  }
  return Status::invalid("pre-tokenizer '" + pre + "' (tokenizer.ggml.pre) is not supported");
}

Status PreTokenizer::split(std::string_view text, std::span<const Span> segments, std::vector<Span>& out) const {
  std::vector<Span> cur, next;
  for (const Span& s : segments)
    if (s.end > s.begin) cur.push_back(s);
  if (!compiled_ || compiled_->patterns.empty() || cur.empty()) {
    out.insert(out.end(), cur.begin(), cur.end());
    return Status::ok();
  }
  UErrorCode status = U_ZERO_ERROR;
  UText* ut = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status);
  for (const auto& pattern : compiled_->patterns) {
    std::unique_ptr<icu::RegexMatcher> m(pattern->matcher(status));
    if (U_FAILURE(status)) break;
    m->setStackLimit(kBacktrackBytes, status);
    m->reset(ut);
    next.clear();
    for (const Span& s : cur) {
      m->region(s.begin, s.end, status);
      uint32_t at = s.begin;
      while (m->find(status) && U_SUCCESS(status)) {
        const auto b = static_cast<uint32_t>(m->start64(status)), e = static_cast<uint32_t>(m->end64(status));
        if (e == b) continue;
        if (b > at) next.push_back(Span{at, b});
        next.push_back(Span{b, e});
        at = e;
      }
      if (at < s.end) next.push_back(Span{at, s.end});
    }
    if (U_FAILURE(status)) break;
    cur.swap(next);
  }
  utext_close(ut);
  if (U_FAILURE(status)) {
    return Status::invalid(std::string("text could not be split into words (") + u_errorName(status) + ")");
  }
  out.insert(out.end(), cur.begin(), cur.end());
  return Status::ok();
}

}  // namespace tandem::model
