// libtandem-client. One I/O thread per Client owns the DEALER socket and every request's
// routing state; public calls reach it only through the Mailbox (a command queue plus an
// eventfd that wakes the thread's zmq_poll). The loop is plain zmq_poll over three items:
// the DEALER, a socket monitor (connection lost), and the mailbox's eventfd.
#include "tandem/client.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <future>
#include <random>
#include <set>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <zmq.hpp>

#include "client/harness.h"
#include "runtime/event_loop.h"
#include "runtime/sampling_proto.h"
#include "runtime/security.h"
#include "tandem/v1/client.pb.h"

namespace tandem {

namespace client_detail {

using Clock = std::chrono::steady_clock;

struct Command {
  enum class Kind { kSubmit, kCancel, kStatus };
  Kind kind = Kind::kSubmit;
  std::string id;
  std::string wire;  // a serialized ClientMessage (submit)
  std::shared_ptr<Stream> stream;
  std::function<void(const Event&)> on_event;
  std::optional<Clock::time_point> deadline;
  std::shared_ptr<std::promise<Result<StatusInfo>>> reply;  // kStatus
};

// The only state shared between callers and the I/O thread.
struct Mailbox {
  Mailbox() : wake_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~Mailbox() {
    if (wake_fd >= 0) ::close(wake_fd);
  }
  // False (and `c` untouched in effect) once the client is closing; why_closed() says why.
  bool post(Command&& c) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (closed) return false;
      commands.push_back(std::move(c));
    }
    wake();
    return true;
  }
  // Posts fail from now on; the first reason given stays.
  void close(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (closed) return;
      closed = true;
      closed_why = why;
    }
    wake();
  }
  std::string why_closed() {
    std::lock_guard<std::mutex> lock(mu);
    return closed_why;
  }
  void wake() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd, &one, sizeof one);
  }
  std::mutex mu;
  std::deque<Command> commands;  // guarded by mu
  bool closed = false;           // guarded by mu
  std::string closed_why;        // guarded by mu; the final error of whatever comes after
  const int wake_fd;
};

namespace {

// Asks the I/O thread to cancel request `id`; false once the client is closing.
bool post_cancel(Mailbox& mailbox, const std::string& id) {
  Command c;
  c.kind = Command::Kind::kCancel;
  c.id = id;
  return mailbox.post(std::move(c));
}

Event final_error(Code code, std::string message) {
  Event e;
  e.final = true;
  e.fin.reason = FinishReason::kError;
  e.fin.code = code;
  e.fin.error_code = code_name(code);
  e.fin.error_message = std::move(message);
  return e;
}

Code from_wire(v1::ErrorCode code) {
  switch (code) {
    case v1::ERROR_CODE_INVALID_ARGUMENT: return Code::kInvalidArgument;
    case v1::ERROR_CODE_OVERLOADED: return Code::kOverloaded;
    case v1::ERROR_CODE_UNAVAILABLE: return Code::kUnavailable;
    case v1::ERROR_CODE_MODEL_FILE: return Code::kModelFile;
    default: return Code::kInternal;
  }
}

Event from_wire(const v1::TokenEvent& t) {
  Event e;
  e.token.id = t.id();
  e.token.text = t.text();
  e.token.logprob = t.logprob();
  e.token.top.reserve(t.top_size());
  for (const auto& top : t.top()) e.token.top.emplace_back(top.id(), top.logprob());
  return e;
}

Event from_wire(const v1::FinalEvent& f) {
  Event e;
  e.final = true;
  FinalEvent& fin = e.fin;
  switch (f.finish_reason()) {
    case v1::FINISH_REASON_STOP: fin.reason = FinishReason::kStop; break;
    case v1::FINISH_REASON_LENGTH: fin.reason = FinishReason::kLength; break;
    case v1::FINISH_REASON_CANCELLED: fin.reason = FinishReason::kCancelled; break;
    default: fin.reason = FinishReason::kError; break;
  }
  if (fin.reason == FinishReason::kError) {
    fin.code = from_wire(f.error_code());
    fin.error_code = code_name(fin.code);
    fin.error_message = f.error_message();
    if (f.finish_reason() != v1::FINISH_REASON_ERROR && fin.error_message.empty())
      fin.error_message = "scheduler sent a final event without a finish reason";
  } else {
    fin.error_message = f.error_message();
  }
  fin.prompt_tokens = f.usage().prompt_tokens();
  fin.completion_tokens = f.usage().completion_tokens();
  fin.cached_prompt_tokens = f.usage().cached_prompt_tokens();
  fin.queue_ms = f.timings().queue_ms();
  fin.ttft_ms = f.timings().ttft_ms();
  fin.total_ms = f.timings().total_ms();
  fin.text = f.text();
  return e;
}

// Copies every visited field of `info` from the field of `m` it names (protobuf reflection:
// the field list is visit_*_fields' alone). A member type that is not the wire field's is a
// bug in that list; the status tests read every field.
template <class Info, class VisitFields>
void copy_fields(const google::protobuf::Message& m, Info& info, VisitFields visit_fields) {
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  visit_fields(info, [&](const char*, const char* wire, auto& member) {
    const google::protobuf::FieldDescriptor* f = d->FindFieldByName(wire);
    using T = std::remove_reference_t<decltype(member)>;
    if constexpr (std::is_same_v<T, bool>)
      member = r->GetBool(m, f);
    else if constexpr (std::is_same_v<T, uint32_t>)
      member = r->GetUInt32(m, f);
    else if constexpr (std::is_same_v<T, uint64_t>)
      member = r->GetUInt64(m, f);
    else if constexpr (std::is_same_v<T, double>)
      member = r->GetDouble(m, f);
    else if constexpr (std::is_same_v<T, std::string>)
      member = r->GetString(m, f);
    else
      static_assert(sizeof(T) == 0, "a status field of a type the wire does not carry");
  });
}

StatusInfo from_wire(const v1::StatusReply& s) {
  StatusInfo info;
  info.workers.resize(s.workers_size());
  for (int i = 0; i < s.workers_size(); ++i)
    copy_fields(s.workers(i), info.workers[i], [](auto& w, auto&& v) { visit_worker_fields(w, v); });
  copy_fields(s, info, [](auto& st, auto&& v) { visit_status_fields(st, v); });
  return info;
}

std::string wire(const v1::ClientMessage& m) {
  std::string out;
  m.SerializeToString(&out);
  return out;
}

v1::ClientMessage envelope() {
  v1::ClientMessage m;
  m.set_version(v1::PROTOCOL_VERSION_CURRENT);
  return m;
}

std::string status_query(uint64_t query_id) {
  v1::ClientMessage m = envelope();
  m.mutable_status()->set_query_id(query_id);
  return wire(m);
}

// Durations past this are taken as it: a century means "never", and twice it added to a
// steady_clock time (nanoseconds, 292 years of range) cannot overflow.
constexpr std::chrono::milliseconds kNever = std::chrono::hours(24 * 365 * 100);
std::chrono::milliseconds at_most_never(std::chrono::milliseconds d) { return std::min(d, kNever); }

std::string ms_string(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

}  // namespace

// The I/O side of a Client. Everything below `mailbox_` is touched only by the I/O thread
// (after start()).
class Core {
 public:
  Core(ClientOptions options, zmq::context_t context, zmq::socket_t dealer, zmq::socket_t monitor)
      : options_(std::move(options)),
        context_(std::move(context)),
        dealer_(std::move(dealer)),
        monitor_(std::move(monitor)),
        mailbox_(std::make_shared<Mailbox>()) {
    std::random_device rd;
    char buf[32];
    std::snprintf(buf, sizeof buf, "c%08x%08x-", rd(), rd());
    id_prefix_ = buf;
    heartbeat_wire_ = [] {
      auto m = envelope();
      m.mutable_heartbeat();
      return wire(m);
    }();
  }

  ~Core() { stop(); }

  bool wake_ok() const { return mailbox_->wake_fd >= 0; }

  void start() {
    // The I/O thread takes no signals: a CLI's SIGINT handler runs on its own threads.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    thread_ = std::thread([this] { run(); });
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    io_thread_id_ = thread_.get_id();
  }

  void stop() {
    close_mailbox();
    if (thread_.joinable()) thread_.join();
  }

  // Posts fail from now on; the next pass over the mailbox handles what is queued as closing.
  void close_mailbox() { mailbox_->close("client closed"); }

  std::string next_id() { return id_prefix_ + std::to_string(counter_.fetch_add(1, std::memory_order_relaxed)); }

  const ClientOptions& options() const { return options_; }
  const std::shared_ptr<Mailbox>& mailbox() const { return mailbox_; }
  bool on_io_thread() const { return std::this_thread::get_id() == io_thread_id_; }

  // The public calls' work on the caller's thread, `now` being the time of the call: each
  // posts a command for the I/O thread. (Defined below, after the wire helpers.)
  std::shared_ptr<Stream> generate(GenerateRequest request, Clock::time_point now);
  std::string generate(GenerateRequest request, std::function<void(const Event&)> on_event, Clock::time_point now);
  // A future that holds UNAVAILABLE (why the mailbox closed) at once when it is closed.
  std::future<Result<StatusInfo>> post_status(std::chrono::milliseconds timeout, Clock::time_point now);

  // The I/O thread's steps, each at `now`; run() makes them in this order on every wake-up,
  // and ClientHarness (client/harness.h) makes them directly.
  //
  // Handles every command posted so far; returns whether the client is closing.
  bool handle_mailbox(Clock::time_point now) {
    std::deque<Command> commands;
    bool closing;
    {
      std::lock_guard<std::mutex> lock(mailbox_->mu);
      commands.swap(mailbox_->commands);
      closing = mailbox_->closed;
    }
    for (Command& c : commands) handle(c, closing, now);
    return closing;
  }

  // One message from the scheduler, all its frames, as the DEALER delivers it. Each is one
  // frame holding a SchedulerReply; anything else is dropped (and logged). Any message at
  // all counts as a sign of life.
  void on_message(const runtime::Frames& frames, Clock::time_point now) {
    quiet_since_ = now;
    if (frames.size() != 1) {
      spdlog::warn("tandem client: dropped a message of {} frames from the scheduler", frames.size());
      return;
    }
    v1::SchedulerReply reply;
    if (!reply.ParseFromArray(frames[0].data(), static_cast<int>(frames[0].size()))) {
      spdlog::warn("tandem client: dropped an unparsable message from the scheduler");
      return;
    }
    on_reply(reply);
  }

  // zmq_poll failed for good; the loop ends after this and runs shutdown(). With nothing
  // left to read the mailbox, it is closed first: what is in flight and every later call
  // end at once, with this cause.
  void on_poll_failed(int err) {
    const std::string why = std::string("the client's I/O loop stopped: zmq_poll failed: ") + zmq_strerror(err);
    spdlog::error("tandem client: {}", why);
    mailbox_->close(why);
  }

  // The connection to the scheduler was lost.
  void on_disconnected() {
    // Messages to and from the requests in flight may be lost with the connection (and
    // a restarted scheduler does not know them): end them now rather than at a deadline.
    const std::string msg = "connection to the scheduler at " + options_.endpoint + " lost";
    if (!live_.empty() || !waiters_.empty()) spdlog::warn("tandem client: {}", msg);
    fail_all(Code::kUnavailable, msg);
    fail_waiters(Code::kUnavailable, msg);
  }

  static void deliver(const std::shared_ptr<Stream>& stream, const std::function<void(const Event&)>& on_event,
                      Event event) {
    if (stream) {
      stream->push(std::move(event));
    } else if (on_event) {
      try {
        on_event(event);
      } catch (const std::exception& e) {
        spdlog::error("tandem client: an event callback threw: {}", e.what());
      } catch (...) {
        spdlog::error("tandem client: an event callback threw");
      }
    }
  }

 private:
  struct Live {
    std::shared_ptr<Stream> stream;
    std::function<void(const Event&)> on_event;
    std::optional<Clock::time_point> deadline;
  };
  struct Waiter {
    uint64_t query_id = 0;
    Clock::time_point deadline;
    std::shared_ptr<std::promise<Result<StatusInfo>>> reply;  // null: a liveness probe
  };

  void run() {
    zmq_pollitem_t items[3] = {
        {dealer_.handle(), 0, ZMQ_POLLIN, 0},
        {monitor_.handle(), 0, ZMQ_POLLIN, 0},
        {nullptr, mailbox_->wake_fd, ZMQ_POLLIN, 0},
    };
    for (;;) {
      const long timeout = poll_timeout_ms(Clock::now());
      const int rc = zmq_poll(items, 3, timeout);
      if (rc < 0 && zmq_errno() != EINTR) {
        on_poll_failed(zmq_errno());
        break;
      }
      if (items[2].revents & ZMQ_POLLIN) {
        uint64_t n;
        [[maybe_unused]] ssize_t r = ::read(mailbox_->wake_fd, &n, sizeof n);
      }
      const bool closing = handle_mailbox(Clock::now());
      if (items[0].revents & ZMQ_POLLIN) drain_dealer();
      if (items[1].revents & ZMQ_POLLIN) drain_monitor();
      on_timers(Clock::now());
      if (closing) break;
    }
    shutdown();
  }

  long poll_timeout_ms(Clock::time_point now) const {
    std::optional<Clock::time_point> due;
    auto consider = [&](Clock::time_point t) {
      if (!due || t < *due) due = t;
    };
    if (!live_.empty()) {
      consider(next_heartbeat_);
      if (!deadlines_.empty()) consider(deadlines_.begin()->first);
      if (options_.liveness_timeout.count() > 0) {
        if (!probe_outstanding_) consider(quiet_since_ + options_.liveness_timeout);
        consider(quiet_since_ + 2 * options_.liveness_timeout);
      }
    }
    for (const Waiter& w : waiters_) consider(w.deadline);
    if (!due) return -1;
    if (*due <= now) return 0;
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(*due - now).count();
    return static_cast<long>(std::min<int64_t>(ms, 60'000));
  }

  // Sends one frame without blocking; false when the queue to the scheduler is full.
  bool send(const std::string& bytes) {
    if (zmq_send(dealer_.handle(), bytes.data(), bytes.size(), ZMQ_DONTWAIT) >= 0) return true;
    spdlog::warn("tandem client: send to {} failed: {}", options_.endpoint, zmq_strerror(zmq_errno()));
    return false;
  }

  void handle(Command& c, bool closing, Clock::time_point now) {
    switch (c.kind) {
      case Command::Kind::kSubmit: {
        if (closing) {
          deliver(c.stream, c.on_event, final_error(Code::kUnavailable, mailbox_->why_closed()));
          return;
        }
        if (live_.count(c.id)) {
          deliver(c.stream, c.on_event,
                  final_error(Code::kInvalidArgument, "request id '" + c.id + "' is already in flight"));
          return;
        }
        if (!send(c.wire)) {
          deliver(c.stream, c.on_event,
                  final_error(Code::kUnavailable, "cannot send to the scheduler at " + options_.endpoint));
          return;
        }
        if (live_.empty()) {
          next_heartbeat_ = now + options_.heartbeat_interval;
          quiet_since_ = now;
        }
        if (c.deadline) deadlines_.emplace(*c.deadline, c.id);
        live_.emplace(c.id, Live{std::move(c.stream), std::move(c.on_event), c.deadline});
        return;
      }
      case Command::Kind::kCancel: {
        if (!live_.count(c.id)) return;
        auto m = envelope();
        m.mutable_cancel()->set_request_id(c.id);
        (void)send(wire(m));
        return;
      }
      case Command::Kind::kStatus: {
        if (closing) {
          c.reply->set_value(Status::error(Code::kUnavailable, mailbox_->why_closed()));
          return;
        }
        if (!send(status_query(++last_query_id_))) {
          c.reply->set_value(Status::error(Code::kUnavailable, "cannot send to the scheduler at " + options_.endpoint));
          return;
        }
        waiters_.push_back(Waiter{last_query_id_, *c.deadline, std::move(c.reply)});
        return;
      }
    }
  }

  void finish(const std::string& id, Event event) {
    auto it = live_.find(id);
    if (it == live_.end()) return;
    Live live = std::move(it->second);
    live_.erase(it);
    if (live.deadline) deadlines_.erase({*live.deadline, id});
    deliver(live.stream, live.on_event, std::move(event));
  }

  void fail_all(Code code, const std::string& message) {
    std::vector<std::string> ids;
    ids.reserve(live_.size());
    for (const auto& [id, live] : live_) ids.push_back(id);
    for (const std::string& id : ids) finish(id, final_error(code, message));
  }

  void fail_waiters(Code code, const std::string& message) {
    for (Waiter& w : waiters_)
      if (w.reply) w.reply->set_value(Status::error(code, message));
    waiters_.clear();
    probe_outstanding_ = false;
  }

  void drain_dealer() {
    runtime::Frames frames;
    while (recv_message(frames)) on_message(frames, Clock::now());
  }

  // The next message on the DEALER, all its frames, without blocking; false when none is
  // queued. A message cut short (ZeroMQ delivers them whole) keeps its empty last frame, so
  // it has two frames or more and is dropped as malformed.
  bool recv_message(runtime::Frames& frames) {
    frames.clear();
    do {
      if (zmq_msg_recv(frames.emplace_back().handle(), dealer_.handle(), ZMQ_DONTWAIT) < 0) {
        if (frames.size() > 1) return true;
        frames.clear();
        return false;
      }
    } while (frames.back().more());
    return true;
  }

  void on_reply(const v1::SchedulerReply& reply) {
    if (reply.version() != v1::PROTOCOL_VERSION_CURRENT) {
      const std::string msg = "the scheduler speaks protocol version " + std::to_string(reply.version()) +
                              ", this client " + std::to_string(v1::PROTOCOL_VERSION_CURRENT);
      spdlog::error("tandem client: {}", msg);
      fail_all(Code::kUnavailable, msg);
      fail_waiters(Code::kUnavailable, msg);
      return;
    }
    switch (reply.body_case()) {
      case v1::SchedulerReply::kEvents: {
        for (const v1::RequestEvents& ev : reply.events().requests()) {
          auto it = live_.find(ev.request_id());
          if (it == live_.end()) continue;  // late events of a request that already ended here
          for (const auto& t : ev.tokens()) deliver(it->second.stream, it->second.on_event, from_wire(t));
          if (ev.has_final()) finish(ev.request_id(), from_wire(ev.final()));
        }
        return;
      }
      case v1::SchedulerReply::kStatus: {
        // A scheduler that echoes no query id answers in order; a reply whose query already
        // timed out here matches no waiter and is dropped.
        const uint64_t id = reply.status().query_id();
        auto it = id == 0 ? waiters_.begin() : std::find_if(waiters_.begin(), waiters_.end(), [id](const Waiter& w) {
          return w.query_id == id;
        });
        if (it == waiters_.end()) return;
        Waiter w = std::move(*it);
        waiters_.erase(it);
        if (w.reply) {
          w.reply->set_value(from_wire(reply.status()));
        } else {
          probe_outstanding_ = false;
        }
        return;
      }
      case v1::SchedulerReply::kError: {
        // Not tied to a request: this client and the scheduler disagree on the protocol, so
        // nothing in flight can be trusted to finish.
        const Code code = from_wire(reply.error().code());
        const std::string msg = "scheduler: " + reply.error().message();
        spdlog::error("tandem client: protocol error from {}: {}", options_.endpoint, msg);
        fail_all(code, msg);
        fail_waiters(code, msg);
        return;
      }
      default: spdlog::warn("tandem client: a scheduler reply without a body"); return;
    }
  }

  void drain_monitor() {
    for (;;) {
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      if (zmq_msg_recv(&msg, monitor_.handle(), ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&msg);
        return;
      }
      uint16_t event = 0;
      if (zmq_msg_size(&msg) >= sizeof event) std::memcpy(&event, zmq_msg_data(&msg), sizeof event);
      bool more = zmq_msg_more(&msg);
      zmq_msg_close(&msg);
      while (more) {  // the endpoint frame
        zmq_msg_init(&msg);
        more = zmq_msg_recv(&msg, monitor_.handle(), ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&msg);
        zmq_msg_close(&msg);
      }
      if (event == ZMQ_EVENT_DISCONNECTED) on_disconnected();
    }
  }

 public:
  // The last of the I/O thread's steps (see handle_mailbox), and what it does after its loop.
  void on_timers(Clock::time_point now) {
    // Waiters are queued in send order but may have different timeouts.
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->deadline > now) {
        ++it;
        continue;
      }
      if (it->reply) {
        it->reply->set_value(
            Status::error(Code::kUnavailable, "no status reply from the scheduler at " + options_.endpoint));
      } else {
        probe_outstanding_ = false;
      }
      it = waiters_.erase(it);
    }
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      const std::string id = deadlines_.begin()->second;
      deadlines_.erase(deadlines_.begin());
      auto m = envelope();
      m.mutable_cancel()->set_request_id(id);
      (void)send(wire(m));
      finish(id,
             final_error(Code::kUnavailable, "no final event from the scheduler at " + options_.endpoint + " within " +
                                                 ms_string(options_.deadline_grace) + " of the request's deadline"));
    }
    if (live_.empty()) return;
    if (options_.liveness_timeout.count() > 0) {
      if (now >= quiet_since_ + 2 * options_.liveness_timeout) {
        fail_all(Code::kUnavailable, "the scheduler at " + options_.endpoint + " sent nothing for " +
                                         ms_string(2 * options_.liveness_timeout) + " and did not answer a probe");
        return;
      }
      if (now >= quiet_since_ + options_.liveness_timeout && !probe_outstanding_) {
        (void)send(status_query(++last_query_id_));  // unsent, the probe simply goes unanswered
        waiters_.push_back(Waiter{last_query_id_, now + options_.liveness_timeout, nullptr});
        probe_outstanding_ = true;
      }
    }
    if (now >= next_heartbeat_) {
      (void)send(heartbeat_wire_);
      next_heartbeat_ = now + options_.heartbeat_interval;
    }
  }

  void shutdown() {
    for (const auto& [id, live] : live_) {
      auto m = envelope();
      m.mutable_cancel()->set_request_id(id);
      (void)send(wire(m));
    }
    const std::string why = mailbox_->why_closed();
    fail_all(Code::kUnavailable, why);
    fail_waiters(Code::kUnavailable, why);
    // Commands posted between the last poll and `closed` being set.
    std::deque<Command> rest;
    {
      std::lock_guard<std::mutex> lock(mailbox_->mu);
      rest.swap(mailbox_->commands);
    }
    for (Command& c : rest) handle(c, /*closing=*/true, Clock::now());
    monitor_.close();
    dealer_.close();  // ZMQ_LINGER bounds how long the cancels above may wait to go out
  }

 private:
  const ClientOptions options_;
  zmq::context_t context_;
  zmq::socket_t dealer_;
  zmq::socket_t monitor_;
  const std::shared_ptr<Mailbox> mailbox_;
  std::string id_prefix_;
  std::atomic<uint64_t> counter_{0};
  std::thread thread_;
  std::thread::id io_thread_id_;

  // I/O thread only.
  std::string heartbeat_wire_;
  std::unordered_map<std::string, Live> live_;
  std::set<std::pair<Clock::time_point, std::string>> deadlines_;
  std::deque<Waiter> waiters_;  // status queries in send order (the scheduler answers in order)
  uint64_t last_query_id_ = 0;
  bool probe_outstanding_ = false;
  Clock::time_point next_heartbeat_{};
  Clock::time_point quiet_since_{};  // last message from the scheduler, or when requests went in flight
};

}  // namespace client_detail

using client_detail::Clock;
using client_detail::Command;
using client_detail::Core;

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "error";
}

// ---- Stream ----

void Stream::push(Event event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

bool Stream::next(Event& out) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !events_.empty() || final_taken_; });
  if (events_.empty()) return false;
  out = std::move(events_.front());
  events_.pop_front();
  if (out.final) final_taken_ = true;
  return true;
}

std::optional<Event> Stream::next_for(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, wait, [&] { return !events_.empty() || final_taken_; })) return std::nullopt;
  if (events_.empty()) return std::nullopt;
  Event out = std::move(events_.front());
  events_.pop_front();
  if (out.final) final_taken_ = true;
  return out;
}

void Stream::cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (final_taken_) return;
  }
  if (auto mailbox = mailbox_.lock()) (void)client_detail::post_cancel(*mailbox, id_);
}

bool Stream::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return final_taken_;
}

// ---- Client ----

namespace {

// The Core for `options`: checked, its sockets made and connected, its I/O thread not started.
Result<std::unique_ptr<Core>> open_core(ClientOptions options) {
  if (options.endpoint.empty()) return Status::invalid("client: an endpoint is required");
  if (options.heartbeat_interval.count() <= 0) return Status::invalid("client: heartbeat interval must be positive");
  if (options.request_timeout.count() <= 0) return Status::invalid("client: request timeout must be positive");
  if (options.deadline_grace.count() < 0 || options.liveness_timeout.count() < 0)
    return Status::invalid("client: deadline grace and liveness timeout must not be negative");
  for (auto* d :
       {&options.heartbeat_interval, &options.request_timeout, &options.deadline_grace, &options.liveness_timeout})
    *d = client_detail::at_most_never(*d);
  try {
    zmq::context_t context(1);
    zmq::socket_t dealer(context, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 200);  // bounded wait for the last cancels at close
    dealer.set(zmq::sockopt::sndhwm, 100000);
    dealer.set(zmq::sockopt::rcvhwm, 100000);
    dealer.set(zmq::sockopt::maxmsgsize, int64_t{64} << 20);
    dealer.set(zmq::sockopt::heartbeat_ivl, 1000);  // ZMTP pings find a dead TCP peer
    dealer.set(zmq::sockopt::heartbeat_timeout, 5000);
    if (!options.curve_server_key.empty())
      if (Status st = runtime::apply_curve(dealer.handle(), {options.curve_server_key, {}}); !st)
        return Status::invalid("client: curve_server_key: " + st.message());
    const std::string monitor_endpoint = "inproc://tandem-client-monitor";
    if (zmq_socket_monitor(dealer.handle(), monitor_endpoint.c_str(), ZMQ_EVENT_DISCONNECTED) != 0)
      return Status::error(Code::kInternal, std::string("client: socket monitor: ") + zmq_strerror(zmq_errno()));
    zmq::socket_t monitor(context, zmq::socket_type::pair);
    monitor.set(zmq::sockopt::linger, 0);
    monitor.connect(monitor_endpoint);
    if (zmq_connect(dealer.handle(), options.endpoint.c_str()) != 0)
      return Status::invalid("client: cannot connect to '" + options.endpoint + "': " + zmq_strerror(zmq_errno()));
    auto core = std::make_unique<Core>(std::move(options), std::move(context), std::move(dealer), std::move(monitor));
    if (!core->wake_ok()) return Status::error(Code::kInternal, "client: eventfd failed");
    return core;
  } catch (const zmq::error_t& e) {
    return Status::error(Code::kInternal, std::string("client: ") + e.what());
  }
}

v1::ClientMessage submit_message(const GenerateRequest& r) {
  auto m = client_detail::envelope();
  v1::Submit* s = m.mutable_submit();
  s->set_request_id(r.id);
  if (!r.prompt_tokens.empty()) {
    s->mutable_tokens()->mutable_ids()->Add(r.prompt_tokens.begin(), r.prompt_tokens.end());
  } else {
    s->set_text(r.prompt_text);
  }
  s->set_no_bos(r.no_bos);
  model::to_proto({r.temperature, r.top_k, r.top_p, r.min_p, r.repetition_penalty, r.seed, r.top_logprobs},
                  s->mutable_sampling());
  s->set_max_tokens(r.max_tokens);
  for (const auto& seq : r.stop_token_sequences)
    s->add_stop_token_sequences()->mutable_ids()->Add(seq.begin(), seq.end());
  for (const auto& str : r.stop_strings) s->add_stop_strings(str);
  s->set_include_stop_string(r.include_stop_string);
  s->set_ignore_eos(r.ignore_eos);
  s->set_logprobs(r.logprobs);
  s->set_stream(r.stream);
  s->set_priority(r.priority);
  s->set_timeout_ms(static_cast<uint32_t>(r.timeout.count()));
  return m;
}

}  // namespace

static std::string submit(Core& core, GenerateRequest& request, std::shared_ptr<Stream> stream,
                          std::function<void(const Event&)> on_event, Clock::time_point now) {
  if (request.id.empty()) request.id = core.next_id();
  std::optional<Event> refused;
  if (request.timeout.count() < 0 || request.timeout.count() > UINT32_MAX)
    refused = client_detail::final_error(Code::kInvalidArgument, "timeout must be in [0, 2^32) ms");
  Command c;
  c.kind = Command::Kind::kSubmit;
  c.id = request.id;
  if (!refused) c.wire = client_detail::wire(submit_message(request));
  if (request.timeout.count() > 0) c.deadline = now + request.timeout + core.options().deadline_grace;
  c.stream = stream;
  c.on_event = on_event;
  if (!refused && core.mailbox()->post(std::move(c))) return request.id;
  Core::deliver(
      stream, on_event,
      refused ? std::move(*refused) : client_detail::final_error(Code::kUnavailable, core.mailbox()->why_closed()));
  return request.id;
}

std::shared_ptr<Stream> Core::generate(GenerateRequest request, Clock::time_point now) {
  if (request.id.empty()) request.id = next_id();
  std::shared_ptr<Stream> stream(new Stream(request.id, mailbox_));
  submit(*this, request, stream, nullptr, now);
  return stream;
}

std::string Core::generate(GenerateRequest request, std::function<void(const Event&)> on_event, Clock::time_point now) {
  return submit(*this, request, nullptr, std::move(on_event), now);
}

std::future<Result<StatusInfo>> Core::post_status(std::chrono::milliseconds timeout, Clock::time_point now) {
  Command c;
  c.kind = Command::Kind::kStatus;
  c.deadline = now + client_detail::at_most_never(timeout);
  c.reply = std::make_shared<std::promise<Result<StatusInfo>>>();
  const auto reply = c.reply;
  auto future = reply->get_future();
  if (!mailbox_->post(std::move(c))) reply->set_value(Status::error(Code::kUnavailable, mailbox_->why_closed()));
  return future;
}

Client::Client(std::unique_ptr<Core> core) : core_(std::move(core)) {}

Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::connect(ClientOptions options) {
  auto core = open_core(std::move(options));
  if (!core) return core.status();
  (*core)->start();
  return std::unique_ptr<Client>(new Client(std::move(core.value())));
}

std::shared_ptr<Stream> Client::generate(GenerateRequest request) {
  return core_->generate(std::move(request), Clock::now());
}

std::string Client::generate(GenerateRequest request, std::function<void(const Event&)> on_event) {
  return core_->generate(std::move(request), std::move(on_event), Clock::now());
}

Status Client::cancel(const std::string& id) {
  if (id.empty()) return Status::invalid("cancel: empty request id");
  if (!client_detail::post_cancel(*core_->mailbox(), id))
    return Status::error(Code::kUnavailable, core_->mailbox()->why_closed());
  return Status::ok();
}

Result<StatusInfo> Client::status() { return status(core_->options().request_timeout); }

Result<StatusInfo> Client::status(std::chrono::milliseconds timeout) {
  if (core_->on_io_thread())
    return Status::error(Code::kInternal, "status() called from an event callback (the client's I/O thread)");
  if (timeout.count() <= 0) return Status::invalid("status: timeout must be positive");
  timeout = client_detail::at_most_never(timeout);
  auto future = core_->post_status(timeout, Clock::now());
  // The I/O thread answers by the deadline; the extra second only guards against a stuck loop.
  if (future.wait_for(timeout + std::chrono::seconds(1)) != std::future_status::ready)
    return Status::error(Code::kUnavailable, "status: no reply from the client's I/O thread");
  return future.get();
}

// ---- ClientHarness ----

struct ClientHarness::Impl {
  std::unique_ptr<Core> core;
  Clock::time_point now;
  bool loop_ended = false;
  // One pass of the I/O thread, as after a wake-up: the commands posted, then `step` (a
  // message, a lost connection), then the timers.
  void pass(const std::function<void()>& step = nullptr) {
    if (loop_ended) return;
    (void)core->handle_mailbox(now);
    if (step) step();
    core->on_timers(now);
  }
};

Result<std::unique_ptr<ClientHarness>> ClientHarness::create(ClientOptions options) {
  auto core = open_core(std::move(options));
  if (!core) return core.status();
  std::unique_ptr<ClientHarness> h(new ClientHarness());
  h->impl_ = std::make_unique<Impl>(Impl{std::move(core.value()), Clock::now(), false});
  return h;
}

ClientHarness::~ClientHarness() {
  if (impl_->loop_ended) return;
  impl_->core->close_mailbox();
  impl_->core->shutdown();
}

std::shared_ptr<Stream> ClientHarness::generate(GenerateRequest request) {
  auto stream = impl_->core->generate(std::move(request), impl_->now);
  impl_->pass();
  return stream;
}

std::string ClientHarness::generate(GenerateRequest request, std::function<void(const Event&)> on_event) {
  std::string id = impl_->core->generate(std::move(request), std::move(on_event), impl_->now);
  impl_->pass();
  return id;
}

void ClientHarness::cancel(const std::string& id) {
  (void)client_detail::post_cancel(*impl_->core->mailbox(), id);
  impl_->pass();
}

std::future<Result<StatusInfo>> ClientHarness::status(std::chrono::milliseconds timeout) {
  auto future = impl_->core->post_status(timeout, impl_->now);
  impl_->pass();
  return future;
}

void ClientHarness::scheduler(const runtime::Frames& frames) {
  impl_->pass([&] { impl_->core->on_message(frames, impl_->now); });
}

void ClientHarness::disconnected() {
  impl_->pass([&] { impl_->core->on_disconnected(); });
}

void ClientHarness::poll_failed(int err) {
  if (impl_->loop_ended) return;
  impl_->core->on_poll_failed(err);
  impl_->core->shutdown();
  impl_->loop_ended = true;
}

void ClientHarness::advance(std::chrono::milliseconds elapsed) {
  impl_->now += elapsed;
  impl_->pass();
}

}  // namespace tandem
