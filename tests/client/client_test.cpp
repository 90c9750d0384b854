// libtandem-client against a fake scheduler: a ROUTER socket on ipc:// driven by the test
// thread with scripted replies. Every wait is bounded.
#include "tandem/client.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <ctime>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <zmq.hpp>

#include "client/harness.h"
#include "tandem/v1/client.pb.h"
#include "tests/test_util.h"

extern char** environ;

namespace tandem {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Received {
  std::string identity;
  v1::ClientMessage msg;
};

class FakeScheduler {
 public:
  FakeScheduler() : ctx_(1), router_(ctx_, zmq::socket_type::router) {
    endpoint_ = "ipc://" + test::temp_dir() + "/scheduler.sock";
    router_.set(zmq::sockopt::linger, 0);
    router_.set(zmq::sockopt::router_mandatory, 1);
    router_.bind(endpoint_);
  }
  const std::string& endpoint() const { return endpoint_; }

  // The next message from a client, skipping heartbeats (counted) unless `keep_heartbeats`.
  std::optional<Received> recv(std::chrono::milliseconds timeout = 5s, bool keep_heartbeats = false) {
    const auto until = Clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, left);
      if (!(item.revents & ZMQ_POLLIN)) continue;
      zmq::message_t id, body;
      EXPECT_TRUE(router_.recv(id));
      EXPECT_TRUE(router_.recv(body));
      EXPECT_FALSE(body.more()) << "every client message is one frame";
      Received r;
      r.identity = id.to_string();
      EXPECT_TRUE(r.msg.ParseFromArray(body.data(), static_cast<int>(body.size())));
      EXPECT_EQ(r.msg.version(), uint32_t{v1::PROTOCOL_VERSION_CURRENT});
      if (r.msg.has_heartbeat()) {
        ++heartbeats;
        if (!keep_heartbeats) continue;
      }
      return r;
    }
  }

  void send(const std::string& identity, v1::SchedulerReply reply) {
    if (!reply.version()) reply.set_version(v1::PROTOCOL_VERSION_CURRENT);
    std::string bytes;
    reply.SerializeToString(&bytes);
    router_.send(zmq::buffer(identity), zmq::send_flags::sndmore);
    router_.send(zmq::buffer(bytes), zmq::send_flags::none);
  }

  // Tokens (id, text) for request `id`, with a final event when `finish` is set.
  void events(const std::string& identity, const std::string& id, std::vector<std::pair<int, std::string>> tokens,
              std::optional<v1::FinishReason> finish = std::nullopt) {
    send(identity, events_reply(id, std::move(tokens), finish));
  }
  static v1::SchedulerReply events_reply(const std::string& id, std::vector<std::pair<int, std::string>> tokens,
                                         std::optional<v1::FinishReason> finish = std::nullopt) {
    v1::SchedulerReply r;
    r.set_version(v1::PROTOCOL_VERSION_CURRENT);
    auto* ev = r.mutable_events()->add_requests();
    ev->set_request_id(id);
    for (auto& [tok, text] : tokens) {
      auto* t = ev->add_tokens();
      t->set_id(tok);
      t->set_text(text);
      t->set_logprob(-0.5f * tok);
    }
    if (finish) {
      auto* f = ev->mutable_final();
      f->set_finish_reason(*finish);
      f->mutable_usage()->set_prompt_tokens(3);
      f->mutable_usage()->set_completion_tokens(static_cast<uint32_t>(tokens.size()));
      f->mutable_timings()->set_total_ms(12.5);
    }
    return r;
  }

  // One message of any frames to the client, as given (no envelope).
  void send_frames(const std::string& identity, const std::vector<std::string>& frames) {
    router_.send(zmq::buffer(identity), zmq::send_flags::sndmore);
    for (size_t i = 0; i < frames.size(); ++i)
      router_.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }

  void close() { router_.close(); }

  int heartbeats = 0;

 private:
  zmq::context_t ctx_;
  zmq::socket_t router_;
  std::string endpoint_;
};

std::unique_ptr<Client> connect(const FakeScheduler& fake, ClientOptions options = {}) {
  options.endpoint = fake.endpoint();
  auto c = Client::connect(options);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return std::move(c).value();
}

GenerateRequest request(std::string id = {}) {
  GenerateRequest r;
  r.id = std::move(id);
  r.prompt_text = "hello";
  r.max_tokens = 3;
  return r;
}

// Every event of a stream up to and including the final one (bounded).
std::vector<Event> drain(Stream& s, std::chrono::milliseconds limit = 5s) {
  std::vector<Event> out;
  const auto until = Clock::now() + limit;
  while (Clock::now() < until) {
    auto ev = s.next_for(50ms);
    if (!ev) continue;
    out.push_back(*ev);
    if (ev->final) break;
  }
  return out;
}

TEST(Client, StreamsTokensInOrderAndEndsOnce) {
  FakeScheduler fake;
  auto client = connect(fake);
  GenerateRequest req = request();
  req.temperature = 0.7f;
  req.top_k = 5;
  req.seed = 42;
  req.stop_strings = {"\n\n"};
  req.stop_token_sequences = {{1, 2}};
  req.timeout = 10s;
  auto stream = client->generate(req);
  EXPECT_FALSE(stream->id().empty());

  auto got = fake.recv();
  ASSERT_TRUE(got && got->msg.has_submit());
  const v1::Submit& s = got->msg.submit();
  EXPECT_EQ(s.request_id(), stream->id());
  EXPECT_EQ(s.text(), "hello");
  EXPECT_EQ(s.max_tokens(), 3u);
  EXPECT_FLOAT_EQ(s.sampling().temperature(), 0.7f);
  EXPECT_EQ(s.sampling().top_k(), 5);
  EXPECT_EQ(s.sampling().seed(), 42u);
  EXPECT_FLOAT_EQ(s.sampling().top_p(), 1.0f);
  ASSERT_EQ(s.stop_strings_size(), 1);
  EXPECT_EQ(s.stop_strings(0), "\n\n");
  ASSERT_EQ(s.stop_token_sequences_size(), 1);
  EXPECT_EQ(s.stop_token_sequences(0).ids_size(), 2);
  EXPECT_EQ(s.timeout_ms(), 10000u);
  EXPECT_TRUE(s.stream());

  fake.events(got->identity, s.request_id(), {{7, "a"}, {8, "b"}});
  v1::SchedulerReply last;
  auto* ev = last.mutable_events()->add_requests();
  ev->set_request_id(s.request_id());
  auto* t = ev->add_tokens();
  t->set_id(9);
  t->set_text("c");
  auto* top = t->add_top();
  top->set_id(9);
  top->set_logprob(-0.1f);
  auto* f = ev->mutable_final();
  f->set_finish_reason(v1::FINISH_REASON_LENGTH);
  f->mutable_usage()->set_prompt_tokens(4);
  f->mutable_usage()->set_completion_tokens(3);
  f->mutable_usage()->set_cached_prompt_tokens(2);
  f->mutable_timings()->set_queue_ms(1.5);
  f->mutable_timings()->set_ttft_ms(2.5);
  f->mutable_timings()->set_total_ms(3.5);
  f->set_text("\xE2\x82");
  fake.send(got->identity, last);

  Event e;
  std::vector<int32_t> ids;
  std::string text;
  int finals = 0;
  while (stream->next(e)) {
    if (e.final) {
      ++finals;
      EXPECT_EQ(e.fin.reason, FinishReason::kLength);
      EXPECT_EQ(e.fin.prompt_tokens, 4u);
      EXPECT_EQ(e.fin.completion_tokens, 3u);
      EXPECT_EQ(e.fin.cached_prompt_tokens, 2u);
      EXPECT_DOUBLE_EQ(e.fin.queue_ms, 1.5);
      EXPECT_DOUBLE_EQ(e.fin.ttft_ms, 2.5);
      EXPECT_DOUBLE_EQ(e.fin.total_ms, 3.5);
      EXPECT_EQ(e.fin.text, "\xE2\x82");
      EXPECT_TRUE(e.fin.error_code.empty());
    } else {
      ids.push_back(e.token.id);
      text += e.token.text;
      if (e.token.id == 9) {
        ASSERT_EQ(e.token.top.size(), 1u);
        EXPECT_FLOAT_EQ(e.token.top[0].second, -0.1f);
      }
    }
  }
  EXPECT_EQ(ids, (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(text, "abc");
  EXPECT_EQ(finals, 1);
  EXPECT_TRUE(stream->finished());
  EXPECT_FALSE(stream->next(e));
  EXPECT_FALSE(stream->next_for(10ms).has_value());

  // Late events for a finished request are dropped, not delivered.
  fake.events(got->identity, s.request_id(), {{10, "x"}}, v1::FINISH_REASON_STOP);
  EXPECT_FALSE(stream->next_for(100ms).has_value());
}

TEST(Client, TokenPromptAndNonStreaming) {
  FakeScheduler fake;
  auto client = connect(fake);
  GenerateRequest req = request("mine");
  req.prompt_tokens = {1, 2, 3};
  req.no_bos = true;
  req.stream = false;
  auto stream = client->generate(req);
  EXPECT_EQ(stream->id(), "mine");
  auto got = fake.recv();
  ASSERT_TRUE(got && got->msg.has_submit());
  ASSERT_TRUE(got->msg.submit().has_tokens());
  EXPECT_EQ(got->msg.submit().tokens().ids_size(), 3);
  EXPECT_FALSE(got->msg.submit().stream());
  fake.events(got->identity, "mine", {{4, "x"}, {5, "y"}}, v1::FINISH_REASON_STOP);
  auto events = drain(*stream);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].token.id, 4);
  EXPECT_EQ(events[1].token.id, 5);
  EXPECT_TRUE(events[2].final);
  EXPECT_EQ(events[2].fin.reason, FinishReason::kStop);
}

TEST(Client, CallbackApiRunsOnTheIoThread) {
  FakeScheduler fake;
  auto client = connect(fake);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Event> events;
  std::set<std::thread::id> threads;
  const std::string id = client->generate(request(), [&](const Event& e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(e);
    threads.insert(std::this_thread::get_id());
    cv.notify_all();
  });
  EXPECT_FALSE(id.empty());
  auto got = fake.recv();
  ASSERT_TRUE(got && got->msg.has_submit());
  EXPECT_EQ(got->msg.submit().request_id(), id);
  fake.events(got->identity, id, {{1, "x"}});
  fake.events(got->identity, id, {{2, "y"}}, v1::FINISH_REASON_STOP);
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 5s, [&] { return events.size() == 3; }));
  EXPECT_EQ(events[0].token.id, 1);
  EXPECT_EQ(events[1].token.id, 2);
  EXPECT_TRUE(events[2].final);
  EXPECT_EQ(threads.size(), 1u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
  lock.unlock();
  std::this_thread::sleep_for(50ms);
  std::lock_guard<std::mutex> relock(mu);
  EXPECT_EQ(events.size(), 3u);  // nothing after the final event
}

TEST(Client, ManyRequestsMultiplexedOverOneConnection) {
  FakeScheduler fake;
  auto client = connect(fake);
  constexpr int kRequests = 64;
  std::vector<std::shared_ptr<Stream>> streams;
  // Submitted from several threads at once.
  std::mutex mu;
  std::vector<std::thread> submitters;
  for (int t = 0; t < 4; ++t)
    submitters.emplace_back([&, t] {
      for (int i = t; i < kRequests; i += 4) {
        auto s = client->generate(request("r" + std::to_string(i)));
        std::lock_guard<std::mutex> lock(mu);
        streams.push_back(s);
      }
    });
  for (auto& t : submitters) t.join();

  std::string identity;
  std::set<std::string> ids;
  while (ids.size() < kRequests) {
    auto got = fake.recv();
    ASSERT_TRUE(got && got->msg.has_submit());
    if (identity.empty()) identity = got->identity;
    EXPECT_EQ(got->identity, identity) << "one connection per client";
    ids.insert(got->msg.submit().request_id());
  }
  // Interleave: round k sends token k to every request, in reverse order.
  for (int k = 0; k < 3; ++k)
    for (int i = kRequests - 1; i >= 0; --i)
      fake.events(identity, "r" + std::to_string(i), {{i * 10 + k, "r" + std::to_string(i)}},
                  k == 2 ? std::optional(v1::FINISH_REASON_LENGTH) : std::nullopt);
  for (auto& s : streams) {
    const int i = std::stoi(s->id().substr(1));
    auto events = drain(*s);
    ASSERT_EQ(events.size(), 4u) << s->id();
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(events[k].token.id, i * 10 + k);
      EXPECT_EQ(events[k].token.text, s->id());
    }
    EXPECT_TRUE(events[3].final);
  }
}

TEST(Client, DuplicateLiveIdIsRefused) {
  FakeScheduler fake;
  auto client = connect(fake);
  auto a = client->generate(request("same"));
  auto got = fake.recv();
  ASSERT_TRUE(got && got->msg.has_submit());
  auto b = client->generate(request("same"));
  auto eb = drain(*b);
  ASSERT_EQ(eb.size(), 1u);
  EXPECT_EQ(eb[0].fin.reason, FinishReason::kError);
  EXPECT_EQ(eb[0].fin.code, Code::kInvalidArgument);
  EXPECT_EQ(eb[0].fin.error_code, "INVALID_ARGUMENT");
  fake.events(got->identity, "same", {{1, "x"}}, v1::FINISH_REASON_STOP);
  auto ea = drain(*a);
  ASSERT_EQ(ea.size(), 2u);
  EXPECT_EQ(ea[1].fin.reason, FinishReason::kStop);
}

TEST(Client, CancelReachesTheSchedulerAndTheStreamEnds) {
  FakeScheduler fake;
  auto client = connect(fake);
  auto stream = client->generate(request());
  auto got = fake.recv();
  ASSERT_TRUE(got && got->msg.has_submit());
  fake.events(got->identity, stream->id(), {{1, "x"}});
  stream->cancel();
  auto cancel = fake.recv();
  ASSERT_TRUE(cancel && cancel->msg.has_cancel());
  EXPECT_EQ(cancel->msg.cancel().request_id(), stream->id());
  fake.events(got->identity, stream->id(), {}, v1::FINISH_REASON_CANCELLED);
  auto events = drain(*stream);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(events[1].final);
  EXPECT_EQ(events[1].fin.reason, FinishReason::kCancelled);

  // Client::cancel by id, for the callback API.
  std::atomic<int> finals{0};
  std::atomic<bool> cancelled{false};
  const std::string id = client->generate(request(), [&](const Event& e) {
    if (e.final) {
      cancelled = e.fin.reason == FinishReason::kCancelled;
      ++finals;
    }
  });
  got = fake.recv();
  ASSERT_TRUE(got && got->msg.has_submit());
  ASSERT_TRUE(client->cancel(id).is_ok());
  cancel = fake.recv();
  ASSERT_TRUE(cancel && cancel->msg.has_cancel());
  EXPECT_EQ(cancel->msg.cancel().request_id(), id);
  fake.events(got->identity, id, {}, v1::FINISH_REASON_CANCELLED);
  const auto until = Clock::now() + 5s;
  while (finals == 0 && Clock::now() < until) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(finals, 1);
  EXPECT_TRUE(cancelled);
}

TEST(Client, HeartbeatsOnlyWhileRequestsAreInFlight) {
  FakeScheduler fake;
  ClientOptions opt;
  opt.heartbeat_interval = 50ms;
  auto client = connect(fake, opt);
  // Idle: no heartbeats.
  EXPECT_FALSE(fake.recv(200ms).has_value());
  EXPECT_EQ(fake.heartbeats, 0);

  auto stream = client->generate(request());
  auto got = fake.recv();
  ASSERT_TRUE(got && got->msg.has_submit());
  EXPECT_FALSE(fake.recv(500ms).has_value());  // counts heartbeats while waiting
  EXPECT_GE(fake.heartbeats, 3);
  EXPECT_LE(fake.heartbeats, 12);

  fake.events(got->identity, stream->id(), {}, v1::FINISH_REASON_STOP);
  ASSERT_EQ(drain(*stream).size(), 1u);
  fake.recv(60ms);  // one may have been on its way
  const int before = fake.heartbeats;
  EXPECT_FALSE(fake.recv(300ms).has_value());
  EXPECT_EQ(fake.heartbeats, before);
}

TEST(Client, SilentSchedulerEndsTheStreamAfterTheDeadline) {
  FakeScheduler fake;
  ClientOptions opt;
  opt.deadline_grace = 100ms;
  opt.liveness_timeout = 0ms;
  auto client = connect(fake, opt);
  GenerateRequest req = request();
  req.timeout = 200ms;
  const auto start = Clock::now();
  auto stream = client->generate(req);
  auto got = fake.recv();
  ASSERT_TRUE(got && got->msg.has_submit());
  // The fake sends nothing and liveness probing is off: only the client's deadline timer can end
  // the stream. So no upper bound on when (a loaded machine may be late); only not before.
  auto events = drain(*stream, 60s);
  const auto elapsed = Clock::now() - start;
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].fin.reason, FinishReason::kError);
  EXPECT_EQ(events[0].fin.code, Code::kUnavailable);
  EXPECT_EQ(events[0].fin.error_code, "UNAVAILABLE");
  EXPECT_GE(elapsed, 300ms) << "deadline 200 ms + grace 100 ms";
  // The client tells the scheduler to drop it, and a late final event changes nothing.
  auto cancel = fake.recv(1s);
  ASSERT_TRUE(cancel && cancel->msg.has_cancel());
  fake.events(got->identity, stream->id(), {}, v1::FINISH_REASON_CANCELLED);
  EXPECT_FALSE(stream->next_for(100ms).has_value());
}

TEST(Client, SilentSchedulerWithoutDeadlineFailsTheLivenessProbe) {
  FakeScheduler fake;
  ClientOptions opt;
  opt.liveness_timeout = 300ms;
  opt.heartbeat_interval = 1s;
  auto client = connect(fake, opt);
  const std::clock_t cpu_start = std::clock();
  auto stream = client->generate(request());  // no timeout
  auto got = fake.recv();
  ASSERT_TRUE(got && got->msg.has_submit());
  auto probe = fake.recv(2s);
  ASSERT_TRUE(probe && probe->msg.has_status()) << "a status probe after silence";
  auto events = drain(*stream);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].fin.code, Code::kUnavailable);
  // Waiting on a silent scheduler sleeps (the whole wait is 600 ms of wall time).
  EXPECT_LT(double(std::clock() - cpu_start) / CLOCKS_PER_SEC, 0.2);
}

TEST(Client, ProbeAnsweredKeepsTheRequestAlive) {
  FakeScheduler fake;
  ClientOptions opt;
  opt.liveness_timeout = 100ms;
  auto client = connect(fake, opt);
  auto stream = client->generate(request());
  auto got = fake.recv();
  ASSERT_TRUE(got && got->msg.has_submit());
  for (int i = 0; i < 3; ++i) {
    auto probe = fake.recv(2s);
    ASSERT_TRUE(probe && probe->msg.has_status());
    v1::SchedulerReply r;
    r.mutable_status()->set_queued(1);
    fake.send(got->identity, r);
  }
  EXPECT_FALSE(stream->next_for(10ms).has_value());
  fake.events(got->identity, stream->id(), {{1, "x"}}, v1::FINISH_REASON_STOP);
  auto events = drain(*stream);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].fin.reason, FinishReason::kStop);
}

TEST(Client, NoSchedulerAtAllEndsWithUnavailable) {
  ClientOptions opt;
  opt.endpoint = "ipc://" + test::temp_dir() + "/nobody.sock";
  opt.liveness_timeout = 100ms;
  auto client = Client::connect(opt);
  ASSERT_TRUE(client.is_ok());
  auto stream = (*client)->generate(request());
  auto events = drain(*stream);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].fin.code, Code::kUnavailable);
  auto st = (*client)->status(100ms);
  EXPECT_FALSE(st.is_ok());
  EXPECT_EQ(st.status().code(), Code::kUnavailable);
}

TEST(Client, SchedulerGoneEndsTheStreamPromptly) {
  auto fake = std::make_unique<FakeScheduler>();
  ClientOptions opt;
  opt.liveness_timeout = 0ms;  // only the disconnect can end it
  auto client = connect(*fake, opt);
  auto stream = client->generate(request());
  auto got = fake->recv();
  ASSERT_TRUE(got && got->msg.has_submit());
  const auto start = Clock::now();
  fake.reset();
  auto events = drain(*stream);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].fin.code, Code::kUnavailable);
  EXPECT_NE(events[0].fin.error_message.find("lost"), std::string::npos) << events[0].fin.error_message;
  EXPECT_LT(Clock::now() - start, 2s);
}

TEST(Client, ProtocolErrorEndsEverythingInFlight) {
  FakeScheduler fake;
  auto client = connect(fake);
  auto stream = client->generate(request());
  auto got = fake.recv();
  ASSERT_TRUE(got && got->msg.has_submit());
  v1::SchedulerReply r;
  r.mutable_error()->set_code(v1::ERROR_CODE_INVALID_ARGUMENT);
  r.mutable_error()->set_message("bad version");
  fake.send(got->identity, r);
  auto events = drain(*stream);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].fin.code, Code::kInvalidArgument);
  EXPECT_NE(events[0].fin.error_message.find("bad version"), std::string::npos);
}

TEST(Client, MalformedMessagesAreDroppedWholeAndTheStreamGoesOn) {
  FakeScheduler fake;
  auto client = connect(fake);
  auto stream = client->generate(request());
  auto got = fake.recv();
  ASSERT_TRUE(got && got->msg.has_submit());
  // Each message is one frame: a final event with a second frame is dropped, both frames,
  // and so is a frame that does not parse.
  const auto stop = FakeScheduler::events_reply(stream->id(), {}, v1::FINISH_REASON_STOP);
  fake.send_frames(got->identity, {stop.SerializeAsString(), "trailing"});
  fake.send_frames(got->identity, {std::string("\xff\xff\xff", 3)});
  fake.events(got->identity, stream->id(), {{7, "a"}}, v1::FINISH_REASON_LENGTH);
  auto events = drain(*stream);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].token.id, 7);
  ASSERT_TRUE(events[1].final);
  EXPECT_EQ(events[1].fin.reason, FinishReason::kLength);
}

TEST(Client, DestroyingTheClientEndsItsStreams) {
  FakeScheduler fake;
  auto client = connect(fake);
  auto stream = client->generate(request());
  auto got = fake.recv();
  ASSERT_TRUE(got && got->msg.has_submit());
  client.reset();
  auto events = drain(*stream, 1s);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].fin.code, Code::kUnavailable);
  auto cancel = fake.recv(1s);
  ASSERT_TRUE(cancel && cancel->msg.has_cancel());
  EXPECT_EQ(cancel->msg.cancel().request_id(), stream->id());
  stream->cancel();  // harmless after the client is gone
}

TEST(Client, MessagesGoOnTheWireAsAChat) {
  FakeScheduler fake;
  auto client = connect(fake);
  GenerateRequest r = request("chat");
  r.messages = {ChatMessage{"system", "be brief"}, ChatMessage{"assistant", std::nullopt, "", "", "[{\"id\":\"c1\"}]"},
                ChatMessage{"tool", "42", "calc", "c1"}};
  r.tools_json = "[]";
  r.add_generation_prompt = false;
  auto stream = client->generate(r);
  auto got = fake.recv();
  ASSERT_TRUE(got && got->msg.has_submit());
  const v1::Submit& s = got->msg.submit();
  ASSERT_TRUE(s.has_chat()) << "messages take precedence over prompt_text";
  ASSERT_EQ(s.chat().messages_size(), 3);
  EXPECT_EQ(s.chat().messages(0).role(), "system");
  EXPECT_EQ(s.chat().messages(0).content(), "be brief");
  EXPECT_FALSE(s.chat().messages(1).has_content());  // None, not ""
  EXPECT_EQ(s.chat().messages(1).tool_calls_json(), "[{\"id\":\"c1\"}]");
  EXPECT_EQ(s.chat().messages(2).name(), "calc");
  EXPECT_EQ(s.chat().messages(2).tool_call_id(), "c1");
  EXPECT_EQ(s.chat().tools_json(), "[]");
  EXPECT_TRUE(s.chat().no_generation_prompt());
  fake.events(got->identity, "chat", {}, v1::FINISH_REASON_STOP);
  EXPECT_EQ(drain(*stream).size(), 1u);
}

TEST(Client, TokenizeAndCountTokensRoundTrip) {
  FakeScheduler fake;
  auto client = connect(fake);
  std::thread scheduler([&] {
    for (int i = 0; i < 3; ++i) {
      auto got = fake.recv();
      ASSERT_TRUE(got && got->msg.has_tokenize());
      const v1::TokenizeQuery& q = got->msg.tokenize();
      v1::SchedulerReply r;
      v1::TokenizeReply* t = r.mutable_tokenized();
      t->set_query_id(q.query_id());
      if (q.has_chat()) {  // the third: refused
        t->set_error_code(v1::ERROR_CODE_INVALID_ARGUMENT);
        t->set_error_message("messages[0]: unknown role 'asistant'");
      } else {
        EXPECT_EQ(q.text(), "hello");
        EXPECT_TRUE(q.no_bos());
        t->set_count(3);
        if (!q.count_only())
          for (int32_t id : {7, 8, 9}) t->add_ids(id);
      }
      fake.send(got->identity, r);
    }
  });
  TokenizeRequest t;
  t.text = "hello";
  t.no_bos = true;
  auto ids = client->tokenize(t);
  ASSERT_TRUE(ids) << ids.status().to_string();
  EXPECT_EQ(*ids, (std::vector<int32_t>{7, 8, 9}));
  auto n = client->count_tokens(t);
  ASSERT_TRUE(n) << n.status().to_string();
  EXPECT_EQ(*n, 3u);
  t.messages = {ChatMessage{"asistant", "x"}};
  auto refused = client->tokenize(t);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), "messages[0]: unknown role 'asistant'");
  scheduler.join();
}

// Replies over 16 KiB come in parts (the scheduler's split_query_reply): the client puts a
// status's workers and a tokenize reply's ids together, in order. Here three parts each.
TEST(Client, StatusAndTokenizeRepliesInPartsAreJoined) {
  FakeScheduler fake;
  auto client = connect(fake);
  std::thread scheduler([&] {
    for (int i = 0; i < 2; ++i) {
      auto got = fake.recv();
      ASSERT_TRUE(got);
      for (int part = 0; part < 3; ++part) {
        v1::SchedulerReply r;
        if (got->msg.has_status()) {
          v1::StatusReply* s = r.mutable_status();
          s->set_query_id(got->msg.status().query_id());
          if (part == 0) s->set_queued(4);  // the other fields come in the first part only
          for (uint32_t w = 1; w <= 200; ++w) s->add_workers()->set_worker_id(part * 200 + w);
          s->set_more(part < 2);
        } else {
          v1::TokenizeReply* t = r.mutable_tokenized();
          t->set_query_id(got->msg.tokenize().query_id());
          for (int32_t id = 0; id < 1000; ++id) t->add_ids(part * 1000 + id);
          t->set_count(3000);
          t->set_more(part < 2);
        }
        fake.send(got->identity, r);
      }
    }
  });
  auto st = client->status(5s);
  ASSERT_TRUE(st) << st.status().to_string();
  EXPECT_EQ(st->queued, 4u);
  ASSERT_EQ(st->workers.size(), 600u);
  for (uint32_t w = 0; w < 600; ++w) EXPECT_EQ(st->workers[w].id, w + 1);
  TokenizeRequest t;
  t.text = "hello";
  auto ids = client->tokenize(t, 5s);
  ASSERT_TRUE(ids) << ids.status().to_string();
  ASSERT_EQ(ids->size(), 3000u);
  for (int32_t i = 0; i < 3000; ++i) ASSERT_EQ((*ids)[static_cast<size_t>(i)], i);
  scheduler.join();
}

TEST(Client, TokenizeWithoutAReplyIsUnavailableAtItsTimeout) {
  FakeScheduler fake;
  auto client = connect(fake);
  TokenizeRequest t;
  t.text = "hello";
  auto r = client->count_tokens(t, 200ms);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_NE(r.status().message().find("no tokenize reply"), std::string::npos) << r.status().message();
}

// A MetricsQuery answered with a MetricsReply: the text is rendered from it; a reply to another
// query id answers nothing; no reply is UNAVAILABLE at the timeout.
TEST(Client, MetricsTextRendersTheReplyToItsQuery) {
  FakeScheduler fake;
  auto client = connect(fake);
  std::thread scheduler([&] {
    auto got = fake.recv();
    ASSERT_TRUE(got && got->msg.has_metrics());
    v1::SchedulerReply r;
    v1::MetricsReply* m = r.mutable_metrics();
    m->set_query_id(got->msg.metrics().query_id() + 100);  // a stale reply: ignored
    fake.send(got->identity, r);
    m->set_query_id(got->msg.metrics().query_id());
    v1::MetricFamily* f = m->add_families();
    f->set_name("tandem:generation_tokens_total");
    f->set_help("Tokens generated.");
    f->set_type(v1::METRIC_TYPE_COUNTER);
    f->add_metrics()->set_value(42);
    fake.send(got->identity, r);
  });
  auto text = client->metrics_text(5s);
  scheduler.join();
  ASSERT_TRUE(text) << text.status().to_string();
  EXPECT_EQ(*text,
            "# HELP tandem:generation_tokens_total Tokens generated.\n"
            "# TYPE tandem:generation_tokens_total counter\ntandem:generation_tokens_total 42\n");
  auto none = client->metrics_text(200ms);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.status().code(), Code::kUnavailable);
  EXPECT_NE(none.status().message().find("no metrics reply"), std::string::npos) << none.status().message();
}

TEST(Client, StatusRoundTrip) {
  FakeScheduler fake;
  auto client = connect(fake);
  std::thread scheduler([&] {
    auto got = fake.recv();
    ASSERT_TRUE(got && got->msg.has_status());
    v1::SchedulerReply r;
    auto* s = r.mutable_status();
    s->set_queued(2);
    s->set_running(3);
    s->set_requests_total(10);
    s->set_requests_finished(5);
    s->set_tokens_generated(1234);
    s->set_steps(99);
    s->set_scheduler_cpu_ms_per_step(0.25);
    s->set_ready(true);
    s->set_max_step_decode(8);
    s->set_max_step_prefill_tokens(512);
    s->set_decode_stalls(4);
    s->set_preemptions(2);
    auto* w = s->add_workers();
    w->set_worker_id(7);
    w->set_role("decode");
    w->set_pid(4242);
    w->set_alive(true);
    w->set_kv_blocks_total(100);
    w->set_kv_blocks_free(40);
    w->set_running(3);
    w->set_steps(98);
    w->set_tokens(1200);
    w->set_idle_share(0.125);
    w->set_last_heard_ms(321);
    w->set_weight_bytes(134217728);
    w->set_kv_bytes(18446744073709551615ull);
    fake.send(got->identity, r);
  });
  auto info = client->status(5s);
  scheduler.join();
  ASSERT_TRUE(info.is_ok()) << info.status().to_string();
  EXPECT_EQ(info->queued, 2u);
  EXPECT_EQ(info->running, 3u);
  EXPECT_EQ(info->requests_total, 10u);
  EXPECT_EQ(info->requests_finished, 5u);
  EXPECT_EQ(info->tokens_generated, 1234u);
  EXPECT_EQ(info->steps, 99u);
  EXPECT_DOUBLE_EQ(info->scheduler_cpu_ms_per_step, 0.25);
  EXPECT_TRUE(info->ready);
  EXPECT_EQ(info->max_step_decode, 8u);
  EXPECT_EQ(info->max_step_prefill_tokens, 512u);
  EXPECT_EQ(info->decode_stalls, 4u);
  EXPECT_EQ(info->preemptions, 2u);
  ASSERT_EQ(info->workers.size(), 1u);
  const WorkerInfo& w = info->workers[0];
  EXPECT_EQ(w.id, 7u);
  EXPECT_EQ(w.role, "decode");
  EXPECT_EQ(w.pid, 4242u);
  EXPECT_TRUE(w.alive);
  EXPECT_EQ(w.kv_blocks_total, 100u);
  EXPECT_EQ(w.kv_blocks_free, 40u);
  EXPECT_EQ(w.running, 3u);
  EXPECT_EQ(w.steps, 98u);
  EXPECT_EQ(w.tokens, 1200u);
  EXPECT_EQ(w.last_heard_ms, 321u);
  EXPECT_DOUBLE_EQ(w.idle_share, 0.125);
  EXPECT_EQ(w.weight_bytes, 134217728u);
  EXPECT_EQ(w.kv_bytes, 18446744073709551615ull);

  // Unanswered: UNAVAILABLE within the timeout.
  const auto start = Clock::now();
  auto none = client->status(150ms);
  EXPECT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().code(), Code::kUnavailable);
  EXPECT_LT(Clock::now() - start, 2s);
}

// A reply that comes after its query timed out answers no later query: the scheduler echoes
// each query's id. (A scheduler that echoes none is answered in order: StatusRoundTrip.)
TEST(Client, LateStatusReplyAnswersNoLaterQuery) {
  FakeScheduler fake;
  auto client = connect(fake);
  auto late = client->status(100ms);
  EXPECT_EQ(late.status().code(), Code::kUnavailable);
  auto first = fake.recv();
  ASSERT_TRUE(first && first->msg.has_status());
  std::thread scheduler([&] {
    auto second = fake.recv();
    ASSERT_TRUE(second && second->msg.has_status());
    EXPECT_NE(first->msg.status().query_id(), second->msg.status().query_id());
    for (const Received* q : {&*first, &*second}) {
      v1::SchedulerReply r;
      r.mutable_status()->set_query_id(q->msg.status().query_id());
      r.mutable_status()->set_queued(q == &*first ? 1 : 2);
      fake.send(q->identity, r);
    }
  });
  auto info = client->status(5s);
  scheduler.join();
  ASSERT_TRUE(info.is_ok()) << info.status().to_string();
  EXPECT_EQ(info->queued, 2u) << "answered by the reply to the query that timed out";
}

// zmq_poll failing for good (no real socket makes it fail: through the harness) ends the
// client for a reason: what is in flight, and every later call, ends with UNAVAILABLE naming it.
TEST(Client, AFailedPollEndsEveryRequestInFlightAndEveryLaterOne) {
  ClientOptions opt;
  opt.endpoint = "inproc://nobody-binds-this";
  auto harness = ClientHarness::create(opt);
  ASSERT_TRUE(harness.is_ok()) << harness.status().to_string();
  ClientHarness& h = **harness;
  auto in_flight = h.generate(request());
  auto query = h.status(5s);
  h.poll_failed(ETERM);
  auto later = h.generate(request());
  std::vector<Event> callback_events;
  h.generate(request(), [&](const Event& e) { callback_events.push_back(e); });
  auto later_query = h.status(5s);
  auto named = [](const std::string& message) { return message.find("zmq_poll failed") != std::string::npos; };
  for (Stream* s : {in_flight.get(), later.get()}) {
    auto events = drain(*s, 200ms);
    ASSERT_EQ(events.size(), 1u) << s->id();
    EXPECT_EQ(events[0].fin.code, Code::kUnavailable);
    EXPECT_TRUE(named(events[0].fin.error_message)) << events[0].fin.error_message;
  }
  ASSERT_EQ(callback_events.size(), 1u);
  EXPECT_TRUE(callback_events[0].final);
  EXPECT_TRUE(named(callback_events[0].fin.error_message)) << callback_events[0].fin.error_message;
  for (auto* f : {&query, &later_query}) {
    ASSERT_EQ(f->wait_for(0s), std::future_status::ready);
    auto st = f->get();
    EXPECT_EQ(st.status().code(), Code::kUnavailable);
    EXPECT_TRUE(named(st.status().message())) << st.status().message();
  }
}

// milliseconds::max() as "never": no overflow in the deadline, heartbeat and liveness
// arithmetic (it wrapped to the past: heartbeats in a busy loop, requests and status queries
// failed at once).
TEST(Client, MaxDurationsMeanNever) {
  FakeScheduler fake;
  ClientOptions opt;
  opt.heartbeat_interval = opt.request_timeout = opt.deadline_grace = opt.liveness_timeout =
      std::chrono::milliseconds::max();
  auto client = connect(fake, opt);
  auto r = request();
  r.timeout = 50ms;
  auto stream = client->generate(r);
  auto got = fake.recv();
  ASSERT_TRUE(got && got->msg.has_submit());
  auto extra = fake.recv(300ms, /*keep_heartbeats=*/true);
  EXPECT_FALSE(extra) << "no heartbeat and no probe: " << extra->msg.ShortDebugString();
  EXPECT_FALSE(stream->next_for(10ms).has_value()) << "the request ended on its own";
  std::thread scheduler([&] {
    for (int i = 0; i < 2; ++i) {
      auto q = fake.recv();
      ASSERT_TRUE(q && q->msg.has_status());
      v1::SchedulerReply reply;
      reply.mutable_status()->set_query_id(q->msg.status().query_id());
      reply.mutable_status()->set_queued(7);
      fake.send(q->identity, reply);
    }
  });
  auto by_default = client->status();
  auto by_max = client->status(std::chrono::milliseconds::max());
  scheduler.join();
  ASSERT_TRUE(by_default.is_ok()) << by_default.status().to_string();
  ASSERT_TRUE(by_max.is_ok()) << by_max.status().to_string();
  EXPECT_EQ(by_max->queued, 7u);
  fake.events(got->identity, stream->id(), {{1, "x"}}, v1::FINISH_REASON_STOP);
  auto events = drain(*stream);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].fin.reason, FinishReason::kStop);
}

TEST(Client, ConnectRejectsBadOptions) {
  ClientOptions opt;
  EXPECT_EQ(Client::connect(opt).status().code(), Code::kInvalidArgument);
  opt.endpoint = "bogus://x";
  EXPECT_EQ(Client::connect(opt).status().code(), Code::kInvalidArgument);
  opt.endpoint = "ipc://" + test::temp_dir() + "/x.sock";
  opt.heartbeat_interval = 0ms;
  EXPECT_EQ(Client::connect(opt).status().code(), Code::kInvalidArgument);
}

// ---- the `tandem generate` and `tandem status` commands against the fake ----

struct Child {
  pid_t pid = -1;
  int out_fd = -1;
};

Child spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  std::string bin = TANDEM_TANDEM_BIN;
  argv.push_back(bin.data());
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  Child c;
  if (posix_spawn(&c.pid, bin.c_str(), &fa, nullptr, argv.data(), environ) != 0) c.pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  c.out_fd = fds[0];
  if (c.pid < 0) close(c.out_fd);
  return c;
}

// Reads the child's stdout to EOF and reaps it; the exit code, or -1 (bounded: the child is
// killed after `limit`).
int finish(Child& c, std::string& out, std::chrono::milliseconds limit = 10s) {
  const auto until = Clock::now() + limit;
  char buf[4096];
  for (;;) {
    pollfd p{c.out_fd, POLLIN, 0};
    if (Clock::now() > until) {
      kill(c.pid, SIGKILL);
      break;
    }
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = read(c.out_fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(c.out_fd);
  int status = 0;
  waitpid(c.pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(GenerateCommand, JsonLinesAndExitCode) {
  FakeScheduler fake;
  Child child = spawn({"generate", "--endpoint", fake.endpoint(), "--prompt", "hi", "--max-tokens", "4", "--stop", "A",
                       "--stop", "B", "--logprobs", "--json"});
  ASSERT_GT(child.pid, 0) << "cannot start " << TANDEM_TANDEM_BIN;
  auto got = fake.recv(10s);
  ASSERT_TRUE(got && got->msg.has_submit());
  const v1::Submit& s = got->msg.submit();
  EXPECT_EQ(s.text(), "hi");
  EXPECT_EQ(s.max_tokens(), 4u);
  ASSERT_EQ(s.stop_strings_size(), 2);
  EXPECT_EQ(s.stop_strings(1), "B");
  EXPECT_TRUE(s.logprobs());
  fake.events(got->identity, s.request_id(), {{5, "a\"\n"}, {6, std::string("\x01\xff\xC3\xA9", 4)}},
              v1::FINISH_REASON_LENGTH);
  std::string out;
  EXPECT_EQ(finish(child, out), 0);
  EXPECT_EQ(out,
            "{\"type\":\"token\",\"id\":5,\"text\":\"a\\\"\\n\",\"logprob\":-2.5}\n"
            "{\"type\":\"token\",\"id\":6,\"text\":\"\\u0001\\ufffd\xC3\xA9\",\"logprob\":-3}\n"
            "{\"type\":\"final\",\"finish_reason\":\"length\",\"error\":\"\",\"text\":\"\",\"usage\":{\"prompt_"
            "tokens\":3,\"completion_tokens\":2,\"cached_prompt_tokens\":0},\"timings\":{\"queue_ms\":0,\"ttft_ms\":"
            "0,\"total_ms\":12.5}}\n");
}

TEST(GenerateCommand, SigintCancelsAndStillPrintsTheFinalEvent) {
  FakeScheduler fake;
  Child child = spawn({"generate", "--endpoint", fake.endpoint(), "--tokens", "1,2,3", "--json"});
  ASSERT_GT(child.pid, 0) << "cannot start " << TANDEM_TANDEM_BIN;
  auto got = fake.recv(10s);
  ASSERT_TRUE(got && got->msg.has_submit());
  EXPECT_EQ(got->msg.submit().tokens().ids_size(), 3);
  fake.events(got->identity, got->msg.submit().request_id(), {{5, "a"}});
  kill(child.pid, SIGINT);
  auto cancel = fake.recv(5s);
  ASSERT_TRUE(cancel && cancel->msg.has_cancel());
  fake.events(got->identity, got->msg.submit().request_id(), {}, v1::FINISH_REASON_CANCELLED);
  std::string out;
  EXPECT_EQ(finish(child, out), 130);
  EXPECT_NE(out.find("\"finish_reason\":\"cancelled\""), std::string::npos) << out;
}

TEST(GenerateCommand, ErrorExitsOne) {
  FakeScheduler fake;
  Child child = spawn({"generate", "--endpoint", fake.endpoint(), "--prompt", "x"});
  ASSERT_GT(child.pid, 0) << "cannot start " << TANDEM_TANDEM_BIN;
  auto got = fake.recv(10s);
  ASSERT_TRUE(got && got->msg.has_submit());
  v1::SchedulerReply r;
  auto* ev = r.mutable_events()->add_requests();
  ev->set_request_id(got->msg.submit().request_id());
  ev->mutable_final()->set_finish_reason(v1::FINISH_REASON_ERROR);
  ev->mutable_final()->set_error_code(v1::ERROR_CODE_OVERLOADED);
  ev->mutable_final()->set_error_message("queue full");
  fake.send(got->identity, r);
  std::string out;
  EXPECT_EQ(finish(child, out), 1);
}

TEST(StatusCommand, Json) {
  FakeScheduler fake;
  Child child = spawn({"status", "--endpoint", fake.endpoint(), "--json"});
  ASSERT_GT(child.pid, 0) << "cannot start " << TANDEM_TANDEM_BIN;
  auto got = fake.recv(10s);
  ASSERT_TRUE(got && got->msg.has_status());
  v1::SchedulerReply r;
  r.mutable_status()->set_ready(true);
  r.mutable_status()->set_queued(1);
  auto* w = r.mutable_status()->add_workers();
  w->set_worker_id(0);
  w->set_role("both");
  w->set_idle_share(0.5);
  w->set_last_heard_ms(250);
  fake.send(got->identity, r);
  std::string out;
  EXPECT_EQ(finish(child, out), 0);
  EXPECT_NE(out.find("\"ready\":true,\"queued\":1,"), std::string::npos) << out;
  EXPECT_NE(out.find("\"role\":\"both\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"idle_share\":0.5,\"last_heard_ms\":250,"), std::string::npos) << out;
}

// Golden: `tandem status --json` byte for byte, every field set (uint64 values past 2^53 and
// fractions that %.7g rounds) and a worker whose fields are all zero (zeros are printed).
// Field names, order, nesting and number formats are a contract with scripts that read it.
TEST(StatusCommand, JsonGolden) {
  FakeScheduler fake;
  Child child = spawn({"status", "--endpoint", fake.endpoint(), "--json"});
  ASSERT_GT(child.pid, 0) << "cannot start " << TANDEM_TANDEM_BIN;
  auto got = fake.recv(10s);
  ASSERT_TRUE(got && got->msg.has_status());
  v1::SchedulerReply r;
  v1::StatusReply* s = r.mutable_status();
  s->set_queued(2);
  s->set_running(3);
  s->set_requests_total(18446744073709551615ull);
  s->set_requests_finished(9007199254740993ull);
  s->set_tokens_generated(1234);
  s->set_steps(99);
  s->set_scheduler_cpu_ms_per_step(0.123456789);
  s->set_ready(true);
  s->set_max_step_decode(8);
  s->set_max_step_prefill_tokens(512);
  s->set_decode_stalls(4);
  s->set_preemptions(5);
  s->set_handoffs(6);
  s->set_handoff_bytes(7340032);
  s->set_handoff_ms_mean(1.5);
  s->set_handoff_ms_p99(12345678.9);
  s->set_handoff_failures(1);
  s->set_prompt_tokens(1000);
  s->set_cached_prompt_tokens(250);
  s->set_prefix_hit_rate(0.25);
  s->set_draining(true);
  s->set_tokens_per_s_last_minute(1e-9);
  s->set_requests_finished_last_minute(17);
  s->set_planning_stalls(3);
  s->set_query_id(got->msg.status().query_id());
  v1::WorkerStatus* w = s->add_workers();
  w->set_worker_id(7);
  w->set_role("prefill");
  w->set_pid(4242);
  w->set_alive(true);
  w->set_kv_blocks_total(100);
  w->set_kv_blocks_free(40);
  w->set_running(3);
  w->set_steps(98);
  w->set_tokens(4294967296ull);
  w->set_idle_share(1.0 / 3.0);
  w->set_idle_us(11);
  w->set_compute_us(22);
  w->set_kv_blocks_cached(9);
  w->set_kv_evictions(10);
  w->set_last_heard_ms(321);
  w->set_weight_bytes(134217728);
  w->set_kv_bytes(18446744073709551615ull);
  w->set_spec_tokens(4);
  w->set_spec_rounds(50);
  w->set_drafts(120);
  w->set_drafts_accepted(90);
  w->set_state_slots_total(64);
  w->set_state_slots_free(61);
  w->set_kv_ring_blocks_total(13);
  w->set_kv_ring_blocks_free(11);
  w->set_kv_ring_blocks_cached(2);
  w->set_checkpoints_total(16);
  w->set_checkpoints_free(12);
  s->add_workers();  // every field zero
  fake.send(got->identity, r);
  std::string out;
  EXPECT_EQ(finish(child, out), 0);
  EXPECT_EQ(
      out,
      "{\"ready\":true,\"queued\":2,\"running\":3,\"requests_total\":18446744073709551615,"
      "\"requests_finished\":9007199254740993,\"tokens_generated\":1234,\"steps\":99,"
      "\"scheduler_cpu_ms_per_step\":0.1234568,\"max_step_decode\":8,\"max_step_prefill_tokens\":512,"
      "\"decode_stalls\":4,\"preemptions\":5,\"handoffs\":6,\"handoff_bytes\":7340032,\"handoff_failures\":1,"
      "\"handoff_ms_mean\":1.5,\"handoff_ms_p99\":1.234568e+07,\"prompt_tokens\":1000,"
      "\"cached_prompt_tokens\":250,\"prefix_hit_rate\":0.25,\"draining\":true,"
      "\"tokens_per_s_last_minute\":1e-09,\"requests_finished_last_minute\":17,\"planning_stalls\":3,\"workers\":["
      "{\"id\":7,\"role\":\"prefill\",\"pid\":4242,\"alive\":true,\"kv_blocks_total\":100,\"kv_blocks_free\":40,"
      "\"kv_blocks_cached\":9,\"kv_evictions\":10,\"running\":3,\"steps\":98,\"tokens\":4294967296,"
      "\"idle_share\":0.3333333,\"last_heard_ms\":321,\"weight_bytes\":134217728,"
      "\"kv_bytes\":18446744073709551615,\"spec_tokens\":4,\"spec_rounds\":50,\"drafts\":120,"
      "\"drafts_accepted\":90,\"state_slots_total\":64,\"state_slots_free\":61,\"kv_ring_blocks_total\":13,"
      "\"kv_ring_blocks_free\":11,\"kv_ring_blocks_cached\":2,\"checkpoints_total\":16,\"checkpoints_free\":12},"
      "{\"id\":0,\"role\":\"\",\"pid\":0,\"alive\":false,\"kv_blocks_total\":0,\"kv_blocks_free\":0,"
      "\"kv_blocks_cached\":0,\"kv_evictions\":0,\"running\":0,\"steps\":0,\"tokens\":0,"
      "\"idle_share\":0,\"last_heard_ms\":0,\"weight_bytes\":0,\"kv_bytes\":0,"
      "\"spec_tokens\":0,\"spec_rounds\":0,\"drafts\":0,\"drafts_accepted\":0,\"state_slots_total\":0,"
      "\"state_slots_free\":0,\"kv_ring_blocks_total\":0,\"kv_ring_blocks_free\":0,\"kv_ring_blocks_cached\":0,"
      "\"checkpoints_total\":0,\"checkpoints_free\":0}]}\n");
}

}  // namespace
}  // namespace tandem
