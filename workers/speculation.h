// Speculative decoding's pure parts on the worker (#19 Part B): prompt-lookup (n-gram) drafts
// from a sequence's own tokens, how many of them the target accepts, and how long the next
// round's drafts may be. Each is a function of the sequence's own history only, never of its
// batch, so a sequence's output does not depend on what it was batched with. No allocation.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "workers/engine/generate.h"

namespace tandem::workers {

struct NgramConfig {
  uint32_t max_n = 3;  // the longest suffix looked up
  uint32_t min_n = 2;  // the shortest (1 matches too often on text that does not repeat)
  uint32_t max_k = 4;  // drafts per round at most
};

// Prompt lookup (llama.cpp's lookup decoding, vLLM's `ngram` proposer): for n from max_n down
// to min_n, the latest earlier occurrence of the last n tokens of `history` (prompt and
// generated tokens); the drafts are the tokens that followed it, at most out.size(), and where
// they reach the end of the history they go on as the drafts so far (a loop of period p shorter
// than out.size() fills all of it, not p). Returns how many were written (0: no occurrence, or
// history shorter than min_n + 1).
uint32_t ngram_draft(std::span<const int32_t> history, const NgramConfig& config, std::span<int32_t> out);

// Greedy-exact verification: the target sampled `samples[i]` at the position where draft i
// stands (samples holds one more, the sample after the last draft). The drafts accepted are the
// longest prefix equal to the samples; the round then emits samples[0..accepted], which is
// exactly what decoding without speculation would have produced, at any temperature, because
// the sampler is a pure function of (logits, params, seed, position).
uint32_t accepted_prefix(std::span<const int32_t> drafts, std::span<const int32_t> samples);

// How many drafts a round may carry: k, shrunk so that the accepted drafts plus the one
// correction never pass the request's remaining tokens nor the context.
uint32_t draft_budget(uint32_t k, uint32_t remaining_tokens, uint32_t context_room);

// The draft length of a sequence's next round, from its own past rounds: all accepted grows
// it by one (up to max_k), none accepted halves it, a partial acceptance keeps it; and whatever
// the last round, a sequence whose recent acceptance (an average of accepted / drafted over its
// rounds, each weighing kRateWeight) is under kMinRate stops drafting: its partial rounds cost
// more verified rows than they save steps (random output on a small vocabulary matches a 2-gram
// now and then, and accepts one draft in five). At 0 the sequence decodes plainly and probes
// again with one draft every kProbeEvery rounds, so on output that does not repeat speculation
// turns itself off and costs almost nothing.
class DraftLength {
 public:
  static constexpr uint32_t kProbeEvery = 16;
  static constexpr float kMinRate = 0.3f;
  static constexpr float kRateWeight = 0.25f;
  explicit DraftLength(uint32_t max_k) : max_k_(max_k), k_(max_k) {}
  // The drafts the next round asks for.
  uint32_t next() const { return k_ > 0 ? k_ : (idle_rounds_ + 1 >= kProbeEvery ? 1u : 0u); }
  // A round that carried `drafted` drafts accepted `accepted` of them.
  void record(uint32_t drafted, uint32_t accepted);

 private:
  uint32_t max_k_, k_;
  uint32_t idle_rounds_ = 0;  // rounds at k = 0 since the last probe
  float rate_ = 1.0f;         // recent accepted / drafted (a fresh sequence is given the benefit)
};

// Prompt lookup with an adaptive length, as one sequence's drafter for engine::generate
// (`tandem run --spec ngram`).
class NgramDrafter final : public engine::Drafter {
 public:
  explicit NgramDrafter(uint32_t max_k) : config_{.max_k = max_k}, length_(max_k) {}
  uint32_t draft(std::span<const int32_t> history, std::span<int32_t> out) override {
    return ngram_draft(history, config_, out.first(std::min<size_t>(out.size(), length_.next())));
  }
  void record(uint32_t drafted, uint32_t accepted) override { length_.record(drafted, accepted); }

 private:
  NgramConfig config_;
  DraftLength length_;
};

}  // namespace tandem::workers
