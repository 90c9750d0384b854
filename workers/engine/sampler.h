// Token sampling: a pure function of (logits, params, seed, position, the sequence's tokens).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/sampling_params.h"
#include "runtime/status.h"
#include "workers/engine/kernels.h"

namespace tandem::engine {

using model::kMaxTopLogprobs;
using model::SamplingParams;
using model::validate;

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct Sample {
  int32_t token = 0;
  // log-softmax of the raw logits (before penalty, temperature and truncation), as vLLM
  // reports by default; 0 when the caller did not ask for it (Logprob::kSkip).
  float logprob = 0.0f;
  std::span<const TokenLogprob> top;  // top_logprobs best by raw logprob; valid until next sample()
};

// Reusable sampler for one vocabulary size; holds its scratch so sample() does not
// allocate. Not thread-safe: one per thread.
class Sampler {
 public:
  // Whether sample() reports the chosen token's logprob. Skipping it saves a pass of exp()
  // over the vocabulary at temperature 0 (the top logprobs are reported either way).
  enum class Logprob : bool { kSkip = false, kReport = true };

  explicit Sampler(uint32_t vocab_size);

  // Whether sample() with these parameters, reporting nothing, is the argmax of the raw logits
  // whatever the history (greedy, no logit_bias, no penalty, no top logprobs): then the token
  // needs no logits, only their argmax (Engine::greedy_token). The history-free form of run()'s
  // greedy shortcut (sampler.cpp, Stages::reshapes): a stage added there belongs here too.
  static bool argmax_only(const SamplingParams& p) {
    return p.temperature <= 0.0f && p.top_logprobs == 0 && p.logit_bias.empty() && p.repetition_penalty == 1.0f &&
           p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f;
  }

  // `position` is the index in the sequence of the token being sampled; the uniform
  // draw is derived only from (seed, position), so any worker reproduces it.
  // `history` are the tokens the repetition penalty applies to (caller picks the window;
  // each distinct token is penalized once). `generated` are the tokens this sequence
  // generated before `position`, prompt excluded: the presence and frequency penalties count
  // them. Both are the caller's, so the result depends only on the arguments (speculative
  // verification of position p passes the generated tokens before p). Ids outside the
  // vocabulary are ignored everywhere, logit_bias's included.
  // `logits` must hold vocab_size entries. Stages, in order: sanitize, logit_bias,
  // repetition penalty, presence / frequency penalties, temperature, top-k, top-p, min-p,
  // the draw; the kept tokens are walked in descending probability (ties by lower id).
  // NaN logits count as -inf; if every logit is -inf/NaN the result is token 0 with
  // logprob -inf. See sampler.cpp. Does not allocate.
  Sample sample(std::span<const float> logits, const SamplingParams& params, uint64_t position,
                std::span<const int32_t> history = {}, std::span<const int32_t> generated = {},
                Logprob logprob = Logprob::kReport);

  // The distribution sample() draws from, for speculative sampling's rejection rule: `probs`
  // (vocab_size entries) gets each token's probability after every stage (top-k, top-p and
  // min-p included; 0 outside the kept tokens; summing to 1 up to rounding). At temperature 0,
  // or when nothing is possible, all of it is on the token sample() would return. Returns what
  // sample() returns for the same arguments. Does not allocate.
  Sample distribution(std::span<const float> logits, const SamplingParams& params, uint64_t position,
                      std::span<const int32_t> history, std::span<const int32_t> generated, std::span<float> probs);
  // The raw logprob (as Sample::logprob) of `token` under the logits of the last
  // distribution() call (or sample() with Logprob::kReport), which must be `logits`.
  float last_logprob(std::span<const float> logits, int32_t token) const;

 private:
  Sample nothing_possible(uint32_t n, int32_t n_top);
  Sample report(std::span<const float> logits, uint32_t token, bool inf_mode, double log_norm, int32_t n_found);
  Sample run(std::span<const float> logits, const SamplingParams& params, uint64_t position,
             std::span<const int32_t> history, std::span<const int32_t> generated, Logprob logprob,
             std::span<float> probs);

  uint32_t vocab_;
  const kernels::Kernels* kernels_;  // argmax: greedy sampling that reports nothing else
  std::vector<float> probs_;         // sanitized -> penalized logits -> sampling weights
  std::vector<int32_t> order_;       // candidate ids (top-k buffer, then descending order)
  std::vector<uint32_t> sort_keys_;  // the radix sort's keys: two arrays of vocab_size
  std::vector<int32_t> sort_ids_;    // and its second id array
  std::vector<uint8_t> seen_;        // repetition penalty dedup flags, all 0 between calls
  std::vector<uint32_t> counts_;     // presence / frequency occurrence counts, all 0 between calls
  std::vector<TokenLogprob> top_;    // kMaxTopLogprobs entries; Sample::top points here
  double last_log_norm_ = 0.0;       // the last call's log-softmax normalizer (last_logprob)
  bool last_inf_mode_ = false;
};

// The uniform draw in [0, 1) for (seed, position): a counter-based hash (splitmix64).
double uniform_draw(uint64_t seed, uint64_t position);

// Speculative sampling's rule for a draft model at temperature > 0 (Leviathan et al. 2023,
// Chen et al. 2023): draft `draft` at `position`, drawn from the draft model's distribution
// `q`, is accepted with probability min(1, p[draft] / q[draft]) under the target's
// distribution `p` (both as Sampler::distribution gives them: penalties and logit_bias are in
// p exactly as plain decoding applies them); rejected, the position's token is drawn from
// normalize(max(0, p - q)) instead. The emitted token is then distributed exactly as p. Each
// uniform is a pure function of (seed, position) on a stream of its own (kAcceptStream,
// kResidualStream; the draft model draws on kDraftStream), independent of the target's own
// draw at a position, so a round is reproducible. No allocation.
inline constexpr uint64_t kDraftStream = uint64_t{1} << 40;
inline constexpr uint64_t kAcceptStream = uint64_t{2} << 40;
inline constexpr uint64_t kResidualStream = uint64_t{3} << 40;
struct Verdict {
  bool accepted = false;
  int32_t token = 0;  // the draft when accepted, else the residual's draw
};
Verdict verify_sampled(std::span<const float> p, std::span<const float> q, int32_t draft, uint64_t seed,
                       uint64_t position);

}  // namespace tandem::engine
