// libtandem-client. Each Client owns a runtime::EventLoop on a thread of its own. The loop
// owns the DEALER (made by the EventLoop, with its limits, linger, CurveZMQ and heartbeats),
// a monitor of it that reports a lost connection, every request's routing state and the
// timers (heartbeats, deadlines, the liveness probe, status timeouts). Public calls reach the
// loop only through the Gate, which posts work onto it until the client closes.
#include "tandem/client.h"

#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <random>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include "client/harness.h"
#include "client/prometheus.h"
#include "client/sampling.h"
#include "runtime/event_loop.h"
#include "runtime/mutex.h"
#include "runtime/sampling_proto.h"
#include "runtime/wire.h"
#include "tandem/v1/client.pb.h"

namespace tandem {

namespace client_detail {

using Clock = std::chrono::steady_clock;
using runtime::Mutex;
using runtime::MutexLock;

namespace {

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
    case v1::ERROR_CODE_PERMISSION_DENIED: return Code::kPermissionDenied;
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
  fin.error_message = f.error_message();
  if (fin.reason == FinishReason::kError) {
    fin.code = from_wire(f.error_code());
    fin.error_code = code_name(fin.code);
    if (f.finish_reason() != v1::FINISH_REASON_ERROR && fin.error_message.empty())
      fin.error_message = "scheduler sent a final event without a finish reason";
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

// Copies every field of `info` from the field of `m` it names (protobuf reflection: the
// field list is list_status_fields' alone). A member type that is not the wire field's is a
// bug in that list; the status tests read every field.
template <class Info>
void copy_fields(const google::protobuf::Message& m, Info& info) {
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  visit_status_fields(info, [&](const char*, const char* wire, auto& member) {
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
  for (int i = 0; i < s.workers_size(); ++i) copy_fields(s.workers(i), info.workers[i]);
  copy_fields(s, info);
  return info;
}

// A ClientMessage of this client's protocol version, its body set by `body`, serialized.
template <class Body>
std::string client_message(Body body) {
  v1::ClientMessage m;
  m.set_version(v1::PROTOCOL_VERSION_CURRENT);
  body(m);
  return m.SerializeAsString();
}

std::string status_query(uint64_t query_id) {
  return client_message([&](v1::ClientMessage& m) { m.mutable_status()->set_query_id(query_id); });
}

// Durations past this are taken as it: a century means "never", and twice it added to a
// steady_clock time (nanoseconds, 292 years of range) cannot overflow.
constexpr std::chrono::milliseconds kNever = std::chrono::hours(24 * 365 * 100);
std::chrono::milliseconds at_most_never(std::chrono::milliseconds d) { return std::min(d, kNever); }

std::string ms_string(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

void to_wire(const std::vector<ChatMessage>& messages, const std::string& tools_json, bool add_generation_prompt,
             v1::Chat* chat) {
  for (const ChatMessage& m : messages) {
    v1::ChatMessage* w = chat->add_messages();
    w->set_role(m.role);
    if (m.content) w->set_content(*m.content);
    w->set_name(m.name);
    w->set_tool_call_id(m.tool_call_id);
    w->set_tool_calls_json(m.tool_calls_json);
  }
  chat->set_tools_json(tools_json);
  chat->set_no_generation_prompt(!add_generation_prompt);
}

std::string tokenize_message(const TokenizeRequest& r, uint64_t query_id, bool count_only) {
  return client_message([&](v1::ClientMessage& m) {
    v1::TokenizeQuery* q = m.mutable_tokenize();
    q->set_query_id(query_id);
    if (!r.messages.empty()) {
      to_wire(r.messages, r.tools_json, r.add_generation_prompt, q->mutable_chat());
    } else {
      q->set_text(r.text);
    }
    q->set_no_bos(r.no_bos);
    q->set_count_only(count_only);
  });
}

std::string submit_message(const GenerateRequest& r) {
  return client_message([&](v1::ClientMessage& m) {
    v1::Submit* s = m.mutable_submit();
    s->set_request_id(r.id);
    if (!r.prompt_tokens.empty()) {
      s->mutable_tokens()->mutable_ids()->Add(r.prompt_tokens.begin(), r.prompt_tokens.end());
    } else if (!r.messages.empty()) {
      to_wire(r.messages, r.tools_json, r.add_generation_prompt, s->mutable_chat());
    } else {
      s->set_text(r.prompt_text);
    }
    s->set_no_bos(r.no_bos);
    model::to_proto(sampling_params(r), s->mutable_sampling());
    s->set_max_tokens(r.max_tokens);
    for (const auto& seq : r.stop_token_sequences)
      s->add_stop_token_sequences()->mutable_ids()->Add(seq.begin(), seq.end());
    for (const auto& str : r.stop_strings) s->add_stop_strings(str);
    s->set_include_stop_string(r.include_stop_string);
    s->set_ignore_eos(r.ignore_eos);
    s->set_logprobs(r.logprobs);
    s->set_stream(r.stream);
    s->set_priority(r.priority);
    s->set_principal(r.principal);
    s->set_timeout_ms(static_cast<uint32_t>(r.timeout.count()));
    if (r.spec_tokens) s->set_spec_tokens(*r.spec_tokens);
  });
}

// What of `r` is over the limits the scheduler admits (its messages too: a message larger than
// its socket takes would drop the connection), in the scheduler's words; "" when nothing.
std::string over_wire_limits(const GenerateRequest& r) {
  if (r.id.size() > runtime::kMaxRequestIdBytes)
    return "request_id: " + std::to_string(r.id.size()) + " bytes, at most " +
           std::to_string(runtime::kMaxRequestIdBytes);
  if (r.principal.size() > runtime::kMaxPrincipalBytes)
    return "principal: " + std::to_string(r.principal.size()) + " bytes, at most " +
           std::to_string(runtime::kMaxPrincipalBytes);
  if (!r.prompt_tokens.empty()) return "";
  size_t bytes = r.messages.empty() ? r.prompt_text.size() : r.tools_json.size();
  for (const ChatMessage& m : r.messages)
    bytes += m.role.size() + m.content.value_or("").size() + m.name.size() + m.tool_call_id.size() +
             m.tool_calls_json.size();
  if (bytes <= runtime::kMaxPromptBytes) return "";
  return (r.messages.empty() ? "prompt: text of " : "messages: conversation of ") + std::to_string(bytes) +
         " bytes, at most " + std::to_string(runtime::kMaxPromptBytes);
}

// The delay from `now` until `due`, rounded up: a timer never fires before its due time.
std::chrono::milliseconds until(Clock::time_point due, Clock::time_point now) {
  return std::chrono::ceil<std::chrono::milliseconds>(std::max(due - now, Clock::duration::zero()));
}

std::string random_id_prefix() {
  std::random_device rd;
  char buf[32];
  std::snprintf(buf, sizeof buf, "c%08x%08x-", rd(), rd());
  return buf;
}

}  // namespace

struct Tokenized {
  std::vector<int32_t> ids;
  size_t count = 0;
};

// What runs a Core: in a Client, its EventLoop on the loop's thread; in ClientHarness, the
// harness's calls and a clock it moves.
class Driver {
 public:
  virtual ~Driver() = default;
  virtual Clock::time_point now() = 0;
  // Queues fn to run on the loop after everything queued before it. Any thread.
  virtual void post(std::function<void()> fn) = 0;
  // Runs fn on the loop after `delay`, unless the returned handle has died by then.
  virtual std::shared_ptr<void> after(std::chrono::milliseconds delay, std::function<void()> fn) = 0;
};

class LoopDriver final : public Driver {
 public:
  explicit LoopDriver(runtime::EventLoop& loop) : loop_(loop) {}
  Clock::time_point now() override { return Clock::now(); }
  void post(std::function<void()> fn) override { runtime::asio::post(loop_.io(), std::move(fn)); }
  std::shared_ptr<void> after(std::chrono::milliseconds delay, std::function<void()> fn) override {
    return loop_.after(delay, std::move(fn));
  }

 private:
  runtime::EventLoop& loop_;
};

// A Stream's events: pushed on the loop's thread, taken on the user's.
class EventQueue {
 public:
  void push(Event event) TANDEM_EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      events_.push_back(std::move(event));
    }
    cv_.notify_all();
  }
  // The next event, waiting for one until `until`. Nothing when none came in time or the
  // final event has been taken.
  std::optional<Event> take(Clock::time_point until) TANDEM_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    bool in_time = true;
    while (events_.empty() && !final_taken_ && in_time) in_time = cv_.wait_until(mu_, until);
    if (events_.empty()) return std::nullopt;
    std::optional<Event> out(std::move(events_.front()));
    events_.pop_front();
    if (out->final) final_taken_ = true;
    return out;
  }
  bool final_taken() const TANDEM_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return final_taken_;
  }

 private:
  mutable Mutex mu_;
  runtime::CondVar cv_;
  std::deque<Event> events_ TANDEM_GUARDED_BY(mu_);
  bool final_taken_ TANDEM_GUARDED_BY(mu_) = false;
};

class Core;

// The way in from user threads: work posted here runs on the loop, in order, until the
// client closes; from then on it is refused, and why_closed() says why.
class Gate {
 public:
  explicit Gate(Core& core) : core_(core) {}
  // False (fn dropped) once closed.
  bool post(std::function<void(Core&)> fn) TANDEM_EXCLUDES(mu_);
  // False when closed already: the first reason stays.
  bool close(const std::string& why) TANDEM_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (why_closed_) return false;
    why_closed_ = why;
    return true;
  }
  std::string why_closed() const TANDEM_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return why_closed_.value_or("");
  }

 private:
  Core& core_;  // used only while open: the Core closes the gate before it goes
  mutable Mutex mu_;
  std::optional<std::string> why_closed_ TANDEM_GUARDED_BY(mu_);
};

// The client's loop side. Its state is the loop thread's alone; user threads reach it
// through the Gate (and read only the constants and the id counter).
class Core {
 public:
  // `driver` null: the EventLoop's own (a Client). Nothing runs until start().
  Core(ClientOptions options, std::unique_ptr<Driver> driver)
      : options_(std::move(options)),
        loop_(receive_limits()),
        driver_(driver ? std::move(driver) : std::make_unique<LoopDriver>(loop_)),
        gate_(std::make_shared<Gate>(*this)),
        id_prefix_(random_id_prefix()),
        heartbeat_wire_(client_message([](v1::ClientMessage& m) { m.mutable_heartbeat(); })) {}

  ~Core() {
    // Work the gate took runs before shutdown(); a loop that failed has closed it and stopped.
    if (gate_->close("client closed")) runtime::asio::post(loop_.io(), [this] { shutdown("client closed"); });
    if (thread_.joinable()) thread_.join();
  }

  // What the client takes from the scheduler: messages up to kClientReceiveLimitBytes.
  static runtime::SocketLimits receive_limits() {
    runtime::SocketLimits l;
    l.max_message_bytes = runtime::kClientReceiveLimitBytes;
    return l;
  }

  // Makes the DEALER and its monitor, connected (ZeroMQ connects lazily: a scheduler not up
  // yet is not an error).
  Status open() {
    if (!options_.curve_server_key.empty())
      loop_.use_curve({options_.curve_server_key, {}, options_.curve_public_key, options_.curve_secret_key});
    auto dealer = loop_.connect(zmq::socket_type::dealer, options_.endpoint,
                                [this](runtime::Frames& frames) { on_message(frames, driver_->now()); });
    if (!dealer) return Status::invalid("client: " + dealer.status().message());
    dealer_ = std::move(dealer).value();
    const std::string monitor_endpoint = "inproc://tandem-client-monitor";
    if (zmq_socket_monitor(dealer_->raw().handle(), monitor_endpoint.c_str(), ZMQ_EVENT_DISCONNECTED) != 0)
      return Status::error(Code::kInternal, std::string("client: socket monitor: ") + zmq_strerror(zmq_errno()));
    auto monitor = loop_.connect(zmq::socket_type::pair, monitor_endpoint, [this](runtime::Frames& frames) {
      uint16_t event = 0;  // frame 0: the event (16 bits) and its value; frame 1: the endpoint
      if (!frames.empty() && frames[0].size() >= sizeof event) std::memcpy(&event, frames[0].data(), sizeof event);
      if (event == ZMQ_EVENT_DISCONNECTED) on_disconnected();
    });
    if (!monitor) return Status::error(Code::kInternal, "client: socket monitor: " + monitor.status().message());
    monitor_ = std::move(monitor).value();
    for (runtime::Socket* s : {dealer_.get(), monitor_.get()})
      s->on_failure([this](const char* what, int err) { on_loop_failed(what, err); });
    return Status::ok();
  }

  // Runs the loop on a thread of its own, which takes no signals (a CLI's SIGINT handler
  // runs on its own threads).
  void start() {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    thread_ = std::thread([this] {
      loop_.run();  // until shutdown() stops it
      if (closing_) return;
      shutdown("the client's I/O loop stopped");  // run() ended by itself: an exception escaped
      loop_.run();                                // refuses the work the gate took before closing
    });
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    loop_thread_id_ = thread_.get_id();
  }

  // ---- any thread ----

  std::string next_id() { return id_prefix_ + std::to_string(counter_.fetch_add(1, std::memory_order_relaxed)); }
  const ClientOptions& options() const { return options_; }
  Gate& gate() { return *gate_; }
  bool on_loop_thread() const { return std::this_thread::get_id() == loop_thread_id_; }

  std::shared_ptr<Stream> generate(GenerateRequest request) {
    if (request.id.empty()) request.id = next_id();
    std::shared_ptr<Stream> stream(new Stream(request.id, gate_));
    submit(request, [events = stream->events_](Event event) { events->push(std::move(event)); });
    return stream;
  }
  std::string generate(GenerateRequest request, std::function<void(const Event&)> on_event) {
    if (request.id.empty()) request.id = next_id();
    submit(request, [on_event = std::move(on_event)](Event event) {
      if (!on_event) return;
      try {
        on_event(event);
      } catch (const std::exception& e) {
        spdlog::error("tandem client: an event callback threw: {}", e.what());
      } catch (...) {
        spdlog::error("tandem client: an event callback threw");
      }
    });
    return request.id;
  }
  // Asks the loop to cancel request `id`; false once the client is closing.
  static bool post_cancel(Gate& gate, const std::string& id) {
    return gate.post([id](Core& core) {
      if (!core.closing_ && core.live_.count(id)) core.send_cancel(id);
    });
  }
  // A future that holds UNAVAILABLE (why the client closed) at once when it is closed.
  std::future<Result<StatusInfo>> post_status(std::chrono::milliseconds timeout) {
    auto reply = std::make_shared<std::promise<Result<StatusInfo>>>();
    auto future = reply->get_future();
    const Clock::time_point due = driver_->now() + at_most_never(timeout);
    if (!gate_->post([reply, due](Core& core) { core.on_status(reply, due); }))
      reply->set_value(Status::error(Code::kUnavailable, gate_->why_closed()));
    return future;
  }

  // A tokenize query's answer: the ids (none with count_only) and their count.
  std::future<Result<Tokenized>> post_tokenize(const TokenizeRequest& request, bool count_only,
                                               std::chrono::milliseconds timeout) {
    return post_query<Tokenized>(
        timeout, [request, count_only](uint64_t id) { return tokenize_message(request, id, count_only); },
        &Core::tokenize_waiters_, "tokenize");
  }

  // A metrics query's answer: the Prometheus text.
  std::future<Result<std::string>> post_metrics(std::chrono::milliseconds timeout) {
    return post_query<std::string>(
        timeout,
        [](uint64_t id) {
          return client_message([&](v1::ClientMessage& m) { m.mutable_metrics()->set_query_id(id); });
        },
        &Core::metrics_waiters_, "metrics");
  }

  // ---- the loop's thread (ClientHarness calls these directly) ----

  Driver& driver() { return *driver_; }

  // One message from the scheduler, all its frames, as the DEALER delivers it. Each is one
  // frame holding a SchedulerReply; anything else is dropped (and logged). Any message at
  // all counts as a sign of life.
  void on_message(const runtime::Frames& frames, Clock::time_point now) {
    quiet_since_ = now;
    if (frames.size() != 1)
      return spdlog::warn("tandem client: dropped a message of {} frames from the scheduler", frames.size());
    // A message of its own per call. A reused member saved nothing (clearing the oneof body frees
    // the EventBatch whole) and, under ASan/UBSan in the out-of-descriptors gateway test, its
    // cleared body was found freed already (an invalid vptr): not worth the risk.
    v1::SchedulerReply reply;
    if (!reply.ParseFromArray(frames[0].data(), static_cast<int>(frames[0].size())))
      return spdlog::warn("tandem client: dropped an unparsable message from the scheduler");
    on_reply(reply);
  }

  void on_disconnected() {
    // Messages to and from the requests in flight may be lost with the connection (and
    // a restarted scheduler does not know them): end them now rather than at a deadline.
    const std::string msg = "connection to the scheduler at " + options_.endpoint + " lost";
    if (!live_.empty() || !waiters_.empty()) spdlog::warn("tandem client: {}", msg);
    fail_all(Code::kUnavailable, msg);
  }

  // The loop cannot go on (`what` failed with `err` on a socket): the client ends with this cause.
  void on_loop_failed(const char* what, int err) {
    const std::string why = std::string("the client's I/O loop stopped: ") + what + " failed: " + zmq_strerror(err);
    spdlog::error("tandem client: {}", why);
    shutdown(why);
  }

  // Ends the client: the gate closes (with `why` unless it was closed already), every request
  // in flight is cancelled at the scheduler and ends with UNAVAILABLE and the reason it
  // closed, as does every status query; the work the gate took before closing is refused
  // when it runs, and then the loop stops.
  void shutdown(const std::string& why) {
    if (closing_) return;
    closing_ = true;
    gate_->close(why);
    const std::string reason = gate_->why_closed();
    for (const auto& [id, live] : live_) send_cancel(id);
    fail_all(Code::kUnavailable, reason);
    monitor_.reset();
    dealer_.reset();  // ZMQ_LINGER bounds how long the cancels above may wait to go out
    runtime::asio::post(loop_.io(), [this] { loop_.stop(); });
  }

 private:
  // Where a request's events go: its Stream's queue, or its callback (on the loop's thread).
  using Sink = std::function<void(Event)>;
  struct Live {
    Sink sink;
    std::shared_ptr<void> deadline;  // the timer that ends it past its deadline and grace
  };
  // A query the scheduler answers by query id (tokenize, metrics), waiting for its reply.
  template <class T>
  struct QueryWaiter {
    std::shared_ptr<std::promise<Result<T>>> reply;
    std::shared_ptr<void> timeout;
    std::vector<int32_t> ids;  // of the parts received so far (a reply over 16 KiB comes in parts)
  };
  template <class T>
  using QueryWaiters = std::unordered_map<uint64_t, QueryWaiter<T>>;
  using MessageFor = std::function<std::string(uint64_t query_id)>;

  // Sends message(a new query id) from the loop and returns the future its reply (or
  // UNAVAILABLE: the client closed, the send failed, no reply by `timeout`) is set in.
  template <class T>
  std::future<Result<T>> post_query(std::chrono::milliseconds timeout, MessageFor message,
                                    QueryWaiters<T> Core::*waiters, const char* what) {
    auto reply = std::make_shared<std::promise<Result<T>>>();
    auto future = reply->get_future();
    const Clock::time_point due = driver_->now() + at_most_never(timeout);
    if (!gate_->post([reply, due, message = std::move(message), waiters, what](Core& core) {
          core.on_query(reply, due, message, waiters, what);
        }))
      reply->set_value(Status::error(Code::kUnavailable, gate_->why_closed()));
    return future;
  }

  template <class T>
  void on_query(std::shared_ptr<std::promise<Result<T>>> reply, Clock::time_point due, const MessageFor& message,
                QueryWaiters<T> Core::*waiters, const char* what) {
    if (closing_) return reply->set_value(Status::error(Code::kUnavailable, gate_->why_closed()));
    const uint64_t query_id = ++last_query_id_;
    if (!send(message(query_id)))
      return reply->set_value(
          Status::error(Code::kUnavailable, "cannot send to the scheduler at " + options_.endpoint));
    auto timeout = driver_->after(until(due, driver_->now()), [this, query_id, waiters, what] {
      answer_query(
          this->*waiters, query_id,
          Result<T>(Status::error(Code::kUnavailable,
                                  std::string("no ") + what + " reply from the scheduler at " + options_.endpoint)));
    });
    (this->*waiters)[query_id] = QueryWaiter<T>{std::move(reply), std::move(timeout)};
  }

  template <class T>
  static void answer_query(QueryWaiters<T>& waiters, uint64_t query_id, Result<T> result) {
    auto it = waiters.find(query_id);
    if (it == waiters.end()) return;  // answered or timed out already
    QueryWaiter<T> w = std::move(it->second);
    waiters.erase(it);
    w.reply->set_value(std::move(result));
  }

  template <class T>
  static void fail_queries(QueryWaiters<T>& waiters, Code code, const std::string& message) {
    QueryWaiters<T> failing;
    failing.swap(waiters);
    for (auto& [id, w] : failing) w.reply->set_value(Status::error(code, message));
  }
  struct Waiter {
    uint64_t query_id = 0;
    std::shared_ptr<std::promise<Result<StatusInfo>>> reply;  // null: a liveness probe
    std::shared_ptr<void> timeout;
    std::optional<v1::StatusReply> partial;  // the parts received so far of a reply in parts
  };

  // A refused request's final event is delivered at once, on the calling thread.
  void submit(const GenerateRequest& r, Sink sink) {
    if (r.timeout.count() < 0 || r.timeout.count() > UINT32_MAX)
      return sink(final_error(Code::kInvalidArgument, "timeout must be in [0, 2^32) ms"));
    if (std::string too_large = over_wire_limits(r); !too_large.empty())
      return sink(final_error(Code::kInvalidArgument, too_large));
    std::optional<Clock::time_point> due;
    if (r.timeout.count() > 0) due = driver_->now() + r.timeout + options_.deadline_grace;
    if (!gate_->post(
            [id = r.id, bytes = submit_message(r), due, sink](Core& core) { core.on_submit(id, bytes, due, sink); }))
      sink(final_error(Code::kUnavailable, gate_->why_closed()));
  }

  void on_submit(const std::string& id, const std::string& bytes, std::optional<Clock::time_point> due,
                 const Sink& sink) {
    if (closing_) return sink(final_error(Code::kUnavailable, gate_->why_closed()));
    if (live_.count(id))
      return sink(final_error(Code::kInvalidArgument, "request id '" + id + "' is already in flight"));
    if (!send(bytes))
      return sink(final_error(Code::kUnavailable, "cannot send to the scheduler at " + options_.endpoint));
    if (live_.empty()) {  // requests go in flight: heartbeats and liveness checks start
      quiet_since_ = driver_->now();
      beat_later();
      arm_liveness();
    }
    Live& live = live_[id];
    live.sink = sink;
    if (due) live.deadline = driver_->after(until(*due, driver_->now()), [this, id] { on_deadline(id); });
  }

  void on_deadline(const std::string& id) {
    send_cancel(id);
    finish(id,
           final_error(Code::kUnavailable, "no final event from the scheduler at " + options_.endpoint + " within " +
                                               ms_string(options_.deadline_grace) + " of the request's deadline"));
  }

  void beat_later() {
    heartbeat_ = driver_->after(options_.heartbeat_interval, [this] {
      (void)send(heartbeat_wire_);
      beat_later();
    });
  }

  // Arms the liveness check for when it is next due: a probe after liveness_timeout of
  // silence, failure after twice that. Off when the timeout is 0.
  void arm_liveness() {
    const std::chrono::milliseconds t = options_.liveness_timeout;
    if (t.count() == 0) return;
    const Clock::time_point due = quiet_since_ + (probe_outstanding_ ? 2 * t : t);
    liveness_ = driver_->after(until(due, driver_->now()), [this] { check_liveness(); });
  }

  void check_liveness() {
    const std::chrono::milliseconds t = options_.liveness_timeout;
    const Clock::time_point now = driver_->now();
    if (now >= quiet_since_ + 2 * t)
      return fail_requests(Code::kUnavailable, "the scheduler at " + options_.endpoint + " sent nothing for " +
                                                   ms_string(2 * t) + " and did not answer a probe");
    if (now >= quiet_since_ + t && !probe_outstanding_) {
      (void)send(status_query(++last_query_id_));  // unsent, the probe simply goes unanswered
      add_waiter(last_query_id_, now + t, nullptr);
      probe_outstanding_ = true;
    }
    arm_liveness();
  }

  void on_status(std::shared_ptr<std::promise<Result<StatusInfo>>> reply, Clock::time_point due) {
    if (closing_) return reply->set_value(Status::error(Code::kUnavailable, gate_->why_closed()));
    if (!send(status_query(++last_query_id_)))
      return reply->set_value(
          Status::error(Code::kUnavailable, "cannot send to the scheduler at " + options_.endpoint));
    add_waiter(last_query_id_, due, std::move(reply));
  }

  // A tokenize reply or a part of one (`more`: the ids continue in the next).
  void on_tokenized(const v1::TokenizeReply& t) {
    if (t.error_code() != v1::ERROR_CODE_UNSPECIFIED)
      return answer_query(tokenize_waiters_, t.query_id(),
                          Result<Tokenized>(Status::error(from_wire(t.error_code()), t.error_message())));
    auto it = tokenize_waiters_.find(t.query_id());
    if (it == tokenize_waiters_.end()) return;  // answered or timed out already
    std::vector<int32_t>& ids = it->second.ids;
    ids.insert(ids.end(), t.ids().begin(), t.ids().end());
    if (ids.size() > t.count())
      return answer_query(tokenize_waiters_, t.query_id(),
                          Result<Tokenized>(Status::error(Code::kInternal, "tokenize reply: more ids than its count")));
    if (t.more()) return;
    std::vector<int32_t> all = std::move(ids);
    answer_query(tokenize_waiters_, t.query_id(), Result<Tokenized>(Tokenized{std::move(all), t.count()}));
  }

  void add_waiter(uint64_t query_id, Clock::time_point due, std::shared_ptr<std::promise<Result<StatusInfo>>> reply) {
    auto timeout = driver_->after(until(due, driver_->now()), [this, query_id] {
      auto it = find_waiter(query_id);
      if (it != waiters_.end())
        answer(it, Status::error(Code::kUnavailable, "no status reply from the scheduler at " + options_.endpoint));
    });
    waiters_.push_back(Waiter{query_id, std::move(reply), std::move(timeout)});
  }

  std::deque<Waiter>::iterator find_waiter(uint64_t query_id) {
    return std::find_if(waiters_.begin(), waiters_.end(), [&](const Waiter& w) { return w.query_id == query_id; });
  }

  // Takes a waiter out and answers it; an answered probe re-arms the liveness check.
  void answer(std::deque<Waiter>::iterator it, Result<StatusInfo> result) {
    Waiter w = std::move(*it);
    waiters_.erase(it);
    if (w.reply) {
      w.reply->set_value(std::move(result));
    } else {
      probe_outstanding_ = false;
      if (liveness_) arm_liveness();
    }
  }

  // Sends one frame without blocking; false when it cannot go (the queue to the scheduler is full).
  bool send(const std::string& bytes) {
    if (!dealer_) return false;
    if (auto sent = dealer_->send_bytes(bytes); !sent) {
      spdlog::warn("tandem client: send to {} failed: {}", options_.endpoint, sent.message());
      return false;
    }
    return true;
  }

  void send_cancel(const std::string& id) {
    (void)send(client_message([&](v1::ClientMessage& m) { m.mutable_cancel()->set_request_id(id); }));
  }

  void finish(const std::string& id, Event event) {
    auto it = live_.find(id);
    if (it == live_.end()) return;
    Live live = std::move(it->second);  // its deadline timer dies with it
    live_.erase(it);
    if (live_.empty()) {
      heartbeat_.reset();
      liveness_.reset();
    }
    live.sink(std::move(event));
  }

  // Ends every request in flight with this error.
  void fail_requests(Code code, const std::string& message) {
    while (!live_.empty()) {
      const std::string id = live_.begin()->first;
      finish(id, final_error(code, message));
    }
  }

  // Ends every request in flight and every status query with this error.
  void fail_all(Code code, const std::string& message) {
    fail_requests(code, message);
    std::deque<Waiter> waiters;
    waiters.swap(waiters_);
    for (Waiter& w : waiters)
      if (w.reply) w.reply->set_value(Status::error(code, message));
    probe_outstanding_ = false;
    fail_queries(tokenize_waiters_, code, message);
    fail_queries(metrics_waiters_, code, message);
  }

  void on_reply(const v1::SchedulerReply& reply) {
    if (reply.version() != v1::PROTOCOL_VERSION_CURRENT) {
      const std::string msg = "the scheduler speaks protocol version " + std::to_string(reply.version()) +
                              ", this client " + std::to_string(v1::PROTOCOL_VERSION_CURRENT);
      spdlog::error("tandem client: {}", msg);
      return fail_all(Code::kUnavailable, msg);
    }
    switch (reply.body_case()) {
      case v1::SchedulerReply::kEvents: {
        for (const v1::RequestEvents& ev : reply.events().requests()) {
          auto it = live_.find(ev.request_id());
          if (it == live_.end()) continue;  // late events of a request that already ended here
          for (const auto& t : ev.tokens()) it->second.sink(from_wire(t));
          if (ev.has_final()) finish(ev.request_id(), from_wire(ev.final()));
        }
        return;
      }
      case v1::SchedulerReply::kStatus: {
        // A scheduler that echoes no query id answers in order; a reply whose query already
        // timed out here matches no waiter and is dropped.
        const uint64_t id = reply.status().query_id();
        auto it = id == 0 ? waiters_.begin() : find_waiter(id);
        if (it == waiters_.end()) return;
        if (!it->partial && !reply.status().more()) return answer(it, from_wire(reply.status()));
        if (!it->partial)
          it->partial = reply.status();
        else
          for (const v1::WorkerStatus& w : reply.status().workers()) *it->partial->add_workers() = w;
        if (!reply.status().more()) answer(it, from_wire(*it->partial));
        return;
      }
      case v1::SchedulerReply::kTokenized: return on_tokenized(reply.tokenized());
      case v1::SchedulerReply::kMetrics:
        return answer_query(metrics_waiters_, reply.metrics().query_id(),
                            Result<std::string>(prometheus_text(reply.metrics())));
      case v1::SchedulerReply::kError: {
        // Not tied to a request: this client and the scheduler disagree on the protocol, so
        // nothing in flight can be trusted to finish.
        const Code code = from_wire(reply.error().code());
        const std::string msg = "scheduler: " + reply.error().message();
        spdlog::error("tandem client: protocol error from {}: {}", options_.endpoint, msg);
        return fail_all(code, msg);
      }
      default: spdlog::warn("tandem client: a scheduler reply without a body"); return;
    }
  }

  const ClientOptions options_;
  runtime::EventLoop loop_;  // before everything holding its sockets or timers
  const std::unique_ptr<Driver> driver_;
  const std::shared_ptr<Gate> gate_;
  const std::string id_prefix_;
  std::atomic<uint64_t> counter_{0};
  std::thread thread_;
  std::thread::id loop_thread_id_;

  // The loop's thread only.
  const std::string heartbeat_wire_;
  std::unique_ptr<runtime::Socket> dealer_, monitor_;
  std::unordered_map<std::string, Live> live_;
  std::deque<Waiter> waiters_;                // status queries in send order (the scheduler answers in order)
  QueryWaiters<Tokenized> tokenize_waiters_;  // by query id
  QueryWaiters<std::string> metrics_waiters_;
  uint64_t last_query_id_ = 0;
  bool probe_outstanding_ = false;
  bool closing_ = false;             // shutdown() has run
  std::shared_ptr<void> heartbeat_;  // while requests are in flight
  std::shared_ptr<void> liveness_;   // while requests are in flight and liveness_timeout > 0
  Clock::time_point quiet_since_{};  // last message from the scheduler, or when requests went in flight
};

bool Gate::post(std::function<void(Core&)> fn) {
  MutexLock lock(mu_);
  if (why_closed_) return false;
  core_.driver().post([fn = std::move(fn), &core = core_] { fn(core); });
  return true;
}

// ClientHarness's Driver: posted work runs at the harness's next pass, timers as its clock moves.
class StepDriver final : public Driver {
 public:
  Clock::time_point now() override { return now_; }
  void post(std::function<void()> fn) override { posted_.push_back(std::move(fn)); }
  std::shared_ptr<void> after(std::chrono::milliseconds delay, std::function<void()> fn) override {
    auto timer = std::make_shared<std::function<void()>>(std::move(fn));
    timers_.emplace(now_ + delay, timer);
    return timer;
  }

  // One pass of the loop as after a wake-up: the work posted, then `step` (a message, a lost
  // connection), then the timers due.
  void pass(const std::function<void()>& step = nullptr) {
    while (!posted_.empty()) {
      std::function<void()> fn = std::move(posted_.front());
      posted_.pop_front();
      fn();
    }
    if (step) step();
    advance(std::chrono::milliseconds{0});
  }
  // Moves the clock on by `elapsed`, firing the timers due on the way, each at its due time.
  void advance(std::chrono::milliseconds elapsed) {
    const Clock::time_point to = now_ + elapsed;
    while (!timers_.empty() && timers_.begin()->first <= to) {
      auto [due, timer] = *timers_.begin();
      timers_.erase(timers_.begin());
      now_ = std::max(now_, due);
      if (auto fn = timer.lock()) (*fn)();  // held: fn may drop its own handle
    }
    now_ = to;
  }

 private:
  Clock::time_point now_ = Clock::now();
  std::deque<std::function<void()>> posted_;
  std::multimap<Clock::time_point, std::weak_ptr<std::function<void()>>> timers_;
};

}  // namespace client_detail

using client_detail::Clock;
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

Stream::Stream(std::string id, std::weak_ptr<client_detail::Gate> gate)
    : id_(std::move(id)), gate_(std::move(gate)), events_(std::make_shared<client_detail::EventQueue>()) {}

bool Stream::next(Event& out) {
  std::optional<Event> event = next_for(std::chrono::milliseconds::max());  // 100 years: "never"
  if (event) out = std::move(*event);
  return event.has_value();
}

std::optional<Event> Stream::next_for(std::chrono::milliseconds wait) {
  return events_->take(Clock::now() + client_detail::at_most_never(wait));
}

void Stream::cancel() {
  if (events_->final_taken()) return;
  if (auto gate = gate_.lock()) (void)Core::post_cancel(*gate, id_);
}

bool Stream::finished() const { return events_->final_taken(); }

namespace {

// The Core for `options`, checked, its sockets made and connected, nothing running yet.
Result<std::unique_ptr<Core>> open_core(ClientOptions options, std::unique_ptr<client_detail::Driver> driver) {
  if (options.endpoint.empty()) return Status::invalid("client: an endpoint is required");
  if (options.heartbeat_interval.count() <= 0) return Status::invalid("client: heartbeat interval must be positive");
  if (options.request_timeout.count() <= 0) return Status::invalid("client: request timeout must be positive");
  if (options.deadline_grace.count() < 0 || options.liveness_timeout.count() < 0)
    return Status::invalid("client: deadline grace and liveness timeout must not be negative");
  for (auto* d :
       {&options.heartbeat_interval, &options.request_timeout, &options.deadline_grace, &options.liveness_timeout})
    *d = client_detail::at_most_never(*d);
  try {
    auto core = std::make_unique<Core>(std::move(options), std::move(driver));
    TANDEM_RETURN_IF_ERROR(core->open());
    return core;
  } catch (const zmq::error_t& e) {
    return Status::error(Code::kInternal, std::string("client: ") + e.what());
  }
}

}  // namespace

Client::Client(std::unique_ptr<Core> core) : core_(std::move(core)) {}

Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::connect(ClientOptions options) {
  auto core = open_core(std::move(options), nullptr);
  if (!core) return core.status();
  (*core)->start();
  return std::unique_ptr<Client>(new Client(std::move(core.value())));
}

std::shared_ptr<Stream> Client::generate(GenerateRequest request) { return core_->generate(std::move(request)); }

std::string Client::generate(GenerateRequest request, std::function<void(const Event&)> on_event) {
  return core_->generate(std::move(request), std::move(on_event));
}

Status Client::cancel(const std::string& id) {
  if (id.empty()) return Status::invalid("cancel: empty request id");
  if (!Core::post_cancel(core_->gate(), id)) return Status::error(Code::kUnavailable, core_->gate().why_closed());
  return Status::ok();
}

namespace {

// Waits for a future the loop answers by `timeout`; the extra second only guards against a
// stuck loop.
template <class T>
Result<T> wait_reply(std::future<Result<T>> future, std::chrono::milliseconds timeout, const char* what) {
  if (future.wait_for(timeout + std::chrono::seconds(1)) != std::future_status::ready)
    return Status::error(Code::kUnavailable, std::string(what) + ": no reply from the client's I/O thread");
  return future.get();
}

}  // namespace

Result<StatusInfo> Client::status() { return status(core_->options().request_timeout); }

Result<StatusInfo> Client::status(std::chrono::milliseconds timeout) {
  if (core_->on_loop_thread())
    return Status::error(Code::kInternal, "status() called from an event callback (the client's I/O thread)");
  if (timeout.count() <= 0) return Status::invalid("status: timeout must be positive");
  timeout = client_detail::at_most_never(timeout);
  return wait_reply(core_->post_status(timeout), timeout, "status");
}

namespace {

// A tokenize query (count_only: count_tokens) answered by the scheduler within `timeout`;
// `what` names the call in errors.
Result<client_detail::Tokenized> tokenize_query(Core& core, const TokenizeRequest& request, bool count_only,
                                                std::chrono::milliseconds timeout, const std::string& what) {
  if (core.on_loop_thread())
    return Status::error(Code::kInternal, what + "() called from an event callback (the client's I/O thread)");
  if (timeout.count() <= 0) return Status::invalid(what + ": timeout must be positive");
  timeout = client_detail::at_most_never(timeout);
  return wait_reply(core.post_tokenize(request, count_only, timeout), timeout, what.c_str());
}

}  // namespace

Result<std::vector<int32_t>> Client::tokenize(const TokenizeRequest& request) {
  return tokenize(request, core_->options().request_timeout);
}

Result<std::vector<int32_t>> Client::tokenize(const TokenizeRequest& request, std::chrono::milliseconds timeout) {
  auto r = tokenize_query(*core_, request, false, timeout, "tokenize");
  if (!r) return r.status();
  return std::move(r->ids);
}

Result<size_t> Client::count_tokens(const TokenizeRequest& request) {
  return count_tokens(request, core_->options().request_timeout);
}

Result<size_t> Client::count_tokens(const TokenizeRequest& request, std::chrono::milliseconds timeout) {
  auto r = tokenize_query(*core_, request, true, timeout, "count_tokens");
  if (!r) return r.status();
  return r->count;
}

Result<std::string> Client::metrics_text() { return metrics_text(core_->options().request_timeout); }

Result<std::string> Client::metrics_text(std::chrono::milliseconds timeout) {
  if (core_->on_loop_thread())
    return Status::error(Code::kInternal, "metrics_text() called from an event callback (the client's I/O thread)");
  if (timeout.count() <= 0) return Status::invalid("metrics_text: timeout must be positive");
  timeout = client_detail::at_most_never(timeout);
  return wait_reply(core_->post_metrics(timeout), timeout, "metrics_text");
}

struct ClientHarness::Impl {
  client_detail::StepDriver* driver;  // owned by core
  std::unique_ptr<Core> core;
  // A public call's result, returned after the pass that follows it.
  template <class T>
  T passed(T result) {
    driver->pass();
    return result;
  }
};

Result<std::unique_ptr<ClientHarness>> ClientHarness::create(ClientOptions options) {
  auto driver = std::make_unique<client_detail::StepDriver>();
  client_detail::StepDriver* raw = driver.get();
  auto core = open_core(std::move(options), std::move(driver));
  if (!core) return core.status();
  std::unique_ptr<ClientHarness> h(new ClientHarness());
  h->impl_ = std::make_unique<Impl>(Impl{raw, std::move(core.value())});
  return h;
}

ClientHarness::~ClientHarness() { impl_->core->shutdown("client closed"); }

std::shared_ptr<Stream> ClientHarness::generate(GenerateRequest request) {
  return impl_->passed(impl_->core->generate(std::move(request)));
}

std::string ClientHarness::generate(GenerateRequest request, std::function<void(const Event&)> on_event) {
  return impl_->passed(impl_->core->generate(std::move(request), std::move(on_event)));
}

void ClientHarness::cancel(const std::string& id) {
  (void)Core::post_cancel(impl_->core->gate(), id);
  impl_->driver->pass();
}

std::future<Result<StatusInfo>> ClientHarness::status(std::chrono::milliseconds timeout) {
  return impl_->passed(impl_->core->post_status(timeout));
}

void ClientHarness::scheduler(const runtime::Frames& frames) {
  impl_->driver->pass([&] { impl_->core->on_message(frames, impl_->driver->now()); });
}

void ClientHarness::disconnected() {
  impl_->driver->pass([&] { impl_->core->on_disconnected(); });
}

void ClientHarness::poll_failed(int err) { impl_->core->on_loop_failed("zmq_poll", err); }

void ClientHarness::advance(std::chrono::milliseconds elapsed) {
  impl_->driver->pass();
  impl_->driver->advance(elapsed);
}

}  // namespace tandem
