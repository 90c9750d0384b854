// One step for one worker as plain structs (v1::StepPlan and its v1::SeqPlan): the one
// definition both ends use. The scheduler's core emits it and its actor maps it to the wire;
// the worker's actor maps the wire back and its SequenceTable takes it. Fields mean what
// their namesakes in proto/tandem/v1/worker.proto mean; the plan's epoch is the actors'.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/sampling_params.h"

namespace tandem::v1 {
class StepPlan;  // tandem/v1/worker.pb.h: declared only, so the scheduler's core never includes the wire
}  // namespace tandem::v1

namespace tandem::runtime {

// One sequence's part of a step (v1::SeqPlan).
struct SeqPlan {
  uint64_t seq_id = 0;
  std::vector<int32_t> tokens;  // empty: the worker feeds its own last sample (a decode)
  uint32_t start_pos = 0;
  std::vector<int32_t> new_blocks;
  bool sample = false;
  // The sequence's first appearance on the worker: sampling, logprobs, history, tail_blocks,
  // prompt_len, request_id and principal are set (on the wire, sampling is present only then).
  bool first = false;
  model::SamplingParams sampling;
  bool logprobs = false;
  std::vector<int32_t> history, tail_blocks;
  uint32_t prompt_len = 0;
  std::string request_id, principal;  // for the worker's log line only
  // Speculative decoding: a decode round continuing from the worker's own positions (start_pos
  // unused), with up to max_drafts drafts, the sequence never past max_len tokens; keep_blocks
  // > 0 cuts the worker's block table to that many blocks before new_blocks are appended.
  bool speculate = false;
  uint32_t max_drafts = 0, max_len = 0, keep_blocks = 0;
  // Rings (a worker that registered a ring pool): the sequence's whole ring, the windowed
  // layers' blocks of logical blocks ring_first .. (empty without rings).
  std::vector<int32_t> ring;
  uint32_t ring_first = 0;
  // Hybrid state checkpoints (docs/HYBRID.md "Prefix cache"): copy checkpoint restore_checkpoint
  // into the new sequence's slot before the step, and its slot into save_checkpoint after. -1: none.
  int32_t restore_checkpoint = -1, save_checkpoint = -1;
  void clear();  // keeps the vectors' capacity
};

// One step for one worker (v1::StepPlan; its epoch is the actor's).
struct StepPlan {
  uint64_t step_id = 0;
  std::vector<uint64_t> release;
  std::span<const SeqPlan> seqs() const { return {seqs_.data(), used_}; }
  // A cleared entry appended to seqs(), reusing a previous plan's entry in place (its
  // buffers kept): no allocation and no move per sequence per step once warm.
  SeqPlan& add_seq();
  void clear();

 private:
  std::vector<SeqPlan> seqs_;  // [0, used_) are this plan's
  size_t used_ = 0;
};

// The wire form and back (the epoch is left unset and ignored: the actors' own). from_proto
// reuses `out`'s entries (StepPlan::add_seq).
void to_proto(const StepPlan& plan, v1::StepPlan& out);
void from_proto(const v1::StepPlan& plan, StepPlan& out);

}  // namespace tandem::runtime
