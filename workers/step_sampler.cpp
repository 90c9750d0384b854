#include "workers/step_sampler.h"

#include <algorithm>

namespace tandem::worker {

StepSampler::StepSampler(uint32_t vocab_size, uint32_t threads)
    : vocab_(vocab_size), p_(size_t{std::max<uint32_t>(threads, 1)} * vocab_size) {
  samplers_.reserve(std::max<uint32_t>(threads, 1));
  for (uint32_t t = 0; t < std::max<uint32_t>(threads, 1); ++t) samplers_.emplace_back(vocab_size);
}

// Row `row` of request i, sampled with exactly the history plain decoding would have there:
// the tokens before its position (the drafts before it included) and nothing else.
RowSample StepSampler::sample_row(uint32_t thread, size_t i, uint32_t row, engine::Engine& engine) {
  const SampleRequest& q = requests_[i];
  if (greedy_[i]) {
    if (row == 0) n_top_[i] = 0;
    return {engine.greedy_token(q.logits_row + row, thread), 0.0f};
  }
  const size_t base = q.history.size() - q.drafts.size();
  const size_t gen_from = q.history.size() - q.generated.size();
  const std::span<const int32_t> history = q.history.first(base + row);
  const size_t from = history.size() > kPenaltyWindow ? history.size() - kPenaltyWindow : 0;
  const std::span<const float> logits = engine.logits(q.logits_row + row);
  if (row < q.drafts.size() && !q.q.empty()) {
    if (row == 0) n_top_[i] = 0;  // a request that asks for top logprobs does not speculate
    return verify_row(thread, q, row, logits, history, from, gen_from);
  }
  const engine::Sample smp = samplers_[thread].sample(
      logits, *q.sampling, history.size(), history.subspan(from), history.subspan(std::min(gen_from, history.size())),
      q.logprobs ? engine::Sampler::Logprob::kReport : engine::Sampler::Logprob::kSkip);
  if (row == 0) {
    n_top_[i] = static_cast<uint32_t>(smp.top.size());
    std::copy(smp.top.begin(), smp.top.end(), tops_.begin() + static_cast<ptrdiff_t>(i * model::kMaxTopLogprobs));
  }
  return {smp.token, smp.logprob};
}

// A draft model's draft at temperature > 0: the target's distribution p at the row (the same
// stages and history as sampling it) against the draft's q, by the rejection rule. A rejected
// row's token never equals its draft (the residual is 0 there), so the round ends at it as at
// any mismatch.
RowSample StepSampler::verify_row(uint32_t thread, const SampleRequest& q, uint32_t row, std::span<const float> logits,
                                  std::span<const int32_t> history, size_t from, size_t gen_from) {
  engine::Sampler& sampler = samplers_[thread];
  const std::span<float> p(p_.data() + size_t{thread} * vocab_, vocab_);
  sampler.distribution(logits, *q.sampling, history.size(), history.subspan(from),
                       history.subspan(std::min(gen_from, history.size())), p);
  const engine::Verdict v = engine::verify_sampled(p, q.q.subspan(size_t{row} * vocab_, vocab_), q.drafts[row],
                                                   q.sampling->seed, history.size());
  return {v.token, q.logprobs ? sampler.last_logprob(logits, v.token) : 0.0f};
}

engine::LogitRows StepSampler::logit_rows(std::span<const SampleRequest> requests, uint32_t threads,
                                          bool head_outweighs_layers, bool screens_greedy) {
  if (screens_greedy) return engine::LogitRows::kNone;
  return requests.size() < 2 * size_t{threads} || !head_outweighs_layers ? engine::LogitRows::kAll
                                                                         : engine::LogitRows::kFirstPerSequence;
}

Status StepSampler::run(std::span<const SampleRequest> requests, engine::Engine& engine, engine::LogitRows computed) {
  requests_ = requests;
  const size_t n = requests.size();
  first_.resize(n);
  kept_.resize(n);
  n_top_.resize(n);
  if (tops_.size() < n * model::kMaxTopLogprobs) tops_.resize(n * model::kMaxTopLogprobs);
  uint32_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    first_[i] = total;
    total += static_cast<uint32_t>(requests[i].drafts.size()) + 1;
  }
  rows_.resize(total);
  greedy_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const SampleRequest& q = requests[i];
    greedy_[i] = computed == engine::LogitRows::kNone && engine.screens_greedy() && q.q.empty() && !q.logprobs &&
                 engine::Sampler::argmax_only(*q.sampling);
  }
  // Few sequences: every row at once (two parallel regions, not two a wave); many: per wave, so
  // no row past a mismatch is screened or computed.
  const bool at_once =
      computed == engine::LogitRows::kAll || (computed == engine::LogitRows::kNone && n < 2 * size_t{engine.threads()});
  if (total > n && at_once) return run_all_rows(engine, total, computed);
  return run_waves(engine, computed);
}

Status StepSampler::prepare_rows(engine::Engine& engine, std::span<const uint32_t> rows_of,
                                 std::span<const uint32_t> owner_of) {
  logit_rows_.clear();
  screen_rows_.clear();
  for (size_t j = 0; j < rows_of.size(); ++j) (greedy_[owner_of[j]] ? screen_rows_ : logit_rows_).push_back(rows_of[j]);
  if (!logit_rows_.empty()) TANDEM_RETURN_IF_ERROR(engine.compute_logit_rows(logit_rows_));
  if (!screen_rows_.empty()) TANDEM_RETURN_IF_ERROR(engine.screen_rows(screen_rows_));
  return Status::ok();
}

// Every row at once (computed up front, or prepared here), then each round's accepted prefix.
Status StepSampler::run_all_rows(engine::Engine& engine, uint32_t total, engine::LogitRows computed) {
  const size_t n = requests_.size();
  owner_.resize(total);
  for (size_t i = 0; i < n; ++i)
    std::fill_n(owner_.begin() + first_[i], requests_[i].drafts.size() + 1, static_cast<uint32_t>(i));
  if (computed == engine::LogitRows::kNone) {
    all_rows_.resize(total);
    for (uint32_t r = 0; r < total; ++r) all_rows_[r] = requests_[owner_[r]].logits_row + (r - first_[owner_[r]]);
    TANDEM_RETURN_IF_ERROR(prepare_rows(engine, all_rows_, owner_));
  }
  engine.parallel_for(total, [&](uint32_t b, uint32_t e, uint32_t t) {
    for (uint32_t r = b; r < e; ++r) rows_[r] = sample_row(t, owner_[r], r - first_[owner_[r]], engine);
  });
  for (size_t i = 0; i < n; ++i) {
    const std::span<const int32_t> drafts = requests_[i].drafts;
    uint32_t row = 0;
    while (row < drafts.size() && rows_[first_[i] + row].token == drafts[row]) ++row;
    kept_[i] = row + 1;
  }
  return Status::ok();
}

// Wave j: row j of every request still in its round (its rows so far equal its drafts), its
// logits computed (or its greedy token screened) first unless the forward pass did.
Status StepSampler::run_waves(engine::Engine& engine, engine::LogitRows computed) {
  alive_.resize(requests_.size());
  for (uint32_t i = 0; i < alive_.size(); ++i) alive_[i] = i;
  for (uint32_t wave = 0; !alive_.empty(); ++wave) {
    if (computed == engine::LogitRows::kNone || (wave > 0 && computed == engine::LogitRows::kFirstPerSequence)) {
      wave_rows_.resize(alive_.size());
      for (size_t j = 0; j < alive_.size(); ++j) wave_rows_[j] = requests_[alive_[j]].logits_row + wave;
      TANDEM_RETURN_IF_ERROR(computed == engine::LogitRows::kNone ? prepare_rows(engine, wave_rows_, alive_)
                                                                  : engine.compute_logit_rows(wave_rows_));
    }
    engine.parallel_for(static_cast<uint32_t>(alive_.size()), [&](uint32_t b, uint32_t e, uint32_t t) {
      for (uint32_t j = b; j < e; ++j) rows_[first_[alive_[j]] + wave] = sample_row(t, alive_[j], wave, engine);
    });
    size_t still = 0;
    for (uint32_t i : alive_) {
      const std::span<const int32_t> drafts = requests_[i].drafts;
      if (wave < drafts.size() && rows_[first_[i] + wave].token == drafts[wave])
        alive_[still++] = i;
      else
        kept_[i] = wave + 1;
    }
    alive_.resize(still);
  }
  return Status::ok();
}

}  // namespace tandem::worker
