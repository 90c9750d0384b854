#include "scheduler/client_outbox.h"

#include <google/protobuf/io/coded_stream.h>

#include <algorithm>
#include <utility>

#include "runtime/wire.h"
#include "scheduler/actor_wire.h"

namespace tandem::scheduler {

namespace {

// An element's bytes inside a repeated field: its tag and length prefix at most.
constexpr size_t kElementFraming = 6;

}  // namespace

namespace {

// The bytes a part's encoding may grow by past the sum of its pieces: the length prefixes of
// the body and of a packed field.
constexpr size_t kPrefixSlack = 16;

void split_ids(const v1::SchedulerReply& whole, size_t max_bytes, std::vector<v1::SchedulerReply>& parts) {
  const v1::TokenizeReply& t = whole.tokenized();
  auto open_part = [&] {
    v1::SchedulerReply& p = parts.emplace_back();
    p.set_version(whole.version());
    v1::TokenizeReply* r = p.mutable_tokenized();
    r->set_query_id(t.query_id());
    r->set_count(t.count());
    r->set_more(true);
    return r;
  };
  v1::TokenizeReply* part = open_part();
  const size_t fixed = parts.back().ByteSizeLong() + kPrefixSlack;
  size_t bytes = fixed;
  for (int32_t id : t.ids()) {
    const size_t size = google::protobuf::io::CodedOutputStream::VarintSize32SignExtended(id);
    if (bytes + size > max_bytes) {
      part = open_part();
      bytes = fixed;
    }
    part->add_ids(id);
    bytes += size;
  }
  part->clear_more();
}

void split_workers(const v1::SchedulerReply& whole, size_t max_bytes, std::vector<v1::SchedulerReply>& parts) {
  const v1::StatusReply& s = whole.status();
  v1::SchedulerReply& first = parts.emplace_back(whole);
  first.mutable_status()->clear_workers();
  first.mutable_status()->set_more(true);
  v1::StatusReply* part = first.mutable_status();
  size_t bytes = first.ByteSizeLong() + kPrefixSlack;
  for (const v1::WorkerStatus& w : s.workers()) {
    const size_t w_bytes = w.ByteSizeLong();
    const size_t size = 1 + google::protobuf::io::CodedOutputStream::VarintSize64(w_bytes) + w_bytes;
    if (bytes + size > max_bytes && part->workers_size() > 0) {
      v1::SchedulerReply& next = parts.emplace_back();
      next.set_version(whole.version());
      part = next.mutable_status();
      part->set_query_id(s.query_id());
      part->set_more(true);
      bytes = next.ByteSizeLong() + kPrefixSlack;
    }
    *part->add_workers() = w;
    bytes += size;
  }
  part->clear_more();
}

}  // namespace

void split_query_reply(const v1::SchedulerReply& whole, size_t max_bytes, std::vector<v1::SchedulerReply>& parts) {
  parts.clear();
  if (whole.ByteSizeLong() <= max_bytes) {
    parts.push_back(whole);
  } else if (whole.has_tokenized()) {
    split_ids(whole, max_bytes, parts);
  } else if (whole.has_status()) {
    split_workers(whole, max_bytes, parts);
  } else {
    parts.push_back(whole);
  }
}

uint32_t send_hwm_for(uint64_t budget_bytes, uint32_t queue_bound) {
  const uint64_t messages = budget_bytes / kReplyChunkBytes;
  return static_cast<uint32_t>(std::clamp<uint64_t>(messages, 16, std::max<uint32_t>(queue_bound, 16)));
}

ClientOutbox::ClientOutbox(uint32_t queue_bound, Callbacks callbacks)
    : queue_bound_(queue_bound), callbacks_(std::move(callbacks)) {}

v1::SchedulerReply& ClientOutbox::Pending::open() {
  if (used == 0) used = 1;
  if (parts.size() < used) parts.resize(used);
  return parts[used - 1];
}

void ClientOutbox::Pending::clear() {
  for (size_t i = 0; i < used; ++i) parts[i].Clear();
  used = 0;
  open_bytes = 0;
}

void ClientOutbox::Pending::add_split(const v1::RequestEvents& events) {
  // Rare (a non-streaming request's tokens, all at once): allocating here is fine.
  v1::RequestEvents* piece = nullptr;
  size_t piece_bytes = 0;
  auto start_piece = [&] {
    if (open_bytes > 0) seal();
    piece = open().mutable_events()->add_requests();
    piece->set_request_id(events.request_id());
    piece_bytes = kElementFraming + piece->ByteSizeLong();
  };
  start_piece();
  for (const v1::TokenEvent& t : events.tokens()) {
    const size_t n = t.ByteSizeLong() + kElementFraming;
    if (piece_bytes + n > kReplyChunkBytes - kElementFraming) {
      open_bytes = piece_bytes;
      start_piece();
    }
    *piece->add_tokens() = t;
    piece_bytes += n;
  }
  if (events.has_final()) {
    const size_t n = events.final().ByteSizeLong() + kElementFraming;
    if (piece_bytes + n > kReplyChunkBytes - kElementFraming) {
      open_bytes = piece_bytes;
      start_piece();
    }
    *piece->mutable_final() = events.final();
    piece_bytes += n;
  }
  open_bytes = piece_bytes;
}

void ClientOutbox::add(const std::string& client, const v1::RequestEvents& events) {
  Pending& p = pending_[client];
  if (p.used == 0) dirty_.push_back(client);
  const size_t n = events.ByteSizeLong() + kElementFraming;
  if (n > kReplyChunkBytes - kElementFraming) return p.add_split(events);
  if (p.open_bytes + n > kReplyChunkBytes - kElementFraming) p.seal();
  *p.open().mutable_events()->add_requests() = events;
  p.open_bytes += n;
}

size_t ClientOutbox::pending_bytes(const std::string& client) const {
  auto it = pending_.find(client);
  if (it == pending_.end()) return 0;
  size_t n = 0;
  for (size_t i = 0; i < it->second.used; ++i) n += it->second.parts[i].ByteSizeLong();
  return n;
}

void ClientOutbox::flush(int64_t now_us) {
  for (const std::string& client : dirty_) {
    Pending& p = pending_[client];
    size_t sent = 0;
    if (!stalled_.count(client)) {
      for (; sent < p.used; ++sent) {
        p.parts[sent].set_version(runtime::kProtocolVersion);
        if (callbacks_.send(client, p.parts[sent]).error() == runtime::SendError::kQueueFull) {
          newly_stalled_.push_back(client);
          break;
        }
      }
    }
    // A stalled client's, or what did not fit its queue: final events kept, tokens counted.
    for (size_t i = sent; i < p.used; ++i) keep_finals(p.parts[i], stalled_[client], dropped_[client]);
    p.clear();
  }
  dirty_.clear();
  // Cancelling a stalled client's requests adds their final events: kept, not sent.
  for (const std::string& client : newly_stalled_) callbacks_.stopped_reading(client);
  newly_stalled_.clear();
  for (const std::string& client : dirty_) {
    Pending& p = pending_[client];
    for (size_t i = 0; i < p.used; ++i) keep_finals(p.parts[i], stalled_[client], dropped_[client]);
    p.clear();
  }
  dirty_.clear();
  retry_stalled(now_us);
}

void ClientOutbox::retry_stalled(int64_t now_us) {
  if (stalled_.empty() || now_us < next_retry_us_) return;
  next_retry_us_ = now_us + kRetryUs;
  for (auto it = stalled_.begin(); it != stalled_.end();) {
    if (send_kept(it->first, it->second) || !callbacks_.known(it->first)) {
      dropped_.erase(it->first);
      it = stalled_.erase(it);
    } else
      ++it;
  }
}

bool ClientOutbox::send_kept(const std::string& client, v1::SchedulerReply& kept) {
  auto* requests = kept.mutable_events()->mutable_requests();
  while (!requests->empty()) {
    v1::SchedulerReply chunk;
    chunk.set_version(runtime::kProtocolVersion);
    int n = 0;
    size_t bytes = 0;
    for (; n < requests->size(); ++n) {
      const size_t b = requests->Get(n).ByteSizeLong() + kElementFraming;
      if (n > 0 && bytes + b > kReplyChunkBytes - kElementFraming) break;
      *chunk.mutable_events()->add_requests() = requests->Get(n);
      bytes += b;
    }
    if (!callbacks_.send(client, chunk).is_ok()) return false;
    requests->DeleteSubrange(0, n);
  }
  return true;
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
