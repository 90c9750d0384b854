#include "workers/speculation.h"

#include <algorithm>

namespace tandem::workers {

uint32_t ngram_draft(std::span<const int32_t> history, const NgramConfig& config, std::span<int32_t> out) {
  const size_t len = history.size();
  for (size_t n = std::min<size_t>(config.max_n, len); n >= std::max<uint32_t>(config.min_n, 1); --n) {
    if (len < n + 1) continue;
    const std::span<const int32_t> tail = history.subspan(len - n);
    // The latest earlier occurrence: scan back from the one that ends just before the tail's
    // last token (an occurrence must be followed by at least one token).
    for (size_t start = len - n; start-- > 0;) {
      if (!std::equal(tail.begin(), tail.end(), history.begin() + static_cast<ptrdiff_t>(start))) continue;
      // history followed by the drafts: position from + i is history's or the draft at from + i - len.
      const size_t from = start + n;
      for (size_t i = 0; i < out.size(); ++i) out[i] = from + i < len ? history[from + i] : out[from + i - len];
      return static_cast<uint32_t>(out.size());
    }
  }
  return 0;
}

uint32_t accepted_prefix(std::span<const int32_t> drafts, std::span<const int32_t> samples) {
  uint32_t accepted = 0;
  while (accepted < drafts.size() && accepted < samples.size() && drafts[accepted] == samples[accepted]) ++accepted;
  return accepted;
}

uint32_t draft_budget(uint32_t k, uint32_t remaining_tokens, uint32_t context_room) {
  const uint32_t room = std::min(remaining_tokens, context_room);
  return room == 0 ? 0 : std::min(k, room - 1);
}

void DraftLength::record(uint32_t drafted, uint32_t accepted) {
  if (drafted == 0) {
    ++idle_rounds_;
    return;
  }
  idle_rounds_ = 0;
  if (accepted == drafted)
    k_ = std::min(max_k_, std::max(k_, drafted) + 1);
  else if (accepted == 0)
    k_ /= 2;
  rate_ += kRateWeight * (float(accepted) / float(drafted) - rate_);
  if (rate_ < kMinRate) k_ = 0;
}

}  // namespace tandem::workers
