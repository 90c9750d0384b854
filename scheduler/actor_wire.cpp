#include "scheduler/actor_wire.h"

#include "runtime/sampling_proto.h"

namespace tandem::scheduler {
namespace {

template <typename Field, typename T>
void assign(const Field& from, std::vector<T>& to) {
  to.assign(from.begin(), from.end());
}

}  // namespace

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
    o.set_request_id(e->request_id);
    o.set_principal(e->principal);
    o.set_scheduler_epoch(e->scheduler_epoch);
    o.mutable_ring_blocks()->Add(e->ring_blocks.begin(), e->ring_blocks.end());
    o.set_ring_first(e->ring_first);
    o.mutable_release()->Add(e->release.begin(), e->release.end());
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
  o.set_ring_first(k.ring_first);
}

bool from_proto(const v1::SchedulerCommand& command, Command& out) {
  if (command.has_kv_expect()) {
    const v1::KvExpect& o = command.kv_expect();
    KvExpect e{o.transfer_id(),       o.seq_id(),     o.nonce(),    o.scheduler_epoch(), {}, {}, o.positions(),
               o.sender_public_key(), o.request_id(), o.principal()};
    assign(o.blocks(), e.blocks);
    assign(o.tail_blocks(), e.tail_blocks);
    assign(o.ring_blocks(), e.ring_blocks);
    e.ring_first = o.ring_first();
    assign(o.release(), e.release);
    out = std::move(e);
    return true;
  }
  if (!command.has_kv_send()) return false;
  const v1::KvSend& o = command.kv_send();
  out = KvSend{o.transfer_id(),   o.seq_id(),          o.dest_seq_id(), o.nonce(),     o.scheduler_epoch(),
               o.dest_endpoint(), o.dest_public_key(), o.positions(),   o.ring_first()};
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
    o.mutable_more_tokens()->Add(s.more_tokens.begin(), s.more_tokens.end());
    o.mutable_more_logprobs()->Add(s.more_logprobs.begin(), s.more_logprobs.end());
  }
  out.set_error_code(result.error_code);
  out.set_error_message(result.error_message);
  out.set_compute_us(result.compute_us);
  out.set_idle_us(result.idle_us);
  out.set_drafted(result.drafted);
  out.set_accepted(result.accepted);
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
    assign(o.more_tokens(), s.more_tokens);
    assign(o.more_logprobs(), s.more_logprobs);
  }
  out.error_code = result.error_code();
  out.error_message = result.error_message();
  out.compute_us = result.compute_us();
  out.idle_us = result.idle_us();
  out.drafted = result.drafted();
  out.accepted = result.accepted();
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

void to_proto(const RequestEvents& events, v1::RequestEvents& out) {
  out.set_request_id(events.request_id);
  for (const TokenEvent& t : events.tokens()) {
    v1::TokenEvent& o = *out.add_tokens();
    o.set_id(t.id);
    o.set_text(t.text);
    o.set_logprob(t.logprob);
    for (const TokenEvent::Top& top : t.top) {
      v1::TopLogprob& p = *o.add_top();
      p.set_id(top.id);
      p.set_logprob(top.logprob);
    }
  }
  if (!events.final) return;
  const FinalEvent& f = *events.final;
  v1::FinalEvent& o = *out.mutable_final();
  o.set_finish_reason(f.finish_reason);
  o.set_error_code(f.error_code);
  o.set_error_message(f.error_message);
  o.set_text(f.text);
  if (!f.accounted) return;
  v1::Usage& u = *o.mutable_usage();
  u.set_prompt_tokens(f.prompt_tokens);
  u.set_completion_tokens(f.completion_tokens);
  u.set_cached_prompt_tokens(f.cached_prompt_tokens);
  v1::Timings& t = *o.mutable_timings();
  t.set_queue_ms(f.queue_ms);
  t.set_ttft_ms(f.ttft_ms);
  t.set_total_ms(f.total_ms);
}

void from_proto(const v1::RequestEvents& events, RequestEvents& out) {
  out.clear();
  out.request_id = events.request_id();
  for (const v1::TokenEvent& o : events.tokens()) {
    TokenEvent& t = out.add_token();
    t.id = o.id();
    t.text = o.text();
    t.logprob = o.logprob();
    for (const v1::TopLogprob& p : o.top()) t.top.push_back({p.id(), p.logprob()});
  }
  if (!events.has_final()) return;
  const v1::FinalEvent& o = events.final();
  FinalEvent& f = out.final.emplace();
  f.finish_reason = o.finish_reason();
  f.error_code = o.error_code();
  f.error_message = o.error_message();
  f.text = o.text();
  f.accounted = o.has_usage() || o.has_timings();
  f.prompt_tokens = o.usage().prompt_tokens();
  f.completion_tokens = o.usage().completion_tokens();
  f.cached_prompt_tokens = o.usage().cached_prompt_tokens();
  f.queue_ms = o.timings().queue_ms();
  f.ttft_ms = o.timings().ttft_ms();
  f.total_ms = o.timings().total_ms();
}

v1::FinalEvent& set_final(v1::RequestEvents& out, v1::FinishReason reason, v1::ErrorCode code,
                          const std::string& message) {
  RequestEvents plain;
  const FinalEvent& f = set_final(plain, reason, code, message);
  v1::FinalEvent& o = *out.mutable_final();
  o.set_finish_reason(f.finish_reason);
  o.set_error_code(f.error_code);
  o.set_error_message(f.error_message);
  return o;
}

v1::RequestEvents& set_refusal(v1::RequestEvents& out, const std::string& request_id, v1::ErrorCode code,
                               const std::string& message) {
  RequestEvents plain;
  set_refusal(plain, request_id, code, message);
  out.set_request_id(plain.request_id);
  set_final(out, plain.final->finish_reason, plain.final->error_code, plain.final->error_message);
  return out;
}

}  // namespace tandem::scheduler
