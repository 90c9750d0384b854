// Test plumbing: the core's plain structs (scheduler/messages.h) and their wire forms, through
// the actor's mapping (scheduler/actor_wire.h), so scripted workers keep speaking protobuf.
#pragma once

#include <string>

#include "scheduler/actor_wire.h"

namespace tandem::scheduler::test_wire {

inline v1::StepPlan wire(const StepPlan& plan) {
  v1::StepPlan out;
  to_proto(plan, out);
  return out;
}
inline v1::SchedulerCommand wire(const Command& command) {
  v1::SchedulerCommand out;
  to_proto(command, out);
  return out;
}
inline v1::RequestEvents wire(const RequestEvents& events) {
  v1::RequestEvents out;
  to_proto(events, out);
  return out;
}
inline StepResult plain(const v1::StepResult& result) {
  StepResult out;
  from_proto(result, out);
  return out;
}
inline KvReceived plain(const v1::KvReceived& ack) {
  KvReceived out;
  from_proto(ack, out);
  return out;
}

// A streamed greedy request of `prompt_len` ids (3, 4, ... cycling over 200) and `max_tokens`
// tokens, EOS ignored: the Submit the core tests place.
inline v1::Submit submit(const std::string& id, uint32_t prompt_len, uint32_t max_tokens) {
  v1::Submit s;
  s.set_request_id(id);
  for (uint32_t i = 0; i < prompt_len; ++i) s.mutable_tokens()->add_ids(3 + static_cast<int32_t>(i % 200));
  s.set_max_tokens(max_tokens);
  s.set_ignore_eos(true);
  s.set_stream(true);
  return s;
}

}  // namespace tandem::scheduler::test_wire
