#include "runtime/step_plan.h"

#include "runtime/sampling_proto.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::runtime {
namespace {

template <typename Field, typename T>
void assign(const Field& from, std::vector<T>& to) {
  to.assign(from.begin(), from.end());
}

}  // namespace

void SeqPlan::clear() {
  seq_id = 0;
  tokens.clear();
  start_pos = 0;
  new_blocks.clear();
  sample = first = logprobs = false;
  sampling = {};
  history.clear();
  tail_blocks.clear();
  prompt_len = 0;
  request_id.clear();
  principal.clear();
  speculate = false;
  max_drafts = max_len = keep_blocks = 0;
  ring.clear();
  ring_first = 0;
  restore_checkpoint = save_checkpoint = -1;
}

SeqPlan& StepPlan::add_seq() {
  if (used_ == seqs_.size()) seqs_.emplace_back();
  SeqPlan& s = seqs_[used_++];
  s.clear();
  return s;
}

void StepPlan::clear() {
  step_id = 0;
  release.clear();
  used_ = 0;
}

void to_proto(const StepPlan& plan, v1::StepPlan& out) {
  out.Clear();
  out.set_step_id(plan.step_id);
  for (const SeqPlan& s : plan.seqs()) {
    v1::SeqPlan& o = *out.add_seqs();
    o.set_seq_id(s.seq_id);
    o.mutable_tokens()->Add(s.tokens.begin(), s.tokens.end());
    o.set_start_pos(s.start_pos);
    o.mutable_new_blocks()->Add(s.new_blocks.begin(), s.new_blocks.end());
    o.set_sample(s.sample);
    o.set_speculate(s.speculate);
    o.set_max_drafts(s.max_drafts);
    o.set_max_len(s.max_len);
    o.set_keep_blocks(s.keep_blocks);
    o.mutable_ring_blocks()->Add(s.ring.begin(), s.ring.end());
    o.set_ring_first(s.ring_first);
    o.set_restore_checkpoint(static_cast<uint32_t>(s.restore_checkpoint + 1));
    o.set_save_checkpoint(static_cast<uint32_t>(s.save_checkpoint + 1));
    if (!s.first) continue;
    model::to_proto(s.sampling, o.mutable_sampling());
    o.set_logprobs(s.logprobs);
    o.mutable_history()->Add(s.history.begin(), s.history.end());
    o.mutable_tail_blocks()->Add(s.tail_blocks.begin(), s.tail_blocks.end());
    o.set_prompt_len(s.prompt_len);
    o.set_request_id(s.request_id);
    o.set_principal(s.principal);
  }
  out.mutable_release()->Add(plan.release.begin(), plan.release.end());
}

void from_proto(const v1::StepPlan& plan, StepPlan& out) {
  out.clear();
  out.step_id = plan.step_id();
  for (const v1::SeqPlan& o : plan.seqs()) {
    SeqPlan& s = out.add_seq();
    s.seq_id = o.seq_id();
    assign(o.tokens(), s.tokens);
    s.start_pos = o.start_pos();
    assign(o.new_blocks(), s.new_blocks);
    s.sample = o.sample();
    s.speculate = o.speculate();
    s.max_drafts = o.max_drafts();
    s.max_len = o.max_len();
    s.keep_blocks = o.keep_blocks();
    assign(o.ring_blocks(), s.ring);
    s.ring_first = o.ring_first();
    s.restore_checkpoint = static_cast<int32_t>(o.restore_checkpoint()) - 1;
    s.save_checkpoint = static_cast<int32_t>(o.save_checkpoint()) - 1;
    s.first = o.has_sampling();
    if (!s.first) continue;
    s.sampling = model::from_proto(o.sampling());
    s.logprobs = o.logprobs();
    assign(o.history(), s.history);
    assign(o.tail_blocks(), s.tail_blocks);
    s.prompt_len = o.prompt_len();
    s.request_id = o.request_id();
    s.principal = o.principal();
  }
  assign(plan.release(), out.release);
}

}  // namespace tandem::runtime
