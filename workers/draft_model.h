// Speculative decoding from a draft model (`--spec draft --draft-model FILE`, #19 Part B): a
// smaller model of the same vocabulary, loaded beside the target, proposes each round's drafts.
// Its KV lives in a pool of its own with the target pool's block count, indexed by the same
// block ids: block b's target layers are in the target pool and its draft layers here, so the
// scheduler's one block (its accounting, prefix cache, preemption, cancellation, trim) covers
// both, and the worker's memory budget counts both per block. The draft pool is F32 (no tails):
// a rollback of rejected drafts is exact without a window.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/status.h"
#include "workers/engine/engine.h"
#include "workers/engine/generate.h"
#include "workers/engine/sampler.h"
#include "workers/speculation.h"

namespace tandem::workers {

// One sequence's drafts for a round (k 0: a prompt chunk the draft only reads): tokens [0, at] are known (the last one
// is the sample the round feeds, at position at = tokens.size() - out.size() - 1); `out`, the tail of `tokens`,
// receives the drafts for positions at + 1 ... The draft KV of positions [0, *draft_pos) is
// valid (tokens as they are now); the run catches up from there and advances it.
struct DraftJob {
  std::span<int32_t> tokens;
  uint32_t k = 0;                   // drafts: out is tokens.last(k)
  std::span<const int32_t> blocks;  // covers every position written: at + out.size() - 1 at most
  uint32_t* draft_pos = nullptr;
  const model::SamplingParams* sampling = nullptr;
  uint32_t prompt_len = 0;  // tokens[prompt_len:] were generated (presence / frequency penalties)
  // Temperature > 0: out.size() rows of vocab_size floats, each draft's distribution q (the
  // rejection rule needs it). Empty: greedy drafts (verified by equality).
  std::span<float> q;
};

// Whether `draft_path` may draft for `model_path`: their vocabularies (GGUF metadata only)
// have the same size and token texts; refused naming the file and the first difference.
Status check_draft_model_file(const std::string& model_path, const std::string& draft_path);

class DraftModel {
 public:
  // Loads `path` and checks its vocabulary against the target's: refused, naming the file and
  // the difference, when the size or any token's text differs.
  static Result<std::unique_ptr<DraftModel>> load(const std::string& path, const engine::EngineOptions& options,
                                                  const engine::Engine& target);
  // Bytes one block's draft layers take (F32).
  size_t block_bytes(uint32_t block_tokens) const;
  size_t weight_bytes() const { return engine_->weight_bytes_per_step(); }
  // The draft pool: `n_blocks` blocks, the target pool's ids.
  Status make_pool(uint32_t n_blocks, uint32_t block_tokens);

  // Every job's drafts, batched: one forward that catches each sequence up to its last sample
  // and gives its first draft, then one per further draft (a job with fewer drafts drops out;
  // one with none only catches up). Draft i is greedy on the draft's logits (penalties applied
  // as the target's sampler does) or, with q, drawn from them on kDraftStream. Sets *draft_pos
  // to the positions written (at + k; tokens.size() without drafts): the caller lowers it to
  // the positions it keeps. Allocates only to grow its scratch.
  Status draft(std::span<const DraftJob> jobs, uint32_t penalty_window);

  const engine::Engine& engine() const { return *engine_; }
  // Engine::set_between_layers for the draft's forwards (a worker heartbeats through a long
  // catch-up too).
  void set_between_layers(std::function<void()> hook) { engine_->set_between_layers(std::move(hook)); }

 private:
  explicit DraftModel(std::unique_ptr<engine::Engine> engine);
  // Draft r of `job` from logits row `row` of the last forward, into its tokens (and q).
  void sample_row(const DraftJob& job, uint32_t row, uint32_t r, uint32_t penalty_window);

  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<engine::KvPool> pool_;
  engine::Sampler sampler_;
  std::vector<engine::SeqStep> steps_;
  std::vector<uint32_t> job_of_;  // steps_[j]'s job
};

// A draft model as one sequence's drafter for engine::generate (`tandem run --spec draft`):
// its own block table over a pool of `context` positions, its draft length adaptive as on a
// worker. No draft past the draft model's own context length (the worker's SequenceTable
// bounds its rounds the same way).
class ModelDrafter final : public engine::Drafter {
 public:
  ModelDrafter(DraftModel& model, uint32_t max_k, uint32_t context);
  uint32_t draft(std::span<const int32_t> history, std::span<int32_t> out) override;
  void record(uint32_t drafted, uint32_t accepted) override;
  std::span<const float> q(uint32_t i) const override;
  void set_sampling(const model::SamplingParams* sampling, uint32_t prompt_len) {
    sampling_ = sampling;
    prompt_len_ = prompt_len;
  }

 private:
  DraftModel& model_;
  uint32_t max_k_;
  DraftLength length_;  // adaptive, as a worker's sequence
  std::vector<int32_t> blocks_, tokens_;
  std::vector<float> q_;
  uint32_t draft_pos_ = 0, at_ = 0;  // valid draft KV; where the last round's sample was fed
  const model::SamplingParams* sampling_ = nullptr;
  uint32_t prompt_len_ = 0;
};

}  // namespace tandem::workers
