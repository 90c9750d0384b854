// An actor's single-threaded event loop: a Boost.Asio io_context with ZeroMQ sockets in
// it (through ZMQ_FD), plus Asio timers for heartbeats and deadlines. Everything an actor
// owns is touched only from the thread that runs the loop: no locks around actor state.
//
// Lifetimes: every Socket and Timer handle must be destroyed before its EventLoop (the
// loop's ZeroMQ context waits for its sockets to close). Destroying a Socket or a Timer
// from inside its own callback is allowed.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "runtime/security.h"
#include "runtime/status.h"

namespace tandem::runtime {

namespace asio = boost::asio;

// Limits every tandem socket gets (ZeroMQ's defaults are unbounded or unsafe).
struct SocketLimits {
  int64_t max_message_bytes = int64_t{64} << 20;  // ZMQ_MAXMSGSIZE: larger inbound messages drop the peer
  int send_hwm = 100000;                          // ZMQ_SNDHWM (messages)
  int recv_hwm = 100000;                          // ZMQ_RCVHWM
  int linger_ms = 200;                            // ZMQ_LINGER: bounded wait for unsent messages at close
  int heartbeat_ivl_ms = 1000;                    // ZMQ_HEARTBEAT_IVL (ZMTP pings; 0 = off)
  int heartbeat_timeout_ms = 5000;                // ZMQ_HEARTBEAT_TIMEOUT, also sent as ZMQ_HEARTBEAT_TTL
  // ZMQ_HANDSHAKE_IVL: a peer that has not finished the ZMTP (and CURVE) handshake by then is
  // dropped, so half-open connections cannot pile up (libzmq's default is 30 s).
  int handshake_ivl_ms = 10000;
  // ZMQ_TANDEM_MAX_MULTIPART_BYTES (tandem's libzmq patch, third_party/libzmq/): the most one
  // inbound message may take over all its frames, each charged ZMQ_TANDEM_FRAME_OVERHEAD (64)
  // on top of its payload; past it ZeroMQ drops the peer as it reads, so a message of many
  // small (or empty) frames is never held whole. Negative: one frame's worth,
  // max_message_bytes + 64 (every tandem message but a KV transfer is one frame).
  int64_t max_multipart_bytes = -1;
  // Frames of one inbound message the handler is given at most (0: no bound). Past it the
  // rest are read and released one by one, not kept: the handler gets the first
  // max_message_parts frames and Socket::last_message_parts() says how many there were.
  size_t max_message_parts = 0;
};

using Frames = std::vector<zmq::message_t>;

// Why a send did not happen; callers decide on this, never on the message text.
enum class SendError {
  kNone,       // sent (queued on the socket)
  kQueueFull,  // the peer's high-water mark is reached: it is not reading
  kPeerGone,   // ROUTER: no connected peer has that identity
  kClosed,     // the socket or its context is closing
  kNoFrames,   // nothing to send (a caller's bug)
  kOther,      // any other ZeroMQ error (named in the message)
};

// The outcome of Socket::send. On failure nothing is queued.
class [[nodiscard]] SendResult {
 public:
  SendResult() = default;
  SendResult(SendError error, std::string message) : error_(error), message_(std::move(message)) {}

  bool is_ok() const { return error_ == SendError::kNone; }
  explicit operator bool() const { return is_ok(); }
  SendError error() const { return error_; }
  // For logs: "send queue full", "peer gone", "socket closed", "send: no frames",
  // "send on <endpoint>: <errno text>"; empty when sent.
  const std::string& message() const { return message_; }
  // kInvalidArgument for kNoFrames, kUnavailable for the other failures.
  Code code() const {
    return is_ok() ? Code::kOk : error_ == SendError::kNoFrames ? Code::kInvalidArgument : Code::kUnavailable;
  }
  Status status() const { return is_ok() ? Status::ok() : Status::error(code(), message_); }

 private:
  SendError error_ = SendError::kNone;
  std::string message_;
};

class EventLoop;

// A ZeroMQ socket watched by an EventLoop. ROUTER sockets get ZMQ_ROUTER_MANDATORY (a send
// to a gone peer fails instead of vanishing). All calls from the loop's thread only.
class Socket {
 public:
  // Called with each complete multipart message (for a ROUTER, frame 0 is the peer
  // identity). The handler may move frames out, send on any socket, and destroy this
  // socket; the frames stay valid until it returns.
  using Handler = std::function<void(Frames& frames)>;
  // Called once if the socket stops receiving for good: `what` ("ZMQ_EVENTS", "recv") failed
  // with errno `err`. It may destroy the socket.
  using FailureHandler = std::function<void(const char* what, int err)>;

  ~Socket();
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // Sends a multipart message without blocking. Fails with kPeerGone (ROUTER: unknown
  // identity), kQueueFull (high-water mark reached), kClosed, kNoFrames, or kOther. On
  // failure nothing is queued and the frames are left as they were; on success they are
  // moved from.
  SendResult send(Frames& frames);
  // Convenience: one frame from bytes (copied), or [identity, bytes] for a ROUTER; no
  // allocation beyond the frames' own.
  SendResult send_bytes(const std::string& bytes);
  SendResult send_to(const std::string& identity, const std::string& bytes);

  void on_failure(FailureHandler handler) { shared_->on_failure = std::move(handler); }
  // For socket options and monitors. Send through send(), not raw(): it also re-checks
  // for inbound messages whose ZMQ_FD edge ZeroMQ consumed during the send.
  // True when a message is waiting to be read (ZMQ_EVENTS has POLLIN).
  bool has_pending();
  // The frames of the message the handler was last called with, those dropped included.
  size_t last_message_parts() const { return last_parts_; }
  zmq::socket_t& raw() { return socket_; }
  // The endpoint as bound (wildcards resolved: "tcp://127.0.0.1:*" gives the real port)
  // or as connected.
  const std::string& endpoint() const { return endpoint_; }

 private:
  friend class EventLoop;
  // What outlives the Socket while a callback of it runs: the handler may destroy it.
  struct Shared {
    bool alive = true;
    Handler handler;
    FailureHandler on_failure;
    Frames inbox;  // reused for every message: no allocation per message beyond zmq's
  };
  Socket(EventLoop& loop, zmq::socket_type type, Handler handler);
  Status configure(zmq::socket_type type, const std::string& identity, const SocketLimits& limits);
  Status watch();  // starts watching ZMQ_FD (after bind/connect)
  SendResult send_frames(zmq::message_t* frames, size_t n);
  void arm();             // waits for ZMQ_FD readability
  void drain();           // reads pending messages (ZMQ_FD is edge-triggered: must drain)
  void schedule_drain();  // posts one drain (coalesced); needed after anything that
                          // may have consumed ZMQ_FD's edge (send, a handler)
  void close_on_error(const char* what, int err);

  EventLoop& loop_;
  zmq::socket_t socket_;
  asio::posix::stream_descriptor fd_;
  std::string endpoint_;
  bool armed_ = false, draining_ = false, drain_posted_ = false, closed_ = false;
  size_t max_parts_ = 0, last_parts_ = 0;
  std::shared_ptr<Shared> shared_;
};

class EventLoop {
 public:
  explicit EventLoop(SocketLimits limits = {});
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  asio::io_context& io() { return io_; }
  zmq::context_t& zmq() { return zmq_; }
  const SocketLimits& limits() const { return limits_; }
  // Every socket opened after this call uses CurveZMQ: a server (bind) with the secret
  // key, or a client (connect) of the server's public key.
  void use_curve(CurveKeys keys) { curve_ = std::move(keys); }

  // A bound or connected socket whose messages go to `handler` on the loop's thread.
  // Errors name the endpoint and the cause (address in use, bad endpoint, permission).
  // An ipc:// path where another process is listening is refused (ZeroMQ alone would
  // silently take the path over); a stale socket file is replaced.
  Result<std::unique_ptr<Socket>> bind(zmq::socket_type type, const std::string& endpoint, Socket::Handler handler);
  // `identity`, when given, becomes ZMQ_ROUTING_ID: the frame 0 a ROUTER peer sees.
  Result<std::unique_ptr<Socket>> connect(zmq::socket_type type, const std::string& endpoint, Socket::Handler handler,
                                          const std::string& identity = {});
  // The same with this socket's own CurveZMQ keys instead of use_curve()'s (disabled keys:
  // plain): the KV link between workers, whose server is the decode worker, not the scheduler.
  Result<std::unique_ptr<Socket>> bind(zmq::socket_type type, const std::string& endpoint, Socket::Handler handler,
                                       const CurveKeys& keys);
  Result<std::unique_ptr<Socket>> connect(zmq::socket_type type, const std::string& endpoint, Socket::Handler handler,
                                          const CurveKeys& keys);
  // The same with keys and limits of its own instead of the loop's (a socket facing other peers).
  Result<std::unique_ptr<Socket>> bind(zmq::socket_type type, const std::string& endpoint, Socket::Handler handler,
                                       const CurveKeys& keys, const SocketLimits& limits);

  // Runs fn after `delay` on the loop's thread; cancelled when the returned handle dies.
  class Timer;
  [[nodiscard]] std::unique_ptr<Timer> after(std::chrono::milliseconds delay, std::function<void()> fn);
  // Runs fn every `period` until the handle dies. A late loop skips missed ticks rather
  // than firing them in a burst.
  [[nodiscard]] std::unique_ptr<Timer> every(std::chrono::milliseconds period, std::function<void()> fn);

  // Runs until stop(). stop() may be called from any thread (also before run(): run() then
  // returns at once) and from handlers registered with on_signal. run() may be called again
  // after it returns.
  void run();
  void stop();
  // Calls fn(signal) on the loop's thread for each delivery of one of `signals`
  // (SIGINT, SIGTERM, ...), until the loop is destroyed.
  void on_signal(std::vector<int> signals, std::function<void(int)> fn);

 private:
  friend class Socket;
  Result<std::unique_ptr<Socket>> open(zmq::socket_type type, const std::string& endpoint, Socket::Handler handler,
                                       const std::string& identity, bool bind, const CurveKeys& keys,
                                       const SocketLimits& limits);
  std::unique_ptr<Timer> start_timer(std::chrono::milliseconds delay, std::chrono::milliseconds period,
                                     std::function<void()> fn);

  struct SignalWatch;

  SocketLimits limits_;
  CurveKeys curve_;
  zmq::context_t zmq_;
  asio::io_context io_;
  std::vector<std::unique_ptr<SignalWatch>> signals_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
};

// A pending after()/every() callback. Destroying the handle (or cancel()) guarantees the
// callback does not run afterwards, even if its expiry was already queued.
class EventLoop::Timer {
 public:
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  void cancel();

 private:
  friend class EventLoop;
  struct State {
    explicit State(asio::io_context& io) : timer(io) {}
    asio::steady_timer timer;
    std::function<void()> fn;
    std::chrono::milliseconds period{0};  // 0: one-shot
    bool cancelled = false;
  };
  explicit Timer(std::shared_ptr<State> state) : state_(std::move(state)) {}
  static void arm(const std::shared_ptr<State>& state);
  std::shared_ptr<State> state_;  // the only owner: callbacks hold weak references
};

// Monotonic clock in microseconds, for timings carried in messages.
int64_t now_us();

}  // namespace tandem::runtime
