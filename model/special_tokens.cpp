#include "model/special_tokens.h"

#include <algorithm>
#include <cctype>
#include <map>

namespace tandem::model {

namespace {

size_t two_bytes(std::string_view s, size_t i) {
  return static_cast<size_t>(static_cast<unsigned char>(s[i])) << 8 | static_cast<unsigned char>(s[i + 1]);
}

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// Claimed stretches of the text: a special token with the whitespace it strips.
struct Claim {
  uint32_t end;  // of the stretch
  int32_t token;
};

bool overlaps(const std::map<uint32_t, Claim>& claims, uint32_t begin, uint32_t end) {
  auto it = claims.lower_bound(begin);
  if (it != claims.end() && it->first < end) return true;
  return it != claims.begin() && std::prev(it)->second.end > begin;
}

}  // namespace

SpecialTokenSplitter::SpecialTokenSplitter(const Vocabulary& vocab) {
  for (size_t i = 0; i < vocab.size(); ++i) {
    if ((vocab.attrs[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) && !vocab.pieces[i].empty()) {
      by_length_.push_back(static_cast<int32_t>(i));
    }
  }
  std::stable_sort(by_length_.begin(), by_length_.end(),
                   [&](int32_t a, int32_t b) { return vocab.pieces[a].size() > vocab.pieces[b].size(); });
  by_first_byte_.resize(256);
  by_two_bytes_.resize(by_length_.empty() ? 0 : 65536);
  for (size_t rank = 0; rank < by_length_.size(); ++rank) {
    const std::string& p = vocab.pieces[by_length_[rank]];
    if (p.size() == 1) {
      by_first_byte_[static_cast<unsigned char>(p[0])].push_back(static_cast<int32_t>(rank));
    } else {
      by_two_bytes_[two_bytes(p, 0)].push_back(static_cast<int32_t>(rank));
    }
  }
}

void SpecialTokenSplitter::split(const Vocabulary& vocab, std::string_view text, bool parse_special,
                                 std::vector<Fragment>& out) const {
  // Every occurrence of every eligible token, as (rank, position).
  std::vector<std::pair<int32_t, uint32_t>> found;
  auto look = [&](const std::vector<int32_t>& ranks, size_t i) {
    for (int32_t rank : ranks) {
      const int32_t id = by_length_[rank];
      if (!parse_special && (vocab.attrs[id] & (kAttrControl | kAttrUnknown))) continue;
      if (text.compare(i, vocab.pieces[id].size(), vocab.pieces[id]) == 0) found.emplace_back(rank, i);
    }
  };
  if (!by_length_.empty()) {
    for (size_t i = 0; i < text.size(); ++i) {
      look(by_first_byte_[static_cast<unsigned char>(text[i])], i);
      if (i + 1 < text.size()) look(by_two_bytes_[two_bytes(text, i)], i);
    }
  }
  std::sort(found.begin(), found.end());
  std::map<uint32_t, Claim> claims;
  for (auto [rank, pos] : found) {
    const int32_t id = by_length_[rank];
    uint32_t begin = pos, end = pos + static_cast<uint32_t>(vocab.pieces[id].size());
    if (overlaps(claims, begin, end)) continue;
    if (vocab.attrs[id] & kAttrLstrip) {
      while (begin > 0 && is_space(text[begin - 1]) && !overlaps(claims, begin - 1, begin)) --begin;
    }
    if (vocab.attrs[id] & kAttrRstrip) {
      while (end < text.size() && is_space(text[end]) && !overlaps(claims, end, end + 1)) ++end;
    }
    claims.emplace(begin, Claim{end, id});
  }
  uint32_t at = 0;
  for (const auto& [begin, claim] : claims) {
    if (begin > at) out.push_back(Fragment{Vocabulary::kNone, at, begin});
    out.push_back(Fragment{claim.token, begin, claim.end});
    at = claim.end;
  }
  if (at < text.size()) out.push_back(Fragment{Vocabulary::kNone, at, static_cast<uint32_t>(text.size())});
}

}  // namespace tandem::model
