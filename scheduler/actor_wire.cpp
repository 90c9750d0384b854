#include "scheduler/actor_wire.h"

#include "runtime/sampling_proto.h"

namespace tandem::scheduler {
namespace {

template <typename Field, typename T>
void assign(const Field& from, std::vector<T>& to) {
  to.assign(from.begin(), from.end());
}

}  // namespace

void to_proto(const StepPlan& plan, v1::StepPlan& out) {
  out.Clear();
  out.set_step_id(plan.step_id);
  for (const SeqPlan& s : plan.seqs) {
    v1::SeqPlan& o = *out.add_seqs();
    o.set_seq_id(s.seq_id);
    o.mutable_tokens()->Add(s.tokens.begin(), s.tokens.end());
    o.set_start_pos(s.start_pos);
    o.mutable_new_blocks()->Add(s.new_blocks.begin(), s.new_blocks.end());
    o.set_sample(s.sample);
    if (!s.first) continue;
    model::to_proto(s.sampling, o.mutable_sampling());
    o.set_logprobs(s.logprobs);
    o.mutable_history()->Add(s.history.begin(), s.history.end());
    o.mutable_tail_blocks()->Add(s.tail_blocks.begin(), s.tail_blocks.end());
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
    s.first = o.has_sampling();
    if (!s.first) continue;
    s.sampling = model::from_proto(o.sampling());
    s.logprobs = o.logprobs();
    assign(o.history(), s.history);
    assign(o.tail_blocks(), s.tail_blocks);
  }
  assign(plan.release(), out.release);
}

void to_proto(const Command& command, v1::SchedulerCommand& out) {
  out.clear_body();
  if (const KvExpect* e = std::get_if<KvExpect>(&command)) {
    v1::KvExpect& o = *out.mutable_kv_expect();
    o.set_transfer_id(e->transfer_id);
    o.set_seq_id(e->seq_id);
    o.mutable_blocks()->Add(e->blocks.begin(), e->blocks.end());
    o.mutable_tail_blocks()->Add(e->tail_blocks.begin(), e->tail_blocks.end());
    o.set_nonce(e->nonce);
    o.set_positions(e->positions);
    o.set_sender_public_key(e->sender_public_key);
    o.set_scheduler_epoch(e->scheduler_epoch);
    return;
  }
  const KvSend& k = std::get<KvSend>(command);
  v1::KvSend& o = *out.mutable_kv_send();
  o.set_transfer_id(k.transfer_id);
  o.set_seq_id(k.seq_id);
  o.set_dest_seq_id(k.dest_seq_id);
  o.set_dest_endpoint(k.dest_endpoint);
  o.set_positions(k.positions);
  o.set_dest_public_key(k.dest_public_key);
  o.set_nonce(k.nonce);
  o.set_scheduler_epoch(k.scheduler_epoch);
}

bool from_proto(const v1::SchedulerCommand& command, Command& out) {
  if (command.has_kv_expect()) {
    const v1::KvExpect& o = command.kv_expect();
    KvExpect e{o.transfer_id(), o.seq_id(),           o.nonce(), o.scheduler_epoch(), {}, {},
               o.positions(),   o.sender_public_key()};
    assign(o.blocks(), e.blocks);
    assign(o.tail_blocks(), e.tail_blocks);
    out = std::move(e);
    return true;
  }
  if (!command.has_kv_send()) return false;
  const v1::KvSend& o = command.kv_send();
  out = KvSend{o.transfer_id(),     o.seq_id(),        o.dest_seq_id(),     o.nonce(),
               o.scheduler_epoch(), o.dest_endpoint(), o.dest_public_key(), o.positions()};
  return true;
}

void to_proto(const StepResult& result, v1::StepResult& out) {
  out.Clear();
  out.set_step_id(result.step_id);
  for (const SeqResult& s : result.seqs) {
    v1::SeqResult& o = *out.add_seqs();
    o.set_seq_id(s.seq_id);
    o.set_token(s.token);
    o.set_logprob(s.logprob);
    o.mutable_top_ids()->Add(s.top_ids.begin(), s.top_ids.end());
    o.mutable_top_logprobs()->Add(s.top_logprobs.begin(), s.top_logprobs.end());
  }
  out.set_error_code(result.error_code);
  out.set_error_message(result.error_message);
  out.set_compute_us(result.compute_us);
  out.set_idle_us(result.idle_us);
}

void from_proto(const v1::StepResult& result, StepResult& out) {
  out.step_id = result.step_id();
  out.seqs.resize(result.seqs_size());  // the kept entries keep their vectors' capacity
  for (int i = 0; i < result.seqs_size(); ++i) {
    const v1::SeqResult& o = result.seqs(i);
    SeqResult& s = out.seqs[i];
    s.seq_id = o.seq_id();
    s.token = o.token();
    s.logprob = o.logprob();
    assign(o.top_ids(), s.top_ids);
    assign(o.top_logprobs(), s.top_logprobs);
  }
  out.error_code = result.error_code();
  out.error_message = result.error_message();
  out.compute_us = result.compute_us();
  out.idle_us = result.idle_us();
}

void to_proto(const KvReceived& ack, v1::KvReceived& out) {
  out.Clear();
  out.set_transfer_id(ack.transfer_id);
  out.set_seq_id(ack.seq_id);
  out.set_bytes(ack.bytes);
  out.set_error_code(ack.error_code);
  out.set_error_message(ack.error_message);
}

void from_proto(const v1::KvReceived& ack, KvReceived& out) {
  out = KvReceived{ack.transfer_id(), ack.seq_id(), ack.bytes(), ack.error_code(), ack.error_message()};
}

}  // namespace tandem::scheduler
