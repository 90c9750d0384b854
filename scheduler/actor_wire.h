// The actor's mapping between the core's plain structs (scheduler/messages.h) and the wire:
// one function each way per message, and the only code that does it (the core has no
// protobuf in its interface). Epochs and the command version are the actor's: to_proto
// leaves them unset, from_proto ignores them. tests/scheduler/actor_wire_test.cpp checks
// every pair for round trip.
#pragma once

#include "scheduler/messages.h"
#include "tandem/v1/client.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::scheduler {

// The plan's pair is shared with the worker (runtime/step_plan.h).
using runtime::from_proto;
using runtime::to_proto;

// out's body: kv_expect or kv_send (its version is the caller's).
void to_proto(const Command& command, v1::SchedulerCommand& out);
// False when the command has neither body.
bool from_proto(const v1::SchedulerCommand& command, Command& out);

void to_proto(const StepResult& result, v1::StepResult& out);
void from_proto(const v1::StepResult& result, StepResult& out);

void to_proto(const KvReceived& ack, v1::KvReceived& out);
void from_proto(const v1::KvReceived& ack, KvReceived& out);

// Appends to `out` (a part of a coalesced reply may carry several requests' events).
void to_proto(const RequestEvents& events, v1::RequestEvents& out);
void from_proto(const v1::RequestEvents& events, RequestEvents& out);

// The wire forms of set_final and set_refusal (messages.h) for events the actor makes itself.
v1::FinalEvent& set_final(v1::RequestEvents& out, v1::FinishReason reason, v1::ErrorCode code,
                          const std::string& message);
v1::RequestEvents& set_refusal(v1::RequestEvents& out, const std::string& request_id, v1::ErrorCode code,
                               const std::string& message);

}  // namespace tandem::scheduler
