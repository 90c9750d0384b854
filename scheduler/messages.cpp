#include "scheduler/messages.h"

namespace tandem::scheduler {

void SeqPlan::clear() {
  seq_id = 0;
  tokens.clear();
  start_pos = 0;
  new_blocks.clear();
  sample = first = logprobs = false;
  sampling = {};
  history.clear();
  tail_blocks.clear();
}

SeqPlan& StepPlan::add_seq() {
  if (spare_.empty()) return seqs.emplace_back();
  seqs.push_back(std::move(spare_.back()));
  spare_.pop_back();
  seqs.back().clear();
  return seqs.back();
}

void StepPlan::clear() {
  step_id = 0;
  release.clear();
  for (SeqPlan& s : seqs) spare_.push_back(std::move(s));
  seqs.clear();
}

}  // namespace tandem::scheduler
