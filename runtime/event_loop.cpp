#include "runtime/event_loop.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>

namespace tandem::runtime {

namespace {

// Messages read per drain before yielding to timers and other sockets; the rest are
// read by a posted drain (a flooding peer must not starve heartbeats).
constexpr int kDrainBatch = 256;
// A drain also yields once its handlers have run this long, so one busy socket (a worker's
// plans, each a whole forward pass) cannot starve the loop's other sockets and timers (the
// KV a decode worker receives, heartbeats).
constexpr int64_t kDrainSliceUs = 2000;

std::string errno_text(int err) { return zmq_strerror(err); }

Status socket_error(const std::string& what, const std::string& endpoint, int err) {
  Code code = Code::kUnavailable;
  switch (err) {
    case EINVAL:
    case EPROTONOSUPPORT:
    case ENOCOMPATPROTO:
    case ENAMETOOLONG: code = Code::kInvalidArgument; break;
    default: break;
  }
  std::string msg = what;
  msg += ' ';
  msg += endpoint;
  msg += ": ";
  msg += errno_text(err);
  return Status::error(code, std::move(msg));
}

// ZeroMQ unlinks an existing ipc:// path before binding, so a second binder silently
// steals the endpoint from a live one. Refuse when something answers on the path; a
// stale file (nobody listening) is left for ZeroMQ to replace.
Status check_ipc_free(const std::string& endpoint) {
  constexpr std::string_view kIpc = "ipc://";
  if (endpoint.compare(0, kIpc.size(), kIpc) != 0) return Status::ok();
  std::string path = endpoint.substr(kIpc.size());
  if (path.empty() || path[0] == '@' || path == "*") return Status::ok();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return Status::ok();
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return Status::ok();  // ZeroMQ reports it
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::ok();
  int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  ::close(fd);
  if (rc == 0) return socket_error("bind", endpoint, EADDRINUSE);
  return Status::ok();
}

// Runs a user callback at the loop's edge: nothing may propagate out of io_context::run.
template <class F>
void guarded(const char* what, F&& f) {
  try {
    f();
  } catch (const zmq::error_t& e) {
    spdlog::error("event loop: zmq error escaped {}: {}", what, e.what());
  } catch (const std::exception& e) {
    spdlog::error("event loop: exception escaped {}: {}", what, e.what());
  } catch (...) {
    spdlog::error("event loop: unknown exception escaped {}", what);
  }
}

}  // namespace

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------------------------------
// Socket

Socket::Socket(EventLoop& loop, zmq::socket_type type, Handler handler)
    : loop_(loop), socket_(loop.zmq_, type), fd_(loop.io_), shared_(std::make_shared<Shared>()) {
  shared_->handler = std::move(handler);
}

Socket::~Socket() {
  shared_->alive = false;
  closed_ = true;
  if (fd_.is_open()) {
    boost::system::error_code ec;
    fd_.cancel(ec);
    fd_.release();  // ZeroMQ owns the descriptor: take it out of the reactor, never close it
  }
  // socket_ closes itself; linger is bounded by SocketLimits::linger_ms.
}

Status Socket::configure(zmq::socket_type type, const std::string& identity, const SocketLimits& l) {
  max_parts_ = l.max_message_parts;
  void* s = socket_.handle();
  auto set = [&](int option, const void* value, size_t size, const char* name) -> Status {
    if (zmq_setsockopt(s, option, value, size) == 0) return Status::ok();
    return Status::error(Code::kInvalidArgument, std::string("setsockopt ") + name + ": " + errno_text(zmq_errno()));
  };
  auto set_int = [&](int option, int value, const char* name) { return set(option, &value, sizeof(value), name); };

  int64_t max_bytes = l.max_message_bytes;
  TANDEM_RETURN_IF_ERROR(set(ZMQ_MAXMSGSIZE, &max_bytes, sizeof(max_bytes), "ZMQ_MAXMSGSIZE"));
  int64_t max_total = l.max_multipart_bytes >= 0 ? l.max_multipart_bytes : max_bytes + ZMQ_TANDEM_FRAME_OVERHEAD;
  TANDEM_RETURN_IF_ERROR(
      set(ZMQ_TANDEM_MAX_MULTIPART_BYTES, &max_total, sizeof(max_total), "ZMQ_TANDEM_MAX_MULTIPART_BYTES"));
  TANDEM_RETURN_IF_ERROR(set_int(ZMQ_SNDHWM, l.send_hwm, "ZMQ_SNDHWM"));
  TANDEM_RETURN_IF_ERROR(set_int(ZMQ_RCVHWM, l.recv_hwm, "ZMQ_RCVHWM"));
  TANDEM_RETURN_IF_ERROR(set_int(ZMQ_LINGER, l.linger_ms, "ZMQ_LINGER"));
  TANDEM_RETURN_IF_ERROR(set_int(ZMQ_HANDSHAKE_IVL, l.handshake_ivl_ms, "ZMQ_HANDSHAKE_IVL"));
  if (l.heartbeat_ivl_ms > 0) {
    TANDEM_RETURN_IF_ERROR(set_int(ZMQ_HEARTBEAT_IVL, l.heartbeat_ivl_ms, "ZMQ_HEARTBEAT_IVL"));
    TANDEM_RETURN_IF_ERROR(set_int(ZMQ_HEARTBEAT_TIMEOUT, l.heartbeat_timeout_ms, "ZMQ_HEARTBEAT_TIMEOUT"));
    // The peer drops us after this long without traffic (100 ms granularity, 16-bit on the wire).
    int ttl = std::clamp(l.heartbeat_timeout_ms, 0, 655300);
    TANDEM_RETURN_IF_ERROR(set_int(ZMQ_HEARTBEAT_TTL, ttl - ttl % 100, "ZMQ_HEARTBEAT_TTL"));
  }
  if (type == zmq::socket_type::router) {
    TANDEM_RETURN_IF_ERROR(set_int(ZMQ_ROUTER_MANDATORY, 1, "ZMQ_ROUTER_MANDATORY"));
  }
  if (!identity.empty()) {
    TANDEM_RETURN_IF_ERROR(set(ZMQ_ROUTING_ID, identity.data(), identity.size(), "ZMQ_ROUTING_ID"));
  }
  return Status::ok();
}

Status Socket::watch() {
  int fd = -1;
  size_t size = sizeof(fd);
  if (zmq_getsockopt(socket_.handle(), ZMQ_FD, &fd, &size) != 0) {
    return Status::error(Code::kInternal, "ZMQ_FD " + endpoint_ + ": " + errno_text(zmq_errno()));
  }
  boost::system::error_code ec;
  fd_.assign(fd, ec);
  if (ec) return Status::error(Code::kInternal, "watch " + endpoint_ + ": " + ec.message());
  arm();
  schedule_drain();  // the edge may have come before the descriptor joined the reactor
  return Status::ok();
}

void Socket::arm() {
  if (armed_ || closed_) return;
  armed_ = true;
  fd_.async_wait(asio::posix::stream_descriptor::wait_read,
                 [this, shared = std::weak_ptr<Shared>(shared_)](const boost::system::error_code& ec) {
                   auto s = shared.lock();
                   if (!s || !s->alive) return;  // the socket is gone: `this` dangles
                   armed_ = false;
                   if (ec) {
                     if (ec != asio::error::operation_aborted) {
                       spdlog::error("event loop: waiting on {}: {}", endpoint_, ec.message());
                     }
                     return;
                   }
                   drain();
                 });
}

void Socket::schedule_drain() {
  if (drain_posted_ || closed_) return;
  drain_posted_ = true;
  asio::post(loop_.io_, [this, shared = std::weak_ptr<Shared>(shared_)] {
    auto s = shared.lock();
    if (!s || !s->alive) return;
    drain_posted_ = false;
    drain();
  });
}

void Socket::close_on_error(const char* what, int err) {
  spdlog::error("event loop: {} on {}: {}; socket stops receiving", what, endpoint_, errno_text(err));
  closed_ = true;
  if (fd_.is_open()) {
    boost::system::error_code ec;
    fd_.cancel(ec);
    fd_.release();
  }
  std::shared_ptr<Shared> s = shared_;  // the handler may destroy this socket
  if (s->on_failure) guarded("a socket failure handler", [&] { s->on_failure(what, err); });
}

void Socket::drain() {
  if (draining_ || closed_) return;  // a handler that sends re-enters here: the outer loop re-checks
  // Holds the handler and the inbox alive even if the handler destroys this socket.
  std::shared_ptr<Shared> s = shared_;
  draining_ = true;
  void* sock = socket_.handle();
  const int64_t started = now_us();
  for (int n = 0;; ++n) {
    int events = 0;
    size_t size = sizeof(events);
    if (zmq_getsockopt(sock, ZMQ_EVENTS, &events, &size) != 0) {
      draining_ = false;
      close_on_error("ZMQ_EVENTS", zmq_errno());
      return;
    }
    if (!(events & ZMQ_POLLIN)) break;
    if (n == kDrainBatch || (n > 0 && now_us() - started > kDrainSliceUs)) {
      // Yield; the posted drain picks up where this one stops, after what else is ready.
      draining_ = false;
      schedule_drain();
      return;
    }
    Frames& frames = s->inbox;
    frames.clear();
    bool more = true;
    size_t parts = 0;
    while (more) {
      // Past max_parts_ each frame is read into the last one, releasing the one before.
      zmq::message_t& frame = max_parts_ == 0 || frames.size() < max_parts_ + 1 ? frames.emplace_back() : frames.back();
      ++parts;
      if (zmq_msg_recv(frame.handle(), sock, ZMQ_DONTWAIT) < 0) {
        int err = zmq_errno();
        frames.clear();
        if (err == EAGAIN || err == EINTR) break;  // POLLIN was stale; ZMQ_EVENTS re-checks
        draining_ = false;
        close_on_error("recv", err);
        return;
      }
      more = frame.more();
    }
    if (frames.empty()) continue;
    last_parts_ = parts;
    if (max_parts_ > 0 && frames.size() > max_parts_) frames.pop_back();
    guarded("a socket handler", [&] { s->handler(frames); });
    if (!s->alive) return;  // the handler destroyed this socket
  }
  draining_ = false;
  // ZMQ_EVENTS just reset the edge with nothing pending: the next message makes a new one.
  arm();
}

SendResult Socket::send(Frames& frames) { return send_frames(frames.data(), frames.size()); }

SendResult Socket::send_frames(zmq::message_t* frames, size_t n) {
  if (closed_) return {SendError::kClosed, "socket closed"};
  if (n == 0) return {SendError::kNoFrames, "send: no frames"};
  void* sock = socket_.handle();
  SendResult result;
  for (size_t i = 0; i < n; ++i) {
    int flags = ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0);
    if (zmq_msg_send(frames[i].handle(), sock, flags) >= 0) continue;
    int err = zmq_errno();
    if (err == EINTR && i == 0) {  // nothing queued yet: retry once
      if (zmq_msg_send(frames[i].handle(), sock, flags) >= 0) continue;
      err = zmq_errno();
    }
    // ZeroMQ decides at frame 0 (peer lookup, high-water mark); a later frame fails only
    // when the socket is being torn down.
    if (err == EAGAIN) {
      result = {SendError::kQueueFull, "send queue full"};
    } else if (err == EHOSTUNREACH) {
      result = {SendError::kPeerGone, "peer gone"};
    } else if (err == ETERM || err == ENOTSOCK) {
      result = {SendError::kClosed, "socket closed"};
    } else {
      result = {SendError::kOther, "send on " + endpoint_ + ": " + errno_text(err)};
    }
    if (i > 0)
      spdlog::error("event loop: send on {} failed after {} of {} frames: {}", endpoint_, i, n, errno_text(err));
    break;
  }
  // Sending processes ZeroMQ's command mailbox, which can swallow ZMQ_FD's edge for an
  // inbound message: look again once the caller is done (an active drain looks anyway).
  if (!draining_) schedule_drain();
  return result;
}

SendResult Socket::send_bytes(const std::string& bytes) {
  zmq::message_t frame(bytes.data(), bytes.size());
  return send_frames(&frame, 1);
}

SendResult Socket::send_to(const std::string& identity, const std::string& bytes) {
  zmq::message_t frames[2] = {zmq::message_t(identity.data(), identity.size()),
                              zmq::message_t(bytes.data(), bytes.size())};
  return send_frames(frames, 2);
}

// ---------------------------------------------------------------------------------------
// EventLoop

struct EventLoop::SignalWatch {
  explicit SignalWatch(asio::io_context& io) : set(io) {}
  void wait() {
    // Cancelled only by ~EventLoop, whose io_context then discards the handler unrun.
    set.async_wait([this](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      guarded("a signal handler", [&] { fn(sig); });
      wait();
    });
  }
  asio::signal_set set;
  std::function<void(int)> fn;
};

EventLoop::EventLoop(SocketLimits limits) : limits_(limits), zmq_(1), io_(1), work_(asio::make_work_guard(io_)) {}

EventLoop::~EventLoop() {
  for (auto& watch : signals_) {
    boost::system::error_code ec;
    watch->set.cancel(ec);
  }
  signals_.clear();
  work_.reset();
}

Result<std::unique_ptr<Socket>> EventLoop::bind(zmq::socket_type type, const std::string& endpoint,
                                                Socket::Handler handler) {
  return open(type, endpoint, std::move(handler), {}, true, curve_, limits_);
}

Result<std::unique_ptr<Socket>> EventLoop::bind(zmq::socket_type type, const std::string& endpoint,
                                                Socket::Handler handler, const CurveKeys& keys) {
  return open(type, endpoint, std::move(handler), {}, true, keys, limits_);
}

Result<std::unique_ptr<Socket>> EventLoop::bind(zmq::socket_type type, const std::string& endpoint,
                                                Socket::Handler handler, const CurveKeys& keys,
                                                const SocketLimits& limits) {
  return open(type, endpoint, std::move(handler), {}, true, keys, limits);
}

Result<std::unique_ptr<Socket>> EventLoop::connect(zmq::socket_type type, const std::string& endpoint,
                                                   Socket::Handler handler, const CurveKeys& keys) {
  return open(type, endpoint, std::move(handler), {}, false, keys, limits_);
}

Result<std::unique_ptr<Socket>> EventLoop::connect(zmq::socket_type type, const std::string& endpoint,
                                                   Socket::Handler handler, const std::string& identity) {
  return open(type, endpoint, std::move(handler), identity, false, curve_, limits_);
}

Result<std::unique_ptr<Socket>> EventLoop::open(zmq::socket_type type, const std::string& endpoint,
                                                Socket::Handler handler, const std::string& identity, bool bind,
                                                const CurveKeys& curve, const SocketLimits& limits) {
  const char* verb = bind ? "bind" : "connect";
  if (!handler) return Status::invalid(std::string(verb) + " " + endpoint + ": no handler");
  std::unique_ptr<Socket> socket;
  try {
    socket.reset(new Socket(*this, type, std::move(handler)));
  } catch (const zmq::error_t& e) {
    return socket_error(std::string(verb) + ": cannot create socket for", endpoint, e.num());
  }
  socket->endpoint_ = endpoint;
  if (Status st = socket->configure(type, identity, limits); !st) {
    return Status::error(st.code(), std::string(verb) + " " + endpoint + ": " + st.message());
  }
  void* s = socket->socket_.handle();
  if (curve.enabled()) {
    CurveKeys keys = curve;
    if (!bind) keys.server_secret.clear();
    if (Status st = apply_curve(s, keys); !st)
      return Status::error(st.code(), std::string(verb) + " " + endpoint + ": " + st.message());
  }
  if (bind) {
    TANDEM_RETURN_IF_ERROR(check_ipc_free(endpoint));
    if (zmq_bind(s, endpoint.c_str()) != 0) return socket_error("bind", endpoint, zmq_errno());
    char last[1024];
    size_t size = sizeof(last);
    if (zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, last, &size) == 0 && size > 1) socket->endpoint_.assign(last, size - 1);
  } else {
    if (zmq_connect(s, endpoint.c_str()) != 0) return socket_error("connect", endpoint, zmq_errno());
  }
  TANDEM_RETURN_IF_ERROR(socket->watch());
  return socket;
}

std::unique_ptr<EventLoop::Timer> EventLoop::after(std::chrono::milliseconds delay, std::function<void()> fn) {
  return start_timer(delay, std::chrono::milliseconds{0}, std::move(fn));
}

std::unique_ptr<EventLoop::Timer> EventLoop::every(std::chrono::milliseconds period, std::function<void()> fn) {
  // A zero period would spin the loop; one millisecond is the finest tick offered.
  return start_timer(period, std::max(period, std::chrono::milliseconds{1}), std::move(fn));
}

std::unique_ptr<EventLoop::Timer> EventLoop::start_timer(std::chrono::milliseconds delay,
                                                         std::chrono::milliseconds period, std::function<void()> fn) {
  auto state = std::make_shared<Timer::State>(io_);
  state->fn = std::move(fn);
  state->period = period;
  state->timer.expires_after(delay);
  Timer::arm(state);
  return std::unique_ptr<Timer>(new Timer(std::move(state)));
}

void EventLoop::Timer::arm(const std::shared_ptr<State>& state) {
  state->timer.async_wait([weak = std::weak_ptr<State>(state)](const boost::system::error_code& ec) {
    // Holding the state keeps fn alive while it runs, even if fn destroys the handle.
    std::shared_ptr<State> s = weak.lock();
    if (!s || s->cancelled || ec) return;
    if (s->fn) guarded("a timer callback", [&] { s->fn(); });
    if (s->cancelled || s->period.count() == 0) return;
    auto next = s->timer.expiry() + s->period;
    auto now = asio::steady_timer::clock_type::now();
    if (next < now) next = now + s->period;  // late: skip the missed ticks
    s->timer.expires_at(next);
    arm(s);
  });
}

EventLoop::Timer::~Timer() { cancel(); }

void EventLoop::Timer::cancel() {
  if (!state_ || state_->cancelled) return;
  state_->cancelled = true;
  state_->timer.cancel();
}

void EventLoop::run() {
  try {
    io_.run();
  } catch (const std::exception& e) {  // guarded() catches callbacks; this is a last resort
    spdlog::error("event loop: run: {}", e.what());
  }
  io_.restart();
}

void EventLoop::stop() { io_.stop(); }

void EventLoop::on_signal(std::vector<int> signals, std::function<void(int)> fn) {
  auto watch = std::make_unique<SignalWatch>(io_);
  watch->fn = std::move(fn);
  for (int sig : signals) {
    boost::system::error_code ec;
    watch->set.add(sig, ec);
    if (ec) spdlog::error("event loop: cannot handle signal {}: {}", sig, ec.message());
  }
  watch->wait();
  signals_.push_back(std::move(watch));
}

bool Socket::has_pending() {
  try {
    return (socket_.get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
  } catch (const zmq::error_t&) {
    return false;
  }
}

}  // namespace tandem::runtime
