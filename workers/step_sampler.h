// Samples a step's rows on the engine's compute threads. After the forward pass the pool's
// threads would otherwise spin while one thread samples every row (a pass or two over the
// vocabulary per row: a quarter of a decode step on a 32k vocabulary). Each thread has its own
// Sampler; the sampler is a pure function of (logits, parameters, seed, position, history), so
// which thread samples a row changes nothing in the result.
//
// A speculating sequence's rows are verified in order: row i's sample is taken with the drafts
// before it as its history, and the round ends at the first sample that differs from the draft
// fed after it (with a draft model's q at temperature > 0: the rejection rule's token, which
// equals the draft only when it accepts it). With few sequences (fewer than two per thread), or a model whose output
// matrix costs a row less than its layers do, every row's logits are computed in the forward pass and every row is
// sampled at once, in parallel; the rows past the first mismatch are dropped. Otherwise the rows go in waves: wave j
// samples row j of every sequence still in its round, and its logits are computed only then (forward with
// LogitRows::kFirstPerSequence, then Engine::compute_logit_rows per wave), so no row past a mismatch is sampled or
// even goes through the output matrix: a speculating step then pays the head for the tokens it emits only, at two
// parallel regions a wave.
//
// Where the engine has a greedy screen (Engine::screens_greedy: a head that outweighs the layers)
// the forward pass computes no logits (LogitRows::kNone): a greedy request's rows
// (Sampler::argmax_only, no logprobs, no draft-model q) are screened for their exact greedy token
// (Engine::screen_rows, greedy_token) and only the others' logits are computed, in the same waves
// (or at once with few sequences).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "workers/engine/engine.h"
#include "workers/engine/sampler.h"
#include "workers/sequence_table.h"

namespace tandem::worker {

inline constexpr uint32_t kPenaltyWindow = 64;  // tokens the repetition penalty looks back on, as tandem run

// One sampled row: its token and (if the request asked) its raw logprob.
struct RowSample {
  int32_t token = 0;
  float logprob = 0.0f;
};

class StepSampler {
 public:
  StepSampler(uint32_t vocab_size, uint32_t threads);

  // Which logit rows the forward pass of a step with these requests computes up front: none
  // with a greedy screen (run screens or computes each row as it needs it); else all of them with
  // few sequences or a head that costs less than the layers (engine::head_outweighs_layers), else
  // each sequence's first (run computes the others per wave).
  static engine::LogitRows logit_rows(std::span<const SampleRequest> requests, uint32_t threads,
                                      bool head_outweighs_layers, bool screens_greedy = false);

  // Samples every request of the staged step from `engine`'s logits, its forward pass having
  // computed `computed` (logit_rows()). Allocates only when a step is larger than any before it.
  // An error: the engine refused a wave's rows (the step fails).
  Status run(std::span<const SampleRequest> requests, engine::Engine& engine,
             engine::LogitRows computed = engine::LogitRows::kAll);

  // Request i's samples: its accepted drafts' rows, then the correction (or the token after
  // the last draft). size() - 1 drafts were accepted.
  std::span<const RowSample> samples(size_t i) const { return {rows_.data() + first_[i], kept_[i]}; }
  // Request i's top logprobs (of its first row only: requests that ask do not speculate).
  std::span<const engine::TokenLogprob> top(size_t i) const {
    return {tops_.data() + i * model::kMaxTopLogprobs, n_top_[i]};
  }

 private:
  Status run_all_rows(engine::Engine& engine, uint32_t total, engine::LogitRows computed);
  Status run_waves(engine::Engine& engine, engine::LogitRows computed);
  // With LogitRows::kNone: screens rows_of's greedy rows and computes the others' logits. rows_of
  // holds logit rows, owner_of their requests.
  Status prepare_rows(engine::Engine& engine, std::span<const uint32_t> rows_of, std::span<const uint32_t> owner_of);
  RowSample sample_row(uint32_t thread, size_t i, uint32_t row, engine::Engine& engine);
  RowSample verify_row(uint32_t thread, const SampleRequest& q, uint32_t row, std::span<const float> logits,
                       std::span<const int32_t> history, size_t from, size_t gen_from);

  uint32_t vocab_;
  std::vector<float> p_;                   // per compute thread: the target's distribution (verify_row)
  std::vector<engine::Sampler> samplers_;  // one per compute thread
  std::span<const SampleRequest> requests_;
  std::vector<RowSample> rows_;              // every request's rows, request i's from first_[i]
  std::vector<uint32_t> first_, kept_;       // per request: first row, rows kept
  std::vector<uint32_t> owner_;              // per row: its request
  std::vector<uint32_t> alive_, wave_rows_;  // run_waves: requests still in their round, their next rows
  std::vector<uint8_t> greedy_;              // per request: its rows go through the greedy screen
  std::vector<uint32_t> logit_rows_, screen_rows_, all_rows_;  // prepare_rows, run_all_rows
  std::vector<engine::TokenLogprob> tops_;                     // per request: kMaxTopLogprobs slots
  std::vector<uint32_t> n_top_;
};

}  // namespace tandem::worker
