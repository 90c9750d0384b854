#include "scheduler/client_outbox.h"

#include <utility>

#include "runtime/wire.h"
#include "scheduler/core.h"

namespace tandem::scheduler {

ClientOutbox::ClientOutbox(uint32_t queue_bound, Callbacks callbacks)
    : queue_bound_(queue_bound), callbacks_(std::move(callbacks)) {}

void ClientOutbox::add(const std::string& client, const v1::RequestEvents& events) {
  v1::SchedulerReply& r = pending_[client];
  if (r.events().requests_size() == 0) dirty_.push_back(client);
  *r.mutable_events()->add_requests() = events;
}

void ClientOutbox::flush(int64_t now_us) {
  for (const std::string& client : dirty_) {
    v1::SchedulerReply& r = pending_[client];
    r.set_version(runtime::kProtocolVersion);
    if (auto st = stalled_.find(client); st != stalled_.end()) {
      keep_finals(r, st->second, dropped_[client]);
    } else if (callbacks_.send(client, r).error() == runtime::SendError::kQueueFull) {
      keep_finals(r, stalled_[client], dropped_[client]);
      newly_stalled_.push_back(client);
    }
    r.Clear();
  }
  dirty_.clear();
  // Cancelling a stalled client's requests adds their final events: kept, not sent.
  for (const std::string& client : newly_stalled_) callbacks_.stopped_reading(client);
  newly_stalled_.clear();
  for (const std::string& client : dirty_) {
    keep_finals(pending_[client], stalled_[client], dropped_[client]);
    pending_[client].Clear();
  }
  dirty_.clear();
  retry_stalled(now_us);
}

void ClientOutbox::retry_stalled(int64_t now_us) {
  if (stalled_.empty() || now_us < next_retry_us_) return;
  next_retry_us_ = now_us + kRetryUs;
  for (auto it = stalled_.begin(); it != stalled_.end();) {
    it->second.set_version(runtime::kProtocolVersion);
    if (callbacks_.send(it->first, it->second).is_ok() || !callbacks_.known(it->first)) {
      dropped_.erase(it->first);
      it = stalled_.erase(it);
    } else
      ++it;
  }
}

bool ClientOutbox::refuse_submit_if_stalled(const std::string& client, const std::string& request_id) {
  auto st = stalled_.find(client);
  if (st == stalled_.end()) return false;
  // Refused after its earlier events (a new stream would lose tokens); dropped past the bound
  // (the request was never accepted).
  if (st->second.events().requests_size() >= static_cast<int>(queue_bound_)) return true;
  set_refusal(*st->second.mutable_events()->add_requests(), request_id, v1::ERROR_CODE_OVERLOADED,
              "this client is not reading its events: read them before submitting more");
  return true;
}

int ClientOutbox::kept_events(const std::string& client) const {
  auto st = stalled_.find(client);
  return st == stalled_.end() ? 0 : st->second.events().requests_size();
}

void ClientOutbox::trim(size_t live_clients) {
  if (dirty_.empty() && pending_.size() > 4 * (live_clients + 16)) pending_.clear();
}

void ClientOutbox::keep_finals(const v1::SchedulerReply& from, v1::SchedulerReply& to,
                               std::unordered_map<std::string, uint32_t>& dropped) {
  for (const v1::RequestEvents& ev : from.events().requests()) {
    if (!ev.has_final()) {
      if (ev.tokens_size() > 0) dropped[ev.request_id()] += static_cast<uint32_t>(ev.tokens_size());
      continue;
    }
    uint32_t lost = static_cast<uint32_t>(ev.tokens_size());
    if (auto it = dropped.find(ev.request_id()); it != dropped.end()) {
      lost += it->second;
      dropped.erase(it);
    }
    v1::RequestEvents* kept = to.mutable_events()->add_requests();
    kept->set_request_id(ev.request_id());
    *kept->mutable_final() = ev.final();
    const v1::FinishReason reason = ev.final().finish_reason();
    if (lost > 0 && (reason == v1::FINISH_REASON_LENGTH || reason == v1::FINISH_REASON_STOP)) {
      // A success with fewer tokens than usage.completion_tokens would be a lie the client
      // cannot detect; the usage stays as computed.
      v1::FinalEvent& fin = *kept->mutable_final();
      fin.set_finish_reason(v1::FINISH_REASON_ERROR);
      fin.set_error_code(v1::ERROR_CODE_OVERLOADED);
      fin.set_error_message("the request finished, but " + std::to_string(lost) +
                            " of its tokens were not delivered: this client stopped reading its events");
    }
  }
}

}  // namespace tandem::scheduler
