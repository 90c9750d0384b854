// A Client's I/O side without its thread: the steps its I/O thread takes on a command, on a
// message from the scheduler, on a lost connection and on its timers, taken directly and on
// a clock the caller moves. For the fuzz target (fuzz/client_fuzz.cpp): arbitrary bytes
// through the same decode and dispatch code as the DEALER's messages. Not thread-safe;
// events are delivered on the calling thread. Not part of the public API (it names ZeroMQ
// types).
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
  // same name, if any, then the I/O thread's pass on waking (the commands posted, the
  // message or lost connection, the timers due). Events are delivered before it returns.
  std::shared_ptr<Stream> generate(GenerateRequest request);
  std::string generate(GenerateRequest request, std::function<void(const Event&)> on_event);
  void cancel(const std::string& id);
  std::future<Result<StatusInfo>> status(std::chrono::milliseconds timeout);
  void scheduler(const runtime::Frames& frames);    // one message, as the DEALER delivers it
  void disconnected();                              // as the socket monitor reports it
  void advance(std::chrono::milliseconds elapsed);  // moves the clock on; timers fire
  // zmq_poll failed with `err` (not EINTR): the I/O thread's loop ends, and what is in flight
  // ends with UNAVAILABLE. Later calls take no pass (no thread is left to take one).
  void poll_failed(int err);

 private:
  ClientHarness() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
