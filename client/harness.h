// A Client's loop side without its thread: the work its public calls post, a message from
// the scheduler, a lost connection and its timers, run directly and on a clock the caller
// moves (the Core's Driver seam in client.cpp). For the fuzz target (fuzz/client_fuzz.cpp):
// arbitrary bytes through the same decode and dispatch code as the DEALER's messages. Not
// thread-safe; events are delivered on the calling thread. Not part of the public API (it
// names ZeroMQ types).
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "runtime/event_loop.h"
#include "runtime/status.h"
#include "tandem/client.h"

namespace tandem {

class ClientHarness {
 public:
  // As Client::connect, with nothing running. Give it an inproc:// endpoint nothing binds:
  // what it sends queues there unread.
  static Result<std::unique_ptr<ClientHarness>> create(ClientOptions options);
  // As ~Client: the requests still in flight end with UNAVAILABLE ("client closed").
  ~ClientHarness();
  ClientHarness(const ClientHarness&) = delete;
  ClientHarness& operator=(const ClientHarness&) = delete;

  // Each call is what happens in a Client, at the harness's clock: the public call of the
  // same name, if any, then the loop's pass (the work posted, the message or lost
  // connection, the timers due). Events are delivered before it returns.
  std::shared_ptr<Stream> generate(GenerateRequest request);
  std::string generate(GenerateRequest request, std::function<void(const Event&)> on_event);
  void cancel(const std::string& id);
  std::future<Result<StatusInfo>> status(std::chrono::milliseconds timeout);
  void scheduler(const runtime::Frames& frames);    // one message, as the DEALER delivers it
  void disconnected();                              // as the socket monitor reports it
  void advance(std::chrono::milliseconds elapsed);  // moves the clock on; timers fire
  // Polling the DEALER failed for good with `err` (in a Client: ZMQ_EVENTS or a receive, as
  // the EventLoop reports it; named "zmq_poll" here): the client ends, what is in flight ends
  // with UNAVAILABLE naming the cause, and so does every later call.
  void poll_failed(int err);

 private:
  ClientHarness() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
