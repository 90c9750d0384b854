// The actor's mapping between the core's plain structs and the wire (scheduler/actor_wire.h):
// every message goes to protobuf, through bytes, and back unchanged, with every field set.
#include "scheduler/actor_wire.h"

#include <gtest/gtest.h>

#include "scheduler/admission.h"

namespace tandem::scheduler {
namespace {

// Serialized and parsed: the mapping's protobuf is valid on the wire too.
template <typename Msg>
Msg through_bytes(const Msg& m) {
  Msg out;
  EXPECT_TRUE(out.ParseFromString(m.SerializeAsString()));
  return out;
}

void expect_same(const SeqPlan& a, const SeqPlan& b) {
  EXPECT_EQ(a.seq_id, b.seq_id);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.start_pos, b.start_pos);
  EXPECT_EQ(a.new_blocks, b.new_blocks);
  EXPECT_EQ(a.sample, b.sample);
  EXPECT_EQ(a.first, b.first);
  EXPECT_EQ(a.logprobs, b.logprobs);
  EXPECT_EQ(a.history, b.history);
  EXPECT_EQ(a.tail_blocks, b.tail_blocks);
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.principal, b.principal);
  EXPECT_EQ(a.sampling.temperature, b.sampling.temperature);
  EXPECT_EQ(a.sampling.top_k, b.sampling.top_k);
  EXPECT_EQ(a.sampling.top_p, b.sampling.top_p);
  EXPECT_EQ(a.sampling.min_p, b.sampling.min_p);
  EXPECT_EQ(a.sampling.repetition_penalty, b.sampling.repetition_penalty);
  EXPECT_EQ(a.sampling.seed, b.sampling.seed);
  EXPECT_EQ(a.sampling.top_logprobs, b.sampling.top_logprobs);
  EXPECT_EQ(a.sampling.presence_penalty, b.sampling.presence_penalty);
  EXPECT_EQ(a.sampling.frequency_penalty, b.sampling.frequency_penalty);
  EXPECT_EQ(a.sampling.logit_bias, b.sampling.logit_bias);
  EXPECT_EQ(a.prompt_len, b.prompt_len);
}

TEST(ActorWire, StepPlanRoundTrips) {
  StepPlan plan;
  plan.step_id = 41;
  SeqPlan& first = plan.add_seq();
  first.seq_id = 7;
  first.tokens = {3, 4, 5};
  first.start_pos = 32;
  first.new_blocks = {9, 10};
  first.sample = true;
  first.first = true;
  first.sampling = {0.7f, 40, 0.9f, 0.05f, 1.1f, 1234, 5, 0.5f, -0.25f, {{7, -100.0f}, {3, 2.5f}}};
  first.prompt_len = 30;
  first.logprobs = true;
  first.history.assign(32, 11);
  first.tail_blocks = {100, 101};
  first.request_id = "req-0123456789abcdef";
  first.principal = "alice";
  SeqPlan& decode = plan.add_seq();
  decode.seq_id = 8;
  decode.start_pos = 90;
  decode.sample = true;
  plan.release = {1, 2};

  v1::StepPlan wire;
  to_proto(plan, wire);
  EXPECT_TRUE(wire.seqs(0).has_sampling());
  EXPECT_FALSE(wire.seqs(1).has_sampling());  // only a sequence's first appearance carries it
  StepPlan back;
  from_proto(through_bytes(wire), back);
  EXPECT_EQ(back.step_id, plan.step_id);
  ASSERT_EQ(back.seqs().size(), 2u);
  expect_same(back.seqs()[0], plan.seqs()[0]);
  expect_same(back.seqs()[1], plan.seqs()[1]);
  EXPECT_EQ(back.release, plan.release);
}

TEST(ActorWire, ReusedPlanForgetsThePreviousOne) {
  StepPlan plan;
  SeqPlan& s = plan.add_seq();
  s.tokens = {1, 2, 3};
  s.first = true;
  s.history = {4};
  s.request_id = "r";
  plan.release = {5};
  plan.clear();
  EXPECT_TRUE(plan.seqs().empty());
  EXPECT_TRUE(plan.release.empty());
  const SeqPlan& again = plan.add_seq();
  EXPECT_TRUE(again.tokens.empty());
  EXPECT_TRUE(again.history.empty());
  EXPECT_TRUE(again.request_id.empty());
  EXPECT_FALSE(again.first);
}

TEST(ActorWire, KvExpectRoundTrips) {
  const KvExpect e{5, 6, 0xfeedfacecafebeefull, 77, {1, 2, 3}, {4}, 48, "sender-key", "req-1", "alice", {9, 12}};
  v1::SchedulerCommand wire;
  to_proto(Command(e), wire);
  ASSERT_TRUE(wire.has_kv_expect());
  Command back;
  ASSERT_TRUE(from_proto(through_bytes(wire), back));
  const KvExpect& b = std::get<KvExpect>(back);
  EXPECT_EQ(b.transfer_id, e.transfer_id);
  EXPECT_EQ(b.seq_id, e.seq_id);
  EXPECT_EQ(b.nonce, e.nonce);
  EXPECT_EQ(b.scheduler_epoch, e.scheduler_epoch);
  EXPECT_EQ(b.blocks, e.blocks);
  EXPECT_EQ(b.tail_blocks, e.tail_blocks);
  EXPECT_EQ(b.positions, e.positions);
  EXPECT_EQ(b.sender_public_key, e.sender_public_key);
  EXPECT_EQ(b.request_id, e.request_id);
  EXPECT_EQ(b.release, e.release);
  EXPECT_EQ(b.principal, e.principal);
}

TEST(ActorWire, KvSendRoundTrips) {
  const KvSend k{5, 6, 9, 0x0123456789abcdefull, 77, "tcp://127.0.0.1:5999", "dest-key", 48};
  v1::SchedulerCommand wire;
  to_proto(Command(k), wire);
  ASSERT_TRUE(wire.has_kv_send());
  Command back;
  ASSERT_TRUE(from_proto(through_bytes(wire), back));
  const KvSend& b = std::get<KvSend>(back);
  EXPECT_EQ(b.transfer_id, k.transfer_id);
  EXPECT_EQ(b.seq_id, k.seq_id);
  EXPECT_EQ(b.dest_seq_id, k.dest_seq_id);
  EXPECT_EQ(b.nonce, k.nonce);
  EXPECT_EQ(b.scheduler_epoch, k.scheduler_epoch);
  EXPECT_EQ(b.dest_endpoint, k.dest_endpoint);
  EXPECT_EQ(b.dest_public_key, k.dest_public_key);
  EXPECT_EQ(b.positions, k.positions);
  EXPECT_FALSE(from_proto(v1::SchedulerCommand{}, back));  // neither body
}

TEST(ActorWire, StepResultRoundTrips) {
  StepResult r;
  r.step_id = 12;
  r.seqs.push_back({7, 42, -0.5f, {42, 43}, {-0.5f, -1.5f}});
  r.seqs.push_back({8, -1, 0.0f, {}, {}});
  r.error_code = v1::ERROR_CODE_INVALID_ARGUMENT;
  r.error_message = "bad plan";
  r.compute_us = 900;
  r.idle_us = 30;
  v1::StepResult wire;
  to_proto(r, wire);
  StepResult back;
  back.seqs.resize(5);  // a reused result: the extra entries go
  from_proto(through_bytes(wire), back);
  EXPECT_EQ(back.step_id, r.step_id);
  ASSERT_EQ(back.seqs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back.seqs[i].seq_id, r.seqs[i].seq_id);
    EXPECT_EQ(back.seqs[i].token, r.seqs[i].token);
    EXPECT_EQ(back.seqs[i].logprob, r.seqs[i].logprob);
    EXPECT_EQ(back.seqs[i].top_ids, r.seqs[i].top_ids);
    EXPECT_EQ(back.seqs[i].top_logprobs, r.seqs[i].top_logprobs);
  }
  EXPECT_EQ(back.error_code, r.error_code);
  EXPECT_EQ(back.error_message, r.error_message);
  EXPECT_EQ(back.compute_us, r.compute_us);
  EXPECT_EQ(back.idle_us, r.idle_us);
}

TEST(ActorWire, KvReceivedRoundTrips) {
  const KvReceived a{5, 6, 4096, v1::ERROR_CODE_INVALID_ARGUMENT, "format differs"};
  v1::KvReceived wire;
  to_proto(a, wire);
  KvReceived back;
  from_proto(through_bytes(wire), back);
  EXPECT_EQ(back.transfer_id, a.transfer_id);
  EXPECT_EQ(back.seq_id, a.seq_id);
  EXPECT_EQ(back.bytes, a.bytes);
  EXPECT_EQ(back.error_code, a.error_code);
  EXPECT_EQ(back.error_message, a.error_message);
}

TEST(ActorWire, RequestEventsRoundTrip) {
  RequestEvents ev;
  ev.request_id = "r-1";
  TokenEvent& t = ev.add_token();
  t.id = 42;
  t.text = "h\xc3\xa9";
  t.logprob = -0.25f;
  t.top = {{42, -0.25f}, {43, -2.0f}};
  ev.add_token().id = 43;  // t may move: not read after this
  FinalEvent& f = set_final(ev, v1::FINISH_REASON_CANCELLED, v1::ERROR_CODE_UNSPECIFIED, "deadline exceeded");
  f.text = "held";
  f.accounted = true;
  f.prompt_tokens = 10;
  f.completion_tokens = 2;
  f.cached_prompt_tokens = 8;
  f.queue_ms = 1.5;
  f.ttft_ms = 20.25;
  f.total_ms = 31.0;
  v1::RequestEvents wire;
  to_proto(ev, wire);
  RequestEvents back;
  from_proto(through_bytes(wire), back);
  EXPECT_EQ(back.request_id, ev.request_id);
  ASSERT_EQ(back.tokens().size(), 2u);
  EXPECT_EQ(back.tokens()[0].id, 42);
  EXPECT_EQ(back.tokens()[0].text, "h\xc3\xa9");
  EXPECT_EQ(back.tokens()[0].logprob, -0.25f);
  ASSERT_EQ(back.tokens()[0].top.size(), 2u);
  EXPECT_EQ(back.tokens()[0].top[1].id, 43);
  EXPECT_EQ(back.tokens()[0].top[1].logprob, -2.0f);
  EXPECT_EQ(back.tokens()[1].id, 43);
  ASSERT_TRUE(back.final);
  const FinalEvent& b = *back.final;
  EXPECT_EQ(b.finish_reason, v1::FINISH_REASON_CANCELLED);
  EXPECT_EQ(b.error_message, "deadline exceeded");
  EXPECT_EQ(b.text, "held");
  EXPECT_TRUE(b.accounted);
  EXPECT_EQ(b.prompt_tokens, 10u);
  EXPECT_EQ(b.completion_tokens, 2u);
  EXPECT_EQ(b.cached_prompt_tokens, 8u);
  EXPECT_EQ(b.queue_ms, 1.5);
  EXPECT_EQ(b.ttft_ms, 20.25);
  EXPECT_EQ(b.total_ms, 31.0);
}

TEST(ActorWire, RefusalHasNoUsageOnTheWire) {
  RequestEvents ev;
  set_refusal(ev, std::string(300, 'x'), v1::ERROR_CODE_OVERLOADED, "full");
  v1::RequestEvents wire;
  to_proto(ev, wire);
  EXPECT_EQ(wire.request_id().size(), kMaxRequestIdBytes);
  EXPECT_EQ(wire.final().error_code(), v1::ERROR_CODE_OVERLOADED);
  EXPECT_EQ(wire.final().error_message(), "full");
  EXPECT_FALSE(wire.final().has_usage());
  EXPECT_FALSE(wire.final().has_timings());
  v1::RequestEvents direct;  // the actor's own refusals: the same message
  set_refusal(direct, std::string(300, 'x'), v1::ERROR_CODE_OVERLOADED, "full");
  EXPECT_EQ(direct.SerializeAsString(), wire.SerializeAsString());
  RequestEvents back;
  from_proto(wire, back);
  EXPECT_FALSE(back.final->accounted);
}

}  // namespace
}  // namespace tandem::scheduler
