#include "runtime/event_loop.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace tandem::runtime {
namespace {

using namespace std::chrono_literals;
using zmq::socket_type;

// Every test bounds itself: a loop still running after `limit` fails the test and stops.
std::unique_ptr<EventLoop::Timer> watchdog(EventLoop& loop, std::chrono::milliseconds limit = 10s) {
  return loop.after(limit, [&loop] {
    ADD_FAILURE() << "timed out";
    loop.stop();
  });
}

std::string ipc(const std::string& name) { return "ipc://" + test::temp_dir() + "/" + name; }

std::string text(const zmq::message_t& frame) { return frame.to_string(); }

// Unwraps a Result in a test, failing it with the status when absent.
template <class T>
T must(Result<T> r) {
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  if (!r.is_ok()) throw std::runtime_error(r.status().to_string());
  return std::move(r).value();
}

TEST(EventLoop, DealerRouterRequestReplyOverIpc) {
  EventLoop loop;
  auto guard = watchdog(loop);
  std::string endpoint = ipc("sched.sock");
  std::string seen_identity, reply;

  std::unique_ptr<Socket> router;
  router = must(loop.bind(socket_type::router, endpoint, [&](Frames& f) {
    ASSERT_EQ(f.size(), 2u);
    seen_identity = text(f[0]);
    EXPECT_TRUE(router->send_to(seen_identity, "re:" + text(f[1])).is_ok());
  }));
  EXPECT_EQ(router->endpoint(), endpoint);
  auto dealer = must(loop.connect(
      socket_type::dealer, endpoint,
      [&](Frames& f) {
        ASSERT_EQ(f.size(), 1u);
        reply = text(f[0]);
        loop.stop();
      },
      "client-7"));
  ASSERT_TRUE(dealer->send_bytes("hello").is_ok());
  loop.run();
  EXPECT_EQ(seen_identity, "client-7");
  EXPECT_EQ(reply, "re:hello");
}

TEST(EventLoop, MultipartFramesArriveTogether) {
  EventLoop loop;
  auto guard = watchdog(loop);
  std::string endpoint = ipc("multi.sock");
  std::vector<std::string> got;
  auto router = must(loop.bind(socket_type::router, endpoint, [&](Frames& f) {
    for (auto& m : f) got.push_back(text(m));
    loop.stop();
  }));
  auto dealer = must(loop.connect(
      socket_type::dealer, endpoint, [](Frames&) {}, "d"));
  Frames out;
  out.emplace_back(std::string_view("header"));
  out.emplace_back(std::string(100000, 'k'));  // a bulk frame after a header, as KV blocks travel
  out.emplace_back(std::string_view(""));
  ASSERT_TRUE(dealer->send(out).is_ok());
  loop.run();
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0], "d");
  EXPECT_EQ(got[1], "header");
  EXPECT_EQ(got[2], std::string(100000, 'k'));
  EXPECT_EQ(got[3], "");
}

// 10,000 messages pile up while the receiver's thread is busy; one readiness edge must
// still deliver all of them, in order, and the drain must let timers in between batches.
TEST(EventLoop, BurstWhileBusyIsDrainedInOrder) {
  constexpr int kMessages = 10000;
  EventLoop rx, tx;
  auto guard = watchdog(rx);
  std::string endpoint = ipc("burst.sock");
  int received = 0, out_of_order = 0, timer_saw = -1;
  std::unique_ptr<EventLoop::Timer> fairness;
  auto router = must(rx.bind(socket_type::router, endpoint, [&](Frames& f) {
    if (std::stoi(text(f[1])) != received) ++out_of_order;
    ++received;
    if (received == 1) fairness = rx.after(0ms, [&] { timer_saw = received; });
    if (received == kMessages) rx.stop();
  }));
  auto dealer = must(tx.connect(socket_type::dealer, endpoint, [](Frames&) {}));
  auto busy = rx.after(0ms, [&] {
    for (int i = 0; i < kMessages; ++i) ASSERT_TRUE(dealer->send_bytes(std::to_string(i)).is_ok());
    std::this_thread::sleep_for(100ms);  // stay busy while ZeroMQ moves them to the receiver
  });
  rx.run();
  EXPECT_EQ(received, kMessages);
  EXPECT_EQ(out_of_order, 0);
  EXPECT_GE(timer_saw, 1);
  EXPECT_LT(timer_saw, kMessages) << "a long drain starved the timers";
}

// Handlers that send on the very socket they are reading from, both ways, with many
// requests in flight: a send that swallows ZMQ_FD's edge would strand a reply and hang.
TEST(EventLoop, HandlersSendOnTheirOwnSocket) {
  constexpr int kRequests = 5000, kInFlight = 64;
  EventLoop loop;
  auto guard = watchdog(loop);
  std::string endpoint = ipc("echo.sock");
  std::unique_ptr<Socket> router, dealer;
  router = must(loop.bind(socket_type::router, endpoint, [&](Frames& f) {
    std::string id = text(f[0]), body = text(f[1]);
    EXPECT_TRUE(router->send_to(id, body + "/a").is_ok());
    EXPECT_TRUE(router->send_to(id, body + "/b").is_ok());
  }));
  int sent = 0, replies = 0;
  dealer = must(loop.connect(socket_type::dealer, endpoint, [&](Frames& f) {
    ++replies;
    if (replies % 2 == 0 && sent < kRequests) {
      EXPECT_TRUE(dealer->send_bytes(std::to_string(sent++)).is_ok());
    }
    if (replies == 2 * kRequests) loop.stop();
  }));
  for (; sent < kInFlight; ++sent) ASSERT_TRUE(dealer->send_bytes(std::to_string(sent)).is_ok());
  loop.run();
  EXPECT_EQ(replies, 2 * kRequests);
}

// A message lands on an idle socket while the loop is busy elsewhere, and that same busy
// callback then sends on the socket: ZeroMQ's send reads the command that signalled the
// message, so epoll never reports it. Only the re-check after send() can deliver it.
TEST(EventLoop, SendFromElsewhereDoesNotStrandAnArrivedMessage) {
  EventLoop loop;
  auto guard = watchdog(loop, 5s);
  std::string endpoint = ipc("strand.sock");
  std::unique_ptr<Socket> peer, dealer;
  std::unique_ptr<EventLoop::Timer> trap;
  bool delivered = false;
  peer = must(loop.bind(socket_type::router, endpoint, [&](Frames& f) {
    if (text(f[1]) != "hi") return;
    trap = loop.after(0ms, [&] {
      ASSERT_TRUE(peer->send_to("s", "hello").is_ok());
      std::this_thread::sleep_for(30ms);  // "hello" reaches the dealer's queue meanwhile
      ASSERT_TRUE(dealer->send_bytes("x").is_ok());
    });
  }));
  dealer = must(loop.connect(
      socket_type::dealer, endpoint,
      [&](Frames& f) {
        delivered = text(f[0]) == "hello";
        loop.stop();
      },
      "s"));
  ASSERT_TRUE(dealer->send_bytes("hi").is_ok());
  loop.run();
  EXPECT_TRUE(delivered);
}

TEST(EventLoop, HandlerMayDestroyItsSocket) {
  EventLoop loop;
  auto guard = watchdog(loop);
  std::string endpoint = ipc("die.sock");
  int seen = 0;
  std::unique_ptr<Socket> router;
  router = must(loop.bind(socket_type::router, endpoint, [&](Frames& f) {
    ++seen;
    router.reset();  // frames stay valid until the handler returns
    EXPECT_EQ(text(f[1]), "0");
  }));
  auto dealer = must(loop.connect(socket_type::dealer, endpoint, [](Frames&) {}));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(dealer->send_bytes(std::to_string(i)).is_ok());
  auto done = loop.after(100ms, [&] { loop.stop(); });
  loop.run();
  EXPECT_EQ(seen, 1);
  EXPECT_EQ(router, nullptr);
}

TEST(EventLoop, RouterSendToUnknownPeerFails) {
  EventLoop loop;
  auto router = must(loop.bind(socket_type::router, ipc("r.sock"), [](Frames&) {}));
  SendResult st = router->send_to("nobody", "x");
  EXPECT_EQ(st.error(), SendError::kPeerGone);
  EXPECT_EQ(st.code(), Code::kUnavailable);
  EXPECT_EQ(st.message(), "peer gone");
  Frames none;
  EXPECT_EQ(router->send(none).error(), SendError::kNoFrames);
  EXPECT_EQ(router->send(none).code(), Code::kInvalidArgument);
}

TEST(EventLoop, FullSendQueueIsReportedNotBlocking) {
  SocketLimits limits;
  limits.send_hwm = 10;
  EventLoop loop(limits);
  // Nobody listens: messages wait in the queue until the high-water mark.
  auto dealer = must(loop.connect(socket_type::dealer, ipc("nobody.sock"), [](Frames&) {}));
  int ok = 0;
  SendResult last;
  for (int i = 0; i < 1000 && last.is_ok(); ++i) {
    last = dealer->send_bytes("x");
    if (last.is_ok()) ++ok;
  }
  EXPECT_EQ(last.error(), SendError::kQueueFull);
  EXPECT_EQ(last.code(), Code::kUnavailable);
  EXPECT_EQ(last.message(), "send queue full");
  EXPECT_GE(ok, 1);
  EXPECT_LE(ok, 100);
}

// A message of more frames than max_message_parts: the handler gets the first ones and the
// count; the rest were released as they were read.
TEST(EventLoop, FramesPastMaxMessagePartsAreDroppedAndCounted) {
  EventLoop loop;
  auto guard = watchdog(loop);
  const std::string endpoint = ipc("parts.sock");
  SocketLimits limits;
  limits.max_message_parts = 2;
  std::vector<std::pair<size_t, size_t>> seen;  // (frames given, parts counted)
  std::unique_ptr<Socket> router;
  router = must(loop.bind(
      socket_type::router, endpoint,
      [&](Frames& f) {
        seen.emplace_back(f.size(), router->last_message_parts());
        if (seen.size() == 2) loop.stop();
      },
      CurveKeys{}, limits));
  auto dealer = must(loop.connect(
      socket_type::dealer, endpoint, [](Frames&) {}, "d"));
  Frames five;
  for (int i = 0; i < 5; ++i) five.emplace_back(std::string(8, 'x'));
  ASSERT_TRUE(dealer->send(five).is_ok());
  ASSERT_TRUE(dealer->send_bytes("one").is_ok());
  loop.run();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], std::make_pair(size_t{2}, size_t{6}));  // the identity and five frames
  EXPECT_EQ(seen[1], std::make_pair(size_t{2}, size_t{2}));
  dealer.reset();
  router.reset();
}

// A peer sending more than max_message_bytes loses its connection (ZeroMQ's doing); the
// receiver never sees the message and goes on serving its other peers.
TEST(EventLoop, OversizedMessageDropsOnlyThatPeer) {
  SocketLimits limits;
  limits.max_message_bytes = 1024;
  EventLoop loop(limits);
  auto guard = watchdog(loop);
  std::string endpoint = ipc("limit.sock");
  std::vector<std::string> seen;
  size_t largest = 0;
  std::unique_ptr<Socket> router;
  router = must(loop.bind(socket_type::router, endpoint, [&](Frames& f) {
    largest = std::max(largest, f[1].size());
    seen.push_back(text(f[0]) + ":" + text(f[1]).substr(0, 16));
    EXPECT_TRUE(router->send_to(text(f[0]), "pong").is_ok());
  }));
  // The router's monitor tells us when the big sender's connection has been dropped.
  ASSERT_EQ(zmq_socket_monitor(router->raw().handle(), "inproc://limit-monitor", ZMQ_EVENT_DISCONNECTED), 0);
  bool disconnected = false, pong = false;
  std::unique_ptr<Socket> small;
  auto monitor = must(loop.connect(socket_type::pair, "inproc://limit-monitor", [&](Frames& f) {
    uint16_t event = 0;
    std::memcpy(&event, f[0].data(), sizeof(event));
    if (event != ZMQ_EVENT_DISCONNECTED || disconnected) return;
    disconnected = true;
    EXPECT_TRUE(small->send_bytes("ping").is_ok());
  }));
  auto big = must(loop.connect(
      socket_type::dealer, endpoint, [](Frames&) {}, "big"));
  small = must(loop.connect(
      socket_type::dealer, endpoint,
      [&](Frames& f) {
        if (text(f[0]) == "pong" && disconnected) {
          pong = true;
          loop.stop();
        }
      },
      "small"));
  ASSERT_TRUE(big->send_bytes(std::string(4096, 'B')).is_ok());
  loop.run();
  EXPECT_TRUE(disconnected);
  EXPECT_TRUE(pong);
  EXPECT_LE(largest, 1024u);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), "small:ping"), 1);
  for (const auto& s : seen) EXPECT_NE(s.rfind("big:", 0), 0u) << s;
  monitor.reset();
}

TEST(EventLoop, BindErrorsNameTheEndpoint) {
  EventLoop loop;
  auto noop = [](Frames&) {};
  std::string missing = "ipc://" + test::temp_dir() + "/no/such/dir/s.sock";
  auto r1 = loop.bind(socket_type::router, missing, noop);
  ASSERT_FALSE(r1.is_ok());
  EXPECT_NE(r1.status().message().find(missing), std::string::npos) << r1.status().message();
  EXPECT_NE(r1.status().message().find("No such file or directory"), std::string::npos) << r1.status().message();

  auto r2 = loop.bind(socket_type::router, "bogus://x", noop);
  ASSERT_FALSE(r2.is_ok());
  EXPECT_EQ(r2.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r2.status().message().find("bogus://x"), std::string::npos);

  // A live listener keeps its path; ZeroMQ alone would let the second bind steal it.
  std::string endpoint = ipc("taken.sock");
  auto first = must(loop.bind(socket_type::router, endpoint, noop));
  auto r3 = loop.bind(socket_type::router, endpoint, noop);
  ASSERT_FALSE(r3.is_ok());
  EXPECT_NE(r3.status().message().find(endpoint), std::string::npos);
  EXPECT_NE(r3.status().message().find("Address already in use"), std::string::npos) << r3.status().message();

  // A stale socket file (its process died without unlinking it) is replaced.
  std::string stale_path = test::temp_dir() + "/stale.sock";
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, stale_path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);
  EXPECT_TRUE(loop.bind(socket_type::router, "ipc://" + stale_path, noop).is_ok());

  auto tcp = must(loop.bind(socket_type::router, "tcp://127.0.0.1:*", noop));
  EXPECT_EQ(tcp->endpoint().rfind("tcp://127.0.0.1:", 0), 0u);
  EXPECT_EQ(tcp->endpoint().find('*'), std::string::npos) << tcp->endpoint();
}

TEST(EventLoop, TimersFireAndDieWithTheirHandle) {
  EventLoop loop;
  auto guard = watchdog(loop);
  int once = 0, ticks = 0, cancelled = 0, self_destroyed = 0, mutual = 0;
  std::unique_ptr<EventLoop::Timer> t_once, t_every, t_cancelled, t_self, a, b;

  t_once = loop.after(5ms, [&] { ++once; });
  t_every = loop.every(2ms, [&] {
    if (++ticks == 5) t_every.reset();  // destroyed from inside its own callback
  });
  t_cancelled = loop.after(5ms, [&] { ++cancelled; });
  t_cancelled.reset();
  t_self = loop.after(1ms, [&] {
    ++self_destroyed;
    t_self.reset();
  });
  // Two timers whose expiries are both already queued: whichever runs first cancels the
  // other, which must then not run (its completion is queued, its handle is gone).
  auto setup = loop.after(0ms, [&] {
    a = loop.after(1ms, [&] {
      ++mutual;
      b.reset();
    });
    b = loop.after(1ms, [&] {
      ++mutual;
      a.reset();
    });
    std::this_thread::sleep_for(10ms);
  });
  auto end = loop.after(100ms, [&] { loop.stop(); });
  loop.run();
  EXPECT_EQ(once, 1);
  EXPECT_EQ(ticks, 5);
  EXPECT_EQ(cancelled, 0);
  EXPECT_EQ(self_destroyed, 1);
  EXPECT_EQ(mutual, 1);
}

TEST(EventLoop, EveryKeepsTicking) {
  EventLoop loop;
  auto guard = watchdog(loop);
  int ticks = 0;
  auto t = loop.every(1ms, [&] {
    if (++ticks == 20) loop.stop();
  });
  loop.run();
  EXPECT_EQ(ticks, 20);
}

TEST(EventLoop, StopFromAnotherThread) {
  EventLoop loop;
  auto guard = watchdog(loop);
  std::promise<void> running;
  auto started = loop.after(0ms, [&] { running.set_value(); });
  std::thread stopper([&] {
    running.get_future().wait();
    loop.stop();
  });
  loop.run();  // returns only through stop()
  stopper.join();

  // stop() before run(): run() returns at once, and the loop can run again afterwards.
  loop.stop();
  loop.run();
  bool again = false;
  auto second = loop.after(0ms, [&] {
    again = true;
    loop.stop();
  });
  loop.run();
  EXPECT_TRUE(again);
}

TEST(EventLoop, SignalsArriveOnTheLoop) {
  EventLoop loop;
  auto guard = watchdog(loop);
  int got = 0;
  std::thread::id handler_thread;
  loop.on_signal({SIGUSR1}, [&](int sig) {
    got = sig;
    handler_thread = std::this_thread::get_id();
    loop.stop();
  });
  auto raise = loop.after(1ms, [] { std::raise(SIGUSR1); });
  loop.run();
  EXPECT_EQ(got, SIGUSR1);
  EXPECT_EQ(handler_thread, std::this_thread::get_id());
}

// Two loops on two threads, one DEALER and one ROUTER over ipc://: the round trip an actor
// pays per request. Printed, not asserted (the machine is shared).
TEST(EventLoop, PingPongRoundTripAcrossThreads) {
  constexpr int kWarmup = 500, kRounds = 5000;
  std::string endpoint = ipc("pingpong.sock");
  EventLoop server, client;
  auto server_guard = watchdog(server, 60s);
  auto client_guard = watchdog(client, 60s);
  std::unique_ptr<Socket> router, dealer;
  router = must(server.bind(socket_type::router, endpoint, [&](Frames& f) {
    EXPECT_TRUE(router->send(f).is_ok());  // echo [identity, payload] back as it came
  }));
  std::thread server_thread([&] { server.run(); });

  std::vector<int64_t> rtt;
  rtt.reserve(kRounds);
  int64_t t0 = 0;
  int rounds = 0;
  zmq::message_t payload(64);
  std::memset(payload.data(), 'p', payload.size());
  auto ping = [&] {
    Frames f;
    f.emplace_back().copy(payload);
    t0 = now_us();
    EXPECT_TRUE(dealer->send(f).is_ok());
  };
  dealer = must(client.connect(socket_type::dealer, endpoint, [&](Frames& f) {
    int64_t t = now_us() - t0;
    if (rounds++ >= kWarmup) rtt.push_back(t);
    if (rounds == kWarmup + kRounds) {
      client.stop();
      return;
    }
    ping();
  }));
  ping();
  client.run();
  server.stop();
  server_thread.join();

  ASSERT_EQ(rtt.size(), size_t{kRounds});
  std::sort(rtt.begin(), rtt.end());
  std::printf(
      "[ ping-pong ] DEALER<->ROUTER over ipc://, two loops on two threads, %d rounds: median %lld us, "
      "p90 %lld us, p99 %lld us, min %lld us\n",
      kRounds, static_cast<long long>(rtt[rtt.size() / 2]), static_cast<long long>(rtt[rtt.size() * 9 / 10]),
      static_cast<long long>(rtt[rtt.size() * 99 / 100]), static_cast<long long>(rtt.front()));
}

}  // namespace
}  // namespace tandem::runtime
