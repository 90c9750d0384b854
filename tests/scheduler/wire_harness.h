// Test plumbing: the core's plain structs (scheduler/messages.h) and their wire forms, through
// the actor's mapping (scheduler/actor_wire.h), so scripted workers keep speaking protobuf.
#pragma once

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

}  // namespace tandem::scheduler::test_wire
