// #18 item 5: memory bounds a client cannot step around. A frame larger than the largest
// legitimate client message (a 60 MiB request id, a 100 MiB message in 25 MiB parts) is
// dropped by the client socket before the scheduler holds it; a client that stops reading
// holds at most --client-send-bytes of queued replies; a large reply (a non-streaming request
// with top logprobs) arrives split into messages of at most 16 KiB, whole.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "runtime/wire.h"
#include "tandem/client.h"
#include "tandem/v1/client.pb.h"
#include "tests/e2e/deployment.h"

namespace tandem::test {
namespace {

using namespace std::chrono_literals;

// The bound asserted on the scheduler's peak memory over its baseline: the attacks send 60 and
// 100 MiB, and a scheduler that held them (or a copy) would pass it.
constexpr uint64_t kRssMarginKib = 64 << 10;
// Replies are split at scheduler/client_outbox.h's kReplyChunkBytes.
constexpr size_t kReplyChunkBytes = 16 << 10;

// The bound asserted on the scheduler's peak memory while a client sends a 100 MiB message of
// small or empty frames: ZeroMQ holds at most the client message bound (1.2 MiB) of one
// message's frames, and its buffers and the other client's request add a few MiB.
constexpr uint64_t kMultipartMarginKib = 16 << 10;

// A client speaking the wire protocol itself, with a receive queue of `rcvhwm` messages;
// with the server's public key, over CurveZMQ with a key pair of its own.
class RawPeer {
 public:
  explicit RawPeer(const std::string& endpoint, int rcvhwm = 1000, const std::string& server_key = {})
      : socket_(ctx_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::rcvhwm, rcvhwm);
    socket_.set(zmq::sockopt::rcvbuf, 4096);
    socket_.set(zmq::sockopt::linger, 0);
    if (!server_key.empty()) {
      char pub[41], secret[41];
      EXPECT_EQ(zmq_curve_keypair(pub, secret), 0);
      socket_.set(zmq::sockopt::curve_serverkey, server_key);
      socket_.set(zmq::sockopt::curve_publickey, std::string(pub));
      socket_.set(zmq::sockopt::curve_secretkey, std::string(secret));
    }
    EXPECT_EQ(zmq_socket_monitor(socket_.handle(), "inproc://raw-peer-events", ZMQ_EVENT_DISCONNECTED), 0);
    events_.connect("inproc://raw-peer-events");
    socket_.connect(endpoint);
  }
  // One message of `frames` frames of `frame_bytes` each.
  void send_frames(size_t frames, size_t frame_bytes) {
    for (size_t i = 0; i < frames; ++i)
      (void)socket_.send(zmq::message_t(frame_bytes),
                         i + 1 < frames ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  // Whether the scheduler dropped this peer's connection within `limit`.
  bool dropped_within(std::chrono::milliseconds limit) {
    events_.set(zmq::sockopt::rcvtimeo, static_cast<int>(limit.count()));
    zmq::message_t event;
    return events_.recv(event).has_value();
  }
  void send(v1::ClientMessage& m) {
    m.set_version(runtime::kProtocolVersion);
    (void)socket_.send(runtime::to_frame(m), zmq::send_flags::none);
  }
  void send_parts(std::vector<zmq::message_t>& parts) {
    for (size_t i = 0; i < parts.size(); ++i)
      (void)socket_.send(parts[i], i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  void submit(const std::string& id, uint32_t max_tokens, bool stream, int32_t top_logprobs) {
    v1::ClientMessage m;
    v1::Submit* s = m.mutable_submit();
    s->set_request_id(id);
    for (int32_t t : {3, 4, 5, 6, 7, 8, 9, 10}) s->mutable_tokens()->add_ids(t);
    s->set_max_tokens(max_tokens);
    s->set_ignore_eos(true);
    s->set_stream(stream);
    s->set_logprobs(true);
    s->mutable_sampling()->set_top_logprobs(top_logprobs);
    send(m);
  }
  void tokenize(uint64_t query_id, const std::string& text) {
    v1::ClientMessage m;
    m.mutable_tokenize()->set_query_id(query_id);
    m.mutable_tokenize()->set_text(text);
    send(m);
  }
  void heartbeat() {
    v1::ClientMessage m;
    m.mutable_heartbeat();
    send(m);
  }
  // One message, or nothing within `limit`.
  std::optional<zmq::message_t> recv(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    do {
      zmq::message_t frame;
      if (socket_.recv(frame, zmq::recv_flags::dontwait)) return frame;
      std::this_thread::sleep_for(2ms);
    } while (std::chrono::steady_clock::now() < deadline);
    return std::nullopt;
  }

 private:
  zmq::context_t ctx_;
  zmq::socket_t socket_;
  zmq::socket_t events_{ctx_, zmq::socket_type::pair};
};

// What a raw peer read of its requests until each had its final event.
struct Received {
  size_t bytes = 0, messages = 0, largest = 0;
  std::map<std::string, size_t> tokens;
  std::map<std::string, v1::FinalEvent> finals;
};

Received read_until_final(RawPeer& peer, size_t requests, std::chrono::milliseconds limit) {
  Received got;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (got.finals.size() < requests && std::chrono::steady_clock::now() < deadline) {
    auto frame = peer.recv(100ms);
    if (!frame) continue;
    got.bytes += frame->size();
    got.largest = std::max(got.largest, frame->size());
    ++got.messages;
    v1::SchedulerReply r;
    EXPECT_TRUE(runtime::parse_frame(*frame, r).is_ok());
    for (const auto& ev : r.events().requests()) {
      got.tokens[ev.request_id()] += static_cast<size_t>(ev.tokens_size());
      if (ev.has_final()) got.finals[ev.request_id()] = ev.final();
    }
  }
  return got;
}

// A client library connection (null, and a failure, when it cannot connect).
std::unique_ptr<Client> client_at(const std::string& endpoint, const std::string& server_key = {}) {
  ClientOptions o;
  o.endpoint = endpoint;
  o.curve_server_key = server_key;
  auto c = Client::connect(o);
  EXPECT_TRUE(c) << c.status().to_string();
  return c ? std::move(c).value() : nullptr;
}

TokenizeRequest text_query(std::string text) {
  TokenizeRequest q;
  q.text = std::move(text);
  return q;
}

// The service still serves: a request of another client gets all its tokens.
void expect_serving(const std::string& endpoint, const std::string& server_key = {}) {
  auto c = client_at(endpoint, server_key);
  ASSERT_TRUE(c);
  GenerateRequest r;
  r.prompt_tokens = {3, 4, 5};
  r.max_tokens = 4;
  auto s = c->generate(r);
  Event e;
  int tokens = 0;
  while (s->next(e) && !e.final) ++tokens;
  EXPECT_EQ(e.fin.reason, FinishReason::kLength) << e.fin.error_message;
  EXPECT_EQ(tokens, 4);
}

class ClientSize : public ::testing::Test {
 protected:
  // `endpoint` and `server_key`: where clients reach it, when not the deployment's ipc:// default.
  void start(std::vector<std::string> extra = {}, std::string endpoint = {}, const std::string& server_key = {}) {
    std::vector<std::string> flags = {"--workers", "1", "--threads", "1", "--kv-memory", "67108864"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    d_ = std::make_unique<Deployment>(flags);
    ASSERT_TRUE(d_->ok());
    scheduler_ = scheduler_pid(d_->pid());
    ASSERT_GT(scheduler_, 0);
    expect_serving(endpoint.empty() ? d_->endpoint() : endpoint, server_key);  // the baseline includes serving
    baseline_kib_ = proc_status_kib(scheduler_, "VmHWM");
  }
  // The scheduler's peak memory since it started, over the baseline.
  uint64_t peak_growth_kib() const { return proc_status_kib(scheduler_, "VmHWM") - baseline_kib_; }

  std::unique_ptr<Deployment> d_;
  pid_t scheduler_ = -1;
  uint64_t baseline_kib_ = 0;
};

TEST_F(ClientSize, ASixtyMiBRequestIdIsRefusedWithBoundedMemory) {
  start();
  RawPeer peer(d_->endpoint());
  // An id past the admission limit but within a message: refused, naming the field and the
  // limit, with the id echoed cut.
  v1::ClientMessage m;
  m.mutable_submit()->set_request_id(std::string(100000, 'i'));
  m.mutable_submit()->mutable_tokens()->add_ids(3);
  m.mutable_submit()->set_max_tokens(1);
  peer.send(m);
  auto frame = peer.recv(10s);
  ASSERT_TRUE(frame);
  v1::SchedulerReply r;
  ASSERT_TRUE(runtime::parse_frame(*frame, r).is_ok());
  ASSERT_EQ(r.events().requests_size(), 1);
  EXPECT_EQ(r.events().requests(0).request_id().size(), 256u);
  EXPECT_EQ(r.events().requests(0).final().error_code(), v1::ERROR_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(r.events().requests(0).final().error_message(), "request_id: 100000 bytes, at most 256");

  // 60 MiB: larger than any legitimate client message, dropped with its connection.
  m.mutable_submit()->set_request_id(std::string(60 << 20, 'x'));
  peer.send(m);
  m.Clear();
  const auto reply = peer.recv(5s);
  EXPECT_FALSE(reply) << "the 60 MiB submit was read and answered (" << reply->size() << " bytes)";
  expect_serving(d_->endpoint());
  EXPECT_LT(peak_growth_kib(), kRssMarginKib) << "the scheduler's peak memory grew by " << peak_growth_kib() << " KiB";
}

TEST_F(ClientSize, AHundredMiBMultipartMessageIsRefusedWithBoundedMemory) {
  start();
  RawPeer peer(d_->endpoint());
  // Three small parts: refused, and the peer is told why.
  std::vector<zmq::message_t> parts;
  for (int i = 0; i < 3; ++i) parts.emplace_back(std::string(10, 'p'));
  peer.send_parts(parts);
  auto frame = peer.recv(10s);
  ASSERT_TRUE(frame);
  v1::SchedulerReply r;
  ASSERT_TRUE(runtime::parse_frame(*frame, r).is_ok());
  EXPECT_EQ(r.error().code(), v1::ERROR_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(r.error().message(), "expected one frame per message, got 3");

  // 100 MiB in four parts of 25 MiB, each within ZeroMQ's old 64 MiB frame bound.
  parts.clear();
  for (int i = 0; i < 4; ++i) parts.emplace_back(std::string(25 << 20, 'q'));
  peer.send_parts(parts);
  parts.clear();
  EXPECT_FALSE(peer.recv(5s)) << "the 100 MiB message was read and answered";
  expect_serving(d_->endpoint());
  EXPECT_LT(peak_growth_kib(), kRssMarginKib) << "the scheduler's peak memory grew by " << peak_growth_kib() << " KiB";
}

// #18 item 5: ZMQ_MAXMSGSIZE bounds a frame, and ZeroMQ (4.3) held a message of many frames
// whole until its last one arrived: 100 MiB as 1 KiB frames, or as 1.6 million empty ones,
// each far under the frame bound, grew the scheduler by ~100 MiB (VmHWM) before it could look at
// the message. tandem's libzmq patch (third_party/libzmq/) bounds a message's frames in total
// (each charged 64 bytes besides its payload) by the client message bound: ZeroMQ drops the
// connection as it reads past it, and other clients are served meanwhile and after. Over ipc://
// and over tcp:// with CurveZMQ (whose frames carry their "more" flag encrypted).
class ClientMultipart : public ClientSize, public ::testing::WithParamInterface<bool> {};

TEST_P(ClientMultipart, AHundredMiBMessageOfSmallOrEmptyFramesIsDroppedWithBoundedMemory) {
  const bool curve = GetParam();
  std::string endpoint, server_key;
  if (curve) {
    const std::string keys = temp_dir() + "/keys";
    ASSERT_EQ(wait_for(spawn({TANDEM_TANDEM_BIN, "keys", "--out", keys}, keys + ".out"), 30s), 0);
    server_key = slurp(keys + "/server.pub").substr(0, 40);
    endpoint = "tcp://127.0.0.1:" + std::to_string(free_port());
    start({"--curve-keys", keys, "--endpoint", endpoint}, endpoint, server_key);
  } else {
    start();
    endpoint = d_->endpoint();
  }
  for (const auto& [n, size] : {std::pair<size_t, size_t>{102400, 1024}, {size_t{100} << 14, 0}}) {
    const size_t frames = n, frame_bytes = size;  // (clang 14 captures no structured binding)
    RawPeer peer(endpoint, 1000, server_key);
    std::thread flood([&] { peer.send_frames(frames, frame_bytes); });
    expect_serving(endpoint, server_key);  // while the flood arrives
    flood.join();
    EXPECT_TRUE(peer.dropped_within(20s)) << frames << " frames of " << frame_bytes << " bytes: not dropped";
    expect_serving(endpoint, server_key);
    std::printf("%zu frames of %zu bytes (%s): the scheduler's peak memory grew by %llu KiB\n", frames, frame_bytes,
                curve ? "tcp://, CurveZMQ" : "ipc://", static_cast<unsigned long long>(peak_growth_kib()));
    EXPECT_LT(peak_growth_kib(), kMultipartMarginKib)
        << frames << " frames of " << frame_bytes << " bytes: the scheduler's peak memory grew by " << peak_growth_kib()
        << " KiB";
  }
}

INSTANTIATE_TEST_SUITE_P(OverIpcAndCurve, ClientMultipart, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "TcpCurve" : "Ipc"; });

TEST_F(ClientSize, AClientThatStopsReadingHoldsAtMostItsByteBudget) {
  constexpr size_t kBudget = 256 << 10;
  start({"--client-send-bytes", std::to_string(kBudget)});
  RawPeer slow(d_->endpoint(), /*rcvhwm=*/1);
  // 16 streams of 490 tokens with 20 top logprobs each: about 1.7 MB of events.
  for (int i = 0; i < 16; ++i) slow.submit("slow-" + std::to_string(i), 490, /*stream=*/true, 20);
  ClientOptions o;
  o.endpoint = d_->endpoint();
  auto watcher = Client::connect(o);
  ASSERT_TRUE(watcher);
  StatusInfo st;
  for (int i = 0; i < 400; ++i) {
    slow.heartbeat();
    st = (*watcher)->status(5s).value();
    if (st.running == 0 && st.queued == 0 && st.requests_finished >= 17) break;
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_EQ(st.running, 0u);
  // Everything queued for it arrives now: at most the budget, beyond what the kernel's socket
  // buffers and the peer's own queue hold (512 KiB allowed for them).
  const Received got = read_until_final(slow, 16, 30s);
  ASSERT_EQ(got.finals.size(), 16u) << "every request ends with a final event";
  EXPECT_LT(got.bytes, kBudget + (512 << 10)) << got.messages << " messages";
  int ended_early = 0;
  for (const auto& [id, fin] : got.finals) {
    const bool success =
        fin.finish_reason() == v1::FINISH_REASON_LENGTH || fin.finish_reason() == v1::FINISH_REASON_STOP;
    ended_early += !success;
    if (success) {
      EXPECT_EQ(got.tokens.at(id), fin.usage().completion_tokens()) << id;
    } else {
      EXPECT_NE(fin.error_message().find("stopped reading"), std::string::npos) << fin.error_message();
    }
  }
  std::printf("the client that stopped reading got %zu bytes in %zu messages; %d of 16 requests ended early\n",
              got.bytes, got.messages, ended_early);
  EXPECT_GT(ended_early, 0) << "the budget was never reached: the test shows nothing";
  expect_serving(d_->endpoint());
}

// A text that the tiny model's vocabulary makes into about one id per 2 bytes.
std::string many_token_text(size_t bytes) {
  std::string text;
  for (uint32_t i = 0; text.size() < bytes; ++i) text += std::to_string(i * 7919 % 100000) + (i % 3 ? " " : ", ");
  return text;
}

// #18 item 5: tokenize replies are split as events are (a reply to a 1 MiB text can be several
// MiB: past the client's budget on its own), and the client library puts them together.
TEST_F(ClientSize, ALargeTokenizeReplyArrivesSplitAndWhole) {
  start();
  const std::string text = many_token_text(400 << 10);
  RawPeer peer(d_->endpoint());
  peer.tokenize(9, text);
  size_t messages = 0, largest = 0, ids = 0, count = 0;
  for (bool more = true; more;) {
    auto frame = peer.recv(30s);
    ASSERT_TRUE(frame) << "the reply ended after " << messages << " messages";
    v1::SchedulerReply r;
    ASSERT_TRUE(runtime::parse_frame(*frame, r).is_ok());
    ASSERT_TRUE(r.has_tokenized());
    ASSERT_EQ(r.tokenized().error_message(), "");
    EXPECT_EQ(r.tokenized().query_id(), 9u);
    ++messages, largest = std::max(largest, frame->size());
    ids += static_cast<size_t>(r.tokenized().ids_size());
    count = r.tokenized().count(), more = r.tokenized().more();
  }
  std::printf("a %zu-byte text: %zu ids in %zu messages of at most %zu bytes\n", text.size(), ids, messages, largest);
  EXPECT_EQ(ids, count);
  EXPECT_GT(ids, size_t{100000});
  EXPECT_GT(messages, 10u);
  EXPECT_LE(largest, kReplyChunkBytes);
  auto c = client_at(d_->endpoint());
  ASSERT_TRUE(c);
  auto got = c->tokenize(text_query(text), 30s);
  ASSERT_TRUE(got) << got.status().to_string();
  EXPECT_EQ(got->size(), count);
}

// A client that asks for large tokenize replies and never reads them holds at most its byte
// budget of them: before they were split, each queued reply was the whole reply (400 KB
// here), and the queue bound derived from the budget (48 messages of 16 KiB) held 40 of them.
// A reply larger than the whole budget is refused, saying so.
TEST_F(ClientSize, AClientThatNeverReadsItsTokenizeRepliesHoldsAtMostItsByteBudget) {
  constexpr size_t kBudget = 768 << 10;
  start({"--client-send-bytes", std::to_string(kBudget)});
  const std::string text = many_token_text(400 << 10);
  RawPeer slow(d_->endpoint(), /*rcvhwm=*/1);
  for (uint64_t q = 1; q <= 40; ++q) slow.tokenize(q, text);
  // Served meanwhile; then the queries are all answered (the pool answers in order).
  expect_serving(d_->endpoint());
  auto c = client_at(d_->endpoint());
  ASSERT_TRUE(c);
  auto probed = c->tokenize(text_query(text), 60s);
  ASSERT_TRUE(probed) << probed.status().to_string() << "\n" << d_->output();
  std::this_thread::sleep_for(500ms);
  size_t bytes = 0, messages = 0;
  while (auto frame = slow.recv(2s)) bytes += frame->size(), ++messages;
  std::printf("the client that did not read got %zu bytes in %zu messages; the scheduler's peak grew by %llu KiB\n",
              bytes, messages, static_cast<unsigned long long>(peak_growth_kib()));
  EXPECT_GT(messages, 0u);
  EXPECT_LT(bytes, kBudget + (512 << 10));
  // (The scheduler's peak memory is printed, not bounded here: it is the working memory of 40
  // texts of 400 KB being tokenized, ~50 MiB, and several times that under ASan.)
  const TokenizeRequest probe = text_query(many_token_text((1 << 20) - 64));
  auto refused = c->tokenize(probe, 60s);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), Code::kOverloaded);
  EXPECT_NE(refused.status().message().find("larger than this client's send budget"), std::string::npos)
      << refused.status().message();
  auto counted = c->count_tokens(probe, 60s);  // the count is still given
  ASSERT_TRUE(counted) << counted.status().to_string();
  EXPECT_EQ(*counted, probe.text.size() + 1);
  expect_serving(d_->endpoint());
}

TEST_F(ClientSize, ALargeReplyArrivesSplitAndWhole) {
  start();
  RawPeer peer(d_->endpoint());
  // Not streamed: 490 tokens with 20 top logprobs each (about 100 KB) travel with the final.
  peer.submit("big", 490, /*stream=*/false, 20);
  const Received got = read_until_final(peer, 1, 60s);
  ASSERT_EQ(got.finals.count("big"), 1u);
  const v1::FinalEvent& fin = got.finals.at("big");
  EXPECT_EQ(fin.finish_reason(), v1::FINISH_REASON_LENGTH) << fin.error_message();
  EXPECT_EQ(fin.usage().completion_tokens(), 490u);
  EXPECT_EQ(got.tokens.at("big"), 490u);
  EXPECT_GT(got.messages, 1u);
  EXPECT_LE(got.largest, kReplyChunkBytes) << "over " << got.messages << " messages";
  // The client library puts it together.
  ClientOptions o;
  o.endpoint = d_->endpoint();
  auto c = Client::connect(o);
  ASSERT_TRUE(c);
  GenerateRequest r;
  r.prompt_tokens = {3, 4, 5, 6, 7, 8, 9, 10};
  r.max_tokens = 490;
  r.ignore_eos = true;
  r.stream = false;
  r.logprobs = true;
  r.top_logprobs = 20;
  auto s = (*c)->generate(r);
  Event e;
  size_t tokens = 0, tops = 0;
  while (s->next(e) && !e.final) ++tokens, tops += e.token.top.size();
  EXPECT_EQ(e.fin.reason, FinishReason::kLength) << e.fin.error_message;
  EXPECT_EQ(tokens, 490u);
  EXPECT_EQ(tops, 490u * 20);
}

}  // namespace
}  // namespace tandem::test
