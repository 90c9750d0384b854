// Backpressure toward clients: the events the scheduler owes each client, coalesced into one
// message per client per turn of the loop, and what happens when a client stops reading.
//
// Contract:
// - add() only queues; flush() sends what each client got since the last flush(), in the order
//   the events were added: one SchedulerReply, or several when they would pass kReplyChunkBytes
//   (a request's tokens split over several RequestEvents if need be, its final event in the
//   last). No message the outbox sends is larger than kReplyChunkBytes, so the messages queued
//   to one client take at most (its socket's queue bound) x kReplyChunkBytes: the queue bound
//   is derived from the byte budget (send_hwm_for()).
// - A send that fails with kQueueFull (the client's socket queue is at its bound: it is not
//   reading) makes the client stalled. The outbox then calls stopped_reading(client) once: the
//   caller cancels the client's requests. Of what was being sent, and of what is added for a
//   stalled client from then on (the cancellations' final events too), only final events are
//   kept, a few bytes each; token events are dropped. A request that lost tokens so never ends
//   with success: a kept final event of a request whose tokens were dropped becomes an
//   OVERLOADED error that says how many were not delivered.
// - Kept final events are retried at most every kRetryUs (each attempt serializes all of them),
//   not once per flush. A successful retry makes the client an ordinary one again; a stalled
//   client that known(client) no longer reports is forgotten with what was kept for it.
// - A stalled client's new submits are refused (OVERLOADED) in order after what waits for it;
//   past the queue bound they are dropped, so a client that submits without ever reading
//   cannot grow the scheduler's memory.
// - Other send failures (the peer is gone, the socket closes) drop the message.
// No sockets and no clock: sending and the time are the caller's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tandem/v1/client.pb.h"
#include "runtime/event_loop.h"
#include "runtime/wire.h"

namespace tandem::scheduler {

// The largest message of events sent to a client. A step's events for a few dozen streams fit
// in one; it is far below what a client accepts, and small enough that a byte budget of a few
// MiB still leaves a queue of hundreds of messages.
inline constexpr size_t kReplyChunkBytes = 16 << 10;
static_assert(kReplyChunkBytes < runtime::kClientReceiveLimitBytes);

// The messages a client's socket may queue so that its queued replies stay within
// `budget_bytes`: budget / kReplyChunkBytes, at least 16 and at most `queue_bound`.
uint32_t send_hwm_for(uint64_t budget_bytes, uint32_t queue_bound);

// Splits the reply to a query (a StatusReply or a TokenizeReply; anything else stays whole)
// into `parts` (cleared first) of at most `max_bytes` encoded each, so that query
// replies too keep a client's queue within its byte budget: a status's workers and a tokenize
// reply's ids continue in later parts under the same query_id, every other field in the
// first part (a TokenizeReply's count in each), `more` set on every part but the last. A
// reply that fits is one part, unchanged. `max_bytes` must leave room for a part's fixed
// fields and one worker (at least 1 KiB).
void split_query_reply(const v1::SchedulerReply& whole, size_t max_bytes, std::vector<v1::SchedulerReply>& parts);

class ClientOutbox {
 public:
  // At most every 20 ms: often enough that a client that reads again soon gets its final
  // events promptly, rarely enough that serializing them is no load.
  static constexpr int64_t kRetryUs = 20'000;

  struct Callbacks {
    // Sends `reply` to `client` now; on failure nothing is queued.
    std::function<runtime::SendResult(const std::string& client, const v1::SchedulerReply& reply)> send;
    // `client` stopped reading: cancel its requests (their final events may be add()ed).
    std::function<void(const std::string& client)> stopped_reading;
    // Whether `client` is still heard from (not declared gone).
    std::function<bool(const std::string& client)> known;
  };

  // `queue_bound`: the messages a client's socket queues before a send reports kQueueFull.
  ClientOutbox(uint32_t queue_bound, Callbacks callbacks);

  // The encoded bytes of what is queued for `client` and not yet sent (for tests).
  size_t pending_bytes(const std::string& client) const;

  // Queues `events` for `client`, sent at the next flush().
  void add(const std::string& client, const v1::RequestEvents& events);

  // Sends what was added since the last flush() and, at most every kRetryUs, what is kept for
  // stalled clients. `now_us`: the time, for the retry period.
  void flush(int64_t now_us);

  // If `client` is stalled, refuses its submit `request_id` (see above) and returns true; the
  // submit is then not to be admitted. False when the client reads: admit it.
  bool refuse_submit_if_stalled(const std::string& client, const std::string& request_id);

  bool stalled(const std::string& client) const { return stalled_.count(client) > 0; }
  // The final events kept for a stalled client (0 when it is not stalled).
  int kept_events(const std::string& client) const;

  // Releases the per-client buffers once they outnumber the live clients well (4 x + 16):
  // clients that are gone leave nothing behind. Call between flushes.
  void trim(size_t live_clients);

 private:
  // Moves the final events of `from` into `to`; token events are dropped and counted per request
  // (`dropped`), and a final event of a request that lost tokens is made an error.
  static void keep_finals(const v1::SchedulerReply& from, v1::SchedulerReply& to,
                          std::unordered_map<std::string, uint32_t>& dropped);
  void retry_stalled(int64_t now_us);
  // Sends `kept` in messages of at most kReplyChunkBytes; what was sent is removed from it.
  // True when all of it went.
  bool send_kept(const std::string& client, v1::SchedulerReply& kept);

  // A client's events of this turn: parts[0, used) are the messages to send, the last one open.
  struct Pending {
    std::vector<v1::SchedulerReply> parts;  // reused: kept allocated past `used`
    size_t used = 0;
    size_t open_bytes = 0;  // the open part's encoded size
    v1::SchedulerReply& open();
    void seal() { open_bytes = 0, ++used; }
    void add_split(const v1::RequestEvents& events);  // one RequestEvents too large for a part
    void clear();
  };

  uint32_t queue_bound_;
  Callbacks callbacks_;
  std::unordered_map<std::string, Pending> pending_;             // per client, reused
  std::vector<std::string> dirty_;                               // clients with pending events
  std::unordered_map<std::string, v1::SchedulerReply> stalled_;  // kept final events
  // Per stalled client: tokens dropped per request id that has not ended yet.
  std::unordered_map<std::string, std::unordered_map<std::string, uint32_t>> dropped_;
  std::vector<std::string> newly_stalled_;
  int64_t next_retry_us_ = 0;
};

}  // namespace tandem::scheduler
