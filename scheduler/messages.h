// What the scheduler core emits and takes, as plain structs: no protobuf in the core's
// interface. The actor alone maps them to and from the wire (scheduler/actor_wire.h), one
// function per message. Fields mean what their namesakes in proto/tandem/v1/worker.proto
// and client.proto mean; the finish reason and error code are the wire's enums (plain C++
// enums: the protocol's one list of each).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "model/sampling_params.h"
#include "runtime/step_plan.h"
#include "tandem/v1/common.pb.h"

namespace tandem::scheduler {

// One step's plan for one worker: the definition the worker shares (runtime/step_plan.h).
using runtime::SeqPlan;
using runtime::StepPlan;

// A decode worker reserves a handed-off sequence's blocks (v1::KvExpect; epoch is the actor's).
struct KvExpect {
  uint64_t transfer_id = 0, seq_id = 0, nonce = 0, scheduler_epoch = 0;
  std::vector<int32_t> blocks, tail_blocks;
  uint32_t positions = 0;
  std::string sender_public_key;
  std::string request_id{}, principal{};  // for the decode worker's log line only
  std::vector<int32_t> ring_blocks{};     // rings: the ring reserved there, of logical blocks ring_first ..
  uint32_t ring_first = 0;
  std::vector<uint64_t> release{};  // sequences the worker forgets first (StepPlan::release)
};

// A prefill worker sends a sequence's KV (v1::KvSend; epoch is the actor's).
struct KvSend {
  uint64_t transfer_id = 0, seq_id = 0, dest_seq_id = 0, nonce = 0, scheduler_epoch = 0;
  std::string dest_endpoint, dest_public_key;
  uint32_t positions = 0;
  uint32_t ring_first = 0;  // rings: send the ring's logical blocks ring_first .. the positions' last
};

// What the core orders a worker besides plans (a v1::SchedulerCommand body).
using Command = std::variant<KvExpect, KvSend>;

// A worker's answer for one sequence (v1::SeqResult).
struct SeqResult {
  uint64_t seq_id = 0;
  int32_t token = -1;  // -1: the plan did not ask to sample
  float logprob = 0.0f;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  // A speculating round's further tokens (accepted drafts, then the correction) and their logprobs.
  std::vector<int32_t> more_tokens;
  std::vector<float> more_logprobs;
};

// A worker's answer for one step (v1::StepResult).
struct StepResult {
  uint64_t step_id = 0;
  std::vector<SeqResult> seqs;
  v1::ErrorCode error_code = v1::ERROR_CODE_UNSPECIFIED;  // the step failed as a whole
  std::string error_message;
  uint64_t compute_us = 0, idle_us = 0;
  uint32_t drafted = 0, accepted = 0;  // speculative drafts fed, and accepted, in the step
};

// A decode worker has a handed-off sequence's KV, or refused it (v1::KvReceived).
struct KvReceived {
  uint64_t transfer_id = 0, seq_id = 0, bytes = 0;
  v1::ErrorCode error_code = v1::ERROR_CODE_UNSPECIFIED;
  std::string error_message;
};

// One token streamed to a client (v1::TokenEvent).
struct TokenEvent {
  struct Top {
    int32_t id = 0;
    float logprob = 0.0f;
  };
  int32_t id = 0;
  std::string text;  // whole UTF-8 characters only
  float logprob = 0.0f;
  std::vector<Top> top;
};

// A request's end (v1::FinalEvent, with its Usage and Timings).
struct FinalEvent {
  v1::FinishReason finish_reason = v1::FINISH_REASON_UNSPECIFIED;
  v1::ErrorCode error_code = v1::ERROR_CODE_UNSPECIFIED;
  std::string error_message;
  // Usage and timings: set for a request that was taken (not for a refusal: on the wire,
  // a refusal's final event has neither).
  bool accounted = false;
  uint32_t prompt_tokens = 0, completion_tokens = 0, cached_prompt_tokens = 0;
  double queue_ms = 0, ttft_ms = 0, total_ms = 0;
  std::string text;       // bytes held back until the end
  std::string principal;  // whom the request was for: the actor's log line only, not on the wire
};

// What one request's client is told (v1::RequestEvents).
struct RequestEvents {
  std::string request_id;
  std::optional<FinalEvent> final;
  std::span<const TokenEvent> tokens() const { return {tokens_.data(), used_}; }
  // An entry appended to tokens(), reused in place as StepPlan::add_seq's.
  TokenEvent& add_token();
  void clear();

 private:
  std::vector<TokenEvent> tokens_;
  size_t used_ = 0;
};

// The one place a final event is made: `out`'s final event with `reason`, `code` and, for
// errors and cancellations, `message`. Usage, timings and held-back text are the caller's.
FinalEvent& set_final(RequestEvents& out, v1::FinishReason reason, v1::ErrorCode code, const std::string& message);
// The events of a request refused before it was admitted: its id (cut to kMaxRequestIdBytes at a
// character boundary: a refusal never echoes a long id whole) and an error final event.
RequestEvents& set_refusal(RequestEvents& out, const std::string& request_id, v1::ErrorCode code,
                           const std::string& message);

}  // namespace tandem::scheduler
