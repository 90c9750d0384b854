// The StatusReply a client's StatusQuery (and Drain) gets: the core's workers and totals,
// with the few values only the actor knows. No sockets and no clock: the time is a parameter.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>

#include "scheduler/core.h"
#include "tandem/v1/client.pb.h"

namespace tandem::scheduler {

// The core's totals once a second over the last minute, for the last minute's throughput.
class LastMinute {
 public:
  struct Totals {
    uint64_t tokens, finished;
  };
  void sample(const CoreStats& stats);  // call once a second; keeps the last 60
  // The totals of the oldest sample kept, or `stats`' own when there is none yet.
  Totals oldest(const CoreStats& stats) const;

 private:
  std::deque<Totals> samples_;
};

// What the actor knows of a registered worker's process.
struct WorkerPeerInfo {
  uint32_t pid;
  int64_t last_seen_us;
  uint64_t weight_bytes, kv_bytes;  // as it registered
};

struct ActorStatus {
  uint64_t query_id = 0;  // the StatusQuery's, echoed so the client can match the reply to its query
  int64_t now_us = 0;
  int64_t scheduler_cpu_us = 0;  // the actor's thread CPU time in its handlers, over all steps
  uint64_t planning_stalls = 0;  // handler turns over kPlanningStallUs of that CPU time
  bool draining = false;
  LastMinute::Totals minute_ago{0, 0};
  // The peer behind a core worker id, or nullopt when the actor has none for it.
  std::function<std::optional<WorkerPeerInfo>(uint32_t worker_id)> peer;
};

// Fills `out` (cleared first) from `core` and `actor`.
void fill_status_reply(const Core& core, const ActorStatus& actor, v1::StatusReply& out);

}  // namespace tandem::scheduler
