// The HTTP gateway end to end: `tandem up` plus `tandem gateway` as real processes on
// loopback, driven by the official OpenAI SDK (node, pinned), curl and raw sockets.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "model/gguf.h"
#include "model/make_model.h"
#include "runtime/json.h"
#include "tandem/client.h"
#include "tests/e2e/deployment.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

const std::vector<std::string> kDeploy = {"--workers", "1", "--threads", "1"};

// ChatML over the tiny preset's byte-level vocabulary (the markers are text).
constexpr const char* kChatTemplate =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

// make-model's tiny file with a chat template; made once per process.
std::string chat_model() {
  static const std::string path = [] {
    auto tiny = model::GgufFile::open(test::model_file("tiny", 1)).value();
    model::GgufWriter w;
    for (const std::string& key : tiny->keys_in_file_order()) w.add_value(key, *tiny->find(key));
    w.add_string("tokenizer.chat_template", kChatTemplate);
    for (const model::GgufTensor& t : tiny->tensors())
      w.add_tensor(t.name, t.dims, static_cast<model::TensorType>(t.type), t.data, t.nbytes);
    const std::string out = test::temp_dir() + "/tiny-chat.gguf";
    EXPECT_TRUE(w.write(out).is_ok());
    return out;
  }();
  return path;
}

// A connected loopback TCP socket with receive and send timeouts; -1 on failure.
int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, const std::string& s) {
  for (size_t off = 0; off < s.size();) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Everything the peer sends until it closes (or the receive timeout).
std::string read_all(int fd) {
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

struct Reply {
  int status = 0;
  std::string head, body;
};

Reply parse_reply(const std::string& raw) {
  Reply r;
  const size_t end = raw.find("\r\n\r\n");
  if (raw.size() < 12 || end == std::string::npos) return r;
  r.status = std::atoi(raw.c_str() + 9);
  r.head = raw.substr(0, end);
  r.body = raw.substr(end + 4);
  return r;
}

// One request on its own connection ("Connection: close"), the whole reply.
Reply http(int port, const std::string& method, const std::string& path, const std::string& body = "",
           const std::string& headers = "") {
  const int fd = connect_to(port);
  if (fd < 0) return {};
  send_all(fd, method + " " + path +
                   " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: "
                   "application/json\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n" + headers + "\r\n" + body);
  Reply r = parse_reply(read_all(fd));
  ::close(fd);
  return r;
}

// One response read from a kept-alive connection: by Content-Length, or a chunked body to its
// terminator. Empty status when the connection closed first.
Reply read_response(int fd, std::string& carry) {
  char buf[65536];
  auto more = [&] {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) carry.append(buf, static_cast<size_t>(n));
    return n > 0;
  };
  size_t end;
  while ((end = carry.find("\r\n\r\n")) == std::string::npos)
    if (!more()) return {};
  Reply r = parse_reply(carry.substr(0, end + 4));
  const size_t cl = r.head.find("Content-Length: ");
  if (cl != std::string::npos) {
    const size_t len = std::stoul(r.head.substr(cl + 16));
    while (carry.size() < end + 4 + len)
      if (!more()) return {};
    r.body = carry.substr(end + 4, len);
    carry.erase(0, end + 4 + len);
    return r;
  }
  size_t term;
  while ((term = carry.find("\r\n0\r\n\r\n", end)) == std::string::npos)
    if (!more()) return {};
  r.body = carry.substr(end + 4, term - end - 4);
  carry.erase(0, term + 7);
  return r;
}

std::string post_request(const std::string& path, const std::string& body, const std::string& headers = "") {
  return "POST " + path +
         " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n" + headers + "\r\n" + body;
}

// `tandem gateway` in the background, accepting and ready when constructed.
class GatewayProcess {
 public:
  GatewayProcess(const std::string& endpoint, const std::string& model, std::vector<std::string> extra = {},
                 bool wait_ready = true) {
    port_ = test::free_port();
    out_ = test::temp_dir() + "/gateway.out";
    std::vector<std::string> argv = {TANDEM_TANDEM_BIN, "gateway", "--endpoint", endpoint,
                                     "--model",         model,     "--listen",   "127.0.0.1:" + std::to_string(port_)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    pid_ = test::spawn(argv, out_);
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < deadline) {
      if (test::slurp(out_).find("listening on") != std::string::npos &&
          (!wait_ready || http(port_, "GET", "/ready").status == 200))
        return;
      std::this_thread::sleep_for(50ms);
    }
    ADD_FAILURE() << "the gateway did not become ready:\n" << test::slurp(out_) << log();
  }
  ~GatewayProcess() {
    if (pid_ > 0) {
      test::signal_one(pid_, SIGTERM);
      EXPECT_EQ(test::wait_for(pid_, 10s), 0) << log();
    }
  }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }
  // Its log lines (spdlog writes them to stdout) and stderr.
  std::string log() const { return test::slurp(out_) + test::slurp(out_ + ".err"); }

 private:
  int port_ = 0;
  pid_t pid_ = -1;
  std::string out_;
};

// The text of an SSE stream's completion chunks (as JSON escapes it), and how many chunks
// carried a token.
struct SseText {
  std::string text;
  int token_events = 0;
  bool done = false;
};

SseText sse_text(const std::string& stream) {
  SseText out;
  for (size_t at = 0; (at = stream.find("data: ", at)) != std::string::npos;) {
    const size_t end = stream.find("\n\n", at);
    const std::string event = stream.substr(at + 6, end - at - 6);
    at = end;
    if (event == "[DONE]") {
      out.done = true;
      continue;
    }
    const size_t t = event.find("\"text\":\"");
    if (t == std::string::npos || event.find("\"finish_reason\":null") == std::string::npos) continue;
    size_t i = t + 8;
    while (i < event.size() && event[i] != '"') i += event[i] == '\\' ? 2 : 1;
    out.text += event.substr(t + 8, i - t - 8);
    ++out.token_events;
  }
  return out;
}

TEST(Gateway, TheOpenAISdkDrivesCompletionsAndChatStreamingAndNot) {
  const char* sdk = std::getenv("TANDEM_OPENAI_SDK");
  ASSERT_TRUE(sdk) << "TANDEM_OPENAI_SDK (the npm ci install of tests/gateway/openai-sdk) is not set";
  test::Deployment d(kDeploy, chat_model());
  ASSERT_TRUE(d.ok());
  GatewayProcess g(d.endpoint(), chat_model(), {"--model-name", "tiny-chat"});
  const auto r =
      test::run_command("NODE_PATH=" + test::shell_quote(std::string(sdk) + "/node_modules") + " node " +
                        test::shell_quote(std::string(TANDEM_SOURCE_DIR) + "/tests/gateway/openai-sdk/sdk_test.cjs") +
                        " " + g.url() + " tiny-chat");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err << g.log();
  EXPECT_NE(r.out.find("ok: models lists the served model"), std::string::npos) << r.out;
}

// `curl -N` streams one event per token, and the tokens are those `tandem generate` gets for
// the same greedy request.
TEST(Gateway, ACurlStreamCarriesTheTokensOfTandemGenerate) {
  test::Deployment d(kDeploy);
  ASSERT_TRUE(d.ok());
  GatewayProcess g(d.endpoint(), test::model_file("tiny", 1));
  const auto curl = test::run_command(
      "curl -sN " + g.url() +
      "/completions -H 'Content-Type: application/json' -d '{\"prompt\":\"The sky\",\"max_tokens\":24,"
      "\"ignore_eos\":true,\"stream\":true}'");
  ASSERT_EQ(curl.exit_code, 0) << curl.err;
  const SseText sse = sse_text(curl.out);
  const auto gen = test::run_command(std::string(TANDEM_TANDEM_BIN) + " generate --endpoint " + d.endpoint() +
                                     " --prompt 'The sky' --max-tokens 24 --ignore-eos");
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  EXPECT_EQ(sse.token_events, 24) << curl.out;
  EXPECT_TRUE(sse.done) << curl.out;
  ASSERT_FALSE(gen.out.empty());
  // generate prints the bytes and a newline; JSON carries them escaped (invalid UTF-8 as U+FFFD,
  // which the tiny model's random bytes give): the same escaping of the same bytes.
  const std::string escaped = runtime::json_string(gen.out.substr(0, gen.out.size() - 1));
  EXPECT_EQ(sse.text, escaped.substr(1, escaped.size() - 2)) << curl.out;
}

// POST /tokenize of `text` without special tokens: the ids, comma-separated ("" on failure).
std::string tokenize(int port, const std::string& text) {
  const Reply t = http(port, "POST", "/tokenize", "{\"prompt\":\"" + text + "\",\"add_special_tokens\":false}");
  const size_t at = t.body.find("\"tokens\":[");
  EXPECT_TRUE(t.status == 200 && at != std::string::npos) << t.body;
  if (at == std::string::npos) return "";
  return t.body.substr(at + 10, t.body.find(']', at) - at - 10);
}

// A logit_bias object of n entries, token ids 0..n-1.
std::string many_biases(int n) {
  std::string out = "{";
  for (int i = 0; i < n; ++i) out += (i ? ",\"" : "\"") + std::to_string(i) + "\":-1";
  return out + "}";
}

// logit_bias of +100 on one token forces it at every step, even sampling at temperature 1;
// presence and frequency penalties are accepted (their effect is the sampler tests').
TEST(Gateway, LogitBiasForcesATokenAndPenaltiesAreAccepted) {
  test::Deployment d(kDeploy);
  ASSERT_TRUE(d.ok());
  GatewayProcess g(d.endpoint(), test::model_file("tiny", 1));
  const std::string id = tokenize(g.port(), "q");
  ASSERT_FALSE(id.empty());
  const std::string body =
      "{\"prompt\":\"The sky\",\"max_tokens\":12,\"ignore_eos\":true,\"stream\":true,"
      "\"temperature\":1,\"seed\":5,\"logit_bias\":{\"" +
      id + "\":100,\"0\":-100}}";
  const Reply forced = http(g.port(), "POST", "/v1/completions", body);
  ASSERT_EQ(forced.status, 200) << forced.body;
  const SseText sse = sse_text(forced.body);
  EXPECT_EQ(sse.token_events, 12) << forced.body;
  EXPECT_EQ(sse.text, std::string(12, 'q')) << forced.body;
  const Reply penalized = http(g.port(), "POST", "/v1/completions",
                               "{\"prompt\":\"The sky\",\"max_tokens\":24,\"ignore_eos\":true,\"frequency_penalty\":2,"
                               "\"presence_penalty\":-2}");
  ASSERT_EQ(penalized.status, 200) << penalized.body;
  EXPECT_NE(penalized.body.find("\"completion_tokens\":24"), std::string::npos) << penalized.body;
}

TEST(Gateway, BadRequestsGetTheOpenAIErrorObjectAndTheGatewayKeepsServing) {
  test::Deployment d(kDeploy);
  ASSERT_TRUE(d.ok());
  GatewayProcess g(d.endpoint(), test::model_file("tiny", 1), {"--model-name", "tiny"});
  struct Case {
    std::string body;
    int status;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"{\"prompt\": \"x\", ", 400, "not valid JSON"},
      {"[1,2]", 400, "must be a JSON object"},
      {"{\"prompt\": 5}", 400, "\"param\":\"prompt\""},
      {"{\"prompt\": \"x\", \"max_tokens\": \"ten\"}", 400, "max_tokens: must be an integer"},
      {"{\"prompt\": \"x\", \"max_tokens\": 0}", 400, "max_tokens: 0 is outside"},
      {"{\"prompt\": \"x\", \"temperature\": -1}", 400, "\"param\":\"temperature\""},
      {"{\"prompt\": \"x\", \"stream\": \"yes\"}", 400, "stream: must be true or false"},
      {"{\"prompt\": \"x\", \"model\": \"gpt-4\"}", 404, "model_not_found"},
      {"{\"prompt\": \"x\", \"best_of\": 3}", 400, "\"param\":\"best_of\""},
      {"{\"prompt\": \"x\", \"presence_penalty\": 2.5}", 400, "\"param\":\"presence_penalty\""},
      {"{\"prompt\": \"x\", \"frequency_penalty\": \"1\"}", 400, "\"param\":\"frequency_penalty\""},
      {"{\"prompt\": \"x\", \"logit_bias\": [5]}", 400, "\"param\":\"logit_bias\""},
      {"{\"prompt\": \"x\", \"logit_bias\": {\"five\": 10}}", 400, "key 'five' is not a token id"},
      {"{\"prompt\": \"x\", \"logit_bias\": {\"5\": 101}}", 400, "the bias of token 5 must be a number in [-100, 100]"},
      {"{\"prompt\": \"x\", \"logit_bias\": {\"5\": \"up\"}}", 400, "\"param\":\"logit_bias\""},
      {"{\"prompt\": \"x\", \"logit_bias\": {\"512\": 1}}", 400, "token id 512 is outside the vocabulary of 512"},
      {"{\"prompt\": \"x\", \"logit_bias\": " + many_biases(301) + "}", 400,
       "301 entries, at most 300 (OpenAI's limit)"},
      {"{\"prompt\": [1, 2, 999999]}", 400, "\"error\""},  // the scheduler's refusal, mapped
      {std::string(100, '[') + std::string(100, ']'), 400, "deeper than 64"},
  };
  for (const Case& c : cases) {
    const Reply r = http(g.port(), "POST", "/v1/completions", c.body);
    EXPECT_EQ(r.status, c.status) << c.body << "\n" << r.body;
    EXPECT_NE(r.body.find(c.says), std::string::npos) << c.body << "\n" << r.body;
    EXPECT_NE(r.body.find("\"type\":"), std::string::npos) << r.body;
  }
  EXPECT_EQ(http(g.port(), "POST", "/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                 "\"response_format\":{\"type\":\"json_object\"}}")
                .status,
            400);
  EXPECT_EQ(http(g.port(), "GET", "/v2/nothing").status, 404);
  EXPECT_EQ(http(g.port(), "GET", "/v1/completions").status, 405);
  // Unknown fields are ignored, and logged once per name.
  for (int i = 0; i < 2; ++i) {
    const Reply ok = http(g.port(), "POST", "/v1/completions",
                          "{\"prompt\":\"x\",\"max_tokens\":2,\"store\":true,\"frobnicate\":1,\"model\":\"tiny\"}");
    EXPECT_EQ(ok.status, 200) << ok.body;
    EXPECT_NE(ok.body.find("\"completion_tokens\":2"), std::string::npos) << ok.body;
  }
  const std::string log = g.log();
  const size_t first = log.find("ignoring request field 'frobnicate'");
  EXPECT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find("ignoring request field 'frobnicate'", first + 1), std::string::npos) << log;
  // One access-log line per request, with the id the response carries.
  const Reply models = http(g.port(), "GET", "/v1/models");
  EXPECT_NE(models.body.find("\"id\":\"tiny\""), std::string::npos) << models.body;
  const size_t id_at = models.head.find("X-Request-Id: ");
  ASSERT_NE(id_at, std::string::npos) << models.head;
  const std::string id = models.head.substr(id_at + 14, 20);
  std::this_thread::sleep_for(100ms);
  EXPECT_NE(g.log().find(id + " 127.0.0.1 \"GET /v1/models\" 200"), std::string::npos) << g.log();
}

// No scheduler answers: the gateway still serves, and says 503.
TEST(Gateway, WithoutAReadySchedulerRequestsGet503) {
  const std::string endpoint = "ipc://" + test::temp_dir() + "/nobody.sock";
  GatewayProcess g(endpoint, test::model_file("tiny", 1), {}, /*wait_ready=*/false);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(http(g.port(), "GET", "/ready").status, 503);
  EXPECT_EQ(http(g.port(), "GET", "/health").status, 503);
  const Reply r = http(g.port(), "POST", "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2}");
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("not ready"), std::string::npos) << r.body;
}

// 100 streams whose clients close mid-stream (each as its first token event arrives): every
// request is cancelled, and within a second no KV block is in use but cached ones.
TEST(Gateway, StreamsClosedMidStreamAreCancelledAndTheirBlocksFreedWithinASecond) {
  test::Deployment d(kDeploy);
  ASSERT_TRUE(d.ok());
  GatewayProcess g(d.endpoint(), test::model_file("tiny", 1));
  const std::string body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":400,\"ignore_eos\":true,\"stream\":true}";
  std::vector<pollfd> fds;
  for (int i = 0; i < 100; ++i) {
    const int fd = connect_to(g.port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_all(fd,
                         "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         "Content-Length: " +
                             std::to_string(body.size()) + "\r\n\r\n" + body));
    fds.push_back(pollfd{fd, POLLIN, 0});
  }
  size_t open = fds.size();
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  char buf[65536];
  while (open > 0 && std::chrono::steady_clock::now() < deadline) {
    ASSERT_GE(::poll(fds.data(), fds.size(), 1000), 0);
    for (pollfd& p : fds) {
      if (p.fd < 0 || !(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = ::recv(p.fd, buf, sizeof buf, 0);
      ASSERT_GT(n, 0) << "the gateway closed a stream" << g.log();
      if (std::string_view(buf, static_cast<size_t>(n)).find("data: ") == std::string_view::npos) continue;
      ::close(p.fd);  // mid-stream: 400 tokens asked for, one seen
      p.fd = -1;
      --open;
    }
  }
  ASSERT_EQ(open, 0u) << "streams that never began";
  const auto closed = std::chrono::steady_clock::now();
  ClientOptions o;
  o.endpoint = d.endpoint();
  auto client = Client::connect(o).value();
  StatusInfo st;
  uint32_t in_use = 1;
  while (std::chrono::steady_clock::now() - closed < 1s) {
    st = client->status().value();
    in_use = 0;
    for (const WorkerInfo& w : st.workers) in_use += w.kv_blocks_total - w.kv_blocks_free - w.kv_blocks_cached;
    if (in_use == 0 && st.running == 0 && st.queued == 0) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(in_use, 0u);
  EXPECT_EQ(st.running, 0u);
  EXPECT_EQ(st.queued, 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - closed, 1s);
  EXPECT_LT(st.tokens_generated, 100u * 400u / 2) << "the requests ran on instead of being cancelled";
  std::this_thread::sleep_for(200ms);
  const std::string log = g.log();
  size_t cancelled = 0;
  for (size_t at = 0; (at = log.find("cancelled: the client closed", at)) != std::string::npos; ++at) ++cancelled;
  EXPECT_EQ(cancelled, 100u) << log.substr(0, 4000);
}

// Several requests, streamed and not, on one kept-alive connection.
TEST(Gateway, AKeptAliveConnectionServesRequestAfterRequest) {
  test::Deployment d(kDeploy);
  ASSERT_TRUE(d.ok());
  GatewayProcess g(d.endpoint(), test::model_file("tiny", 1));
  const int fd = connect_to(g.port());
  ASSERT_GE(fd, 0);
  std::string carry;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(send_all(fd, post_request("/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":3}")));
    const Reply plain = read_response(fd, carry);
    EXPECT_EQ(plain.status, 200) << plain.body;
    EXPECT_NE(plain.body.find("\"completion_tokens\":3"), std::string::npos) << plain.body;
    ASSERT_TRUE(send_all(fd, post_request("/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":3,\"stream\":true}")));
    const Reply streamed = read_response(fd, carry);
    EXPECT_EQ(streamed.status, 200);
    EXPECT_NE(streamed.body.find("data: [DONE]"), std::string::npos) << streamed.body;
  }
  // Two requests sent at once (pipelined) are answered in order.
  ASSERT_TRUE(send_all(fd, post_request("/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":2}") +
                               "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_NE(read_response(fd, carry).body.find("text_completion"), std::string::npos);
  EXPECT_NE(read_response(fd, carry).body.find("\"object\":\"list\""), std::string::npos);
  ::close(fd);
}

// Limits: a body past --max-body-bytes is 413, a header past 16 KiB 431, a request not
// received within --read-timeout-ms 408 (slow-loris), an idle connection is closed; other
// clients are served meanwhile.
TEST(Gateway, OversizedAndSlowRequestsGetClear4xxAndOthersAreServed) {
  test::Deployment d(kDeploy);
  ASSERT_TRUE(d.ok());
  GatewayProcess g(d.endpoint(), test::model_file("tiny", 1),
                   {"--max-body-bytes", "65536", "--read-timeout-ms", "800"});
  {
    const int fd = connect_to(g.port());
    send_all(fd,
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n" + std::string(4096, ' '));
    const Reply r = parse_reply(read_all(fd));
    EXPECT_EQ(r.status, 413) << r.head;
    EXPECT_NE(r.body.find("exceeds 65536 bytes"), std::string::npos) << r.body;
    ::close(fd);
  }
  const auto curl = test::run_command(
      "head -c 200000 /dev/zero | tr '\\0' ' ' > big.json; curl -s -o /dev/null -w '%{http_code}' "
      "--data-binary @big.json " +
      g.url() + "/completions");
  EXPECT_EQ(curl.out, "413") << curl.err;
  {
    const Reply r = http(g.port(), "GET", "/v1/models", "", "X-Flood: " + std::string(20000, 'a') + "\r\n");
    EXPECT_EQ(r.status, 431) << r.head;
  }
  const int slow = connect_to(g.port()), idle = connect_to(g.port());
  const auto start = std::chrono::steady_clock::now();
  send_all(slow, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le");
  EXPECT_EQ(http(g.port(), "GET", "/v1/models").status, 200);  // served while the slow one hangs
  const Reply r = parse_reply(read_all(slow));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.status, 408) << r.head;
  EXPECT_GE(waited, 700ms);
  EXPECT_LT(waited, 5s);
  EXPECT_EQ(read_all(idle), "");  // closed without a word
  ::close(slow);
  ::close(idle);
  EXPECT_EQ(http(g.port(), "GET", "/health").status, 200);
}

TEST(Gateway, ApiKeysAreRequiredAndNameTheCallerInTheAccessLog) {
  test::Deployment d(kDeploy);
  ASSERT_TRUE(d.ok());
  const std::string keys = test::temp_dir() + "/keys";
  {
    std::ofstream f(keys);
    f << "# who may call\nsk-0123456789abcdef alice\nsk-fedcba9876543210\n";
  }
  GatewayProcess g(d.endpoint(), test::model_file("tiny", 1), {"--api-key-file", keys});
  const std::string body = "{\"prompt\":\"a\",\"max_tokens\":2}";
  const Reply none = http(g.port(), "POST", "/v1/completions", body);
  EXPECT_EQ(none.status, 401);
  EXPECT_NE(none.head.find("WWW-Authenticate: Bearer"), std::string::npos) << none.head;
  EXPECT_NE(none.body.find("invalid_api_key"), std::string::npos) << none.body;
  EXPECT_EQ(http(g.port(), "POST", "/v1/completions", body, "Authorization: Bearer sk-0123456789abcdeX\r\n").status,
            401);
  EXPECT_EQ(http(g.port(), "POST", "/v1/completions", body, "Authorization: Bearer sk-0123456789abcdef\r\n").status,
            200);
  EXPECT_EQ(http(g.port(), "GET", "/v1/models", "", "Authorization: Bearer sk-fedcba9876543210\r\n").status, 200);
  EXPECT_EQ(http(g.port(), "GET", "/health").status, 200);  // probes need no key
  std::this_thread::sleep_for(100ms);
  EXPECT_NE(g.log().find("\"POST /v1/completions\" 200 "), std::string::npos);
  EXPECT_NE(g.log().find("principal=alice"), std::string::npos) << g.log();
  EXPECT_NE(g.log().find("principal=key-3"), std::string::npos) << g.log();
}

// `tandem up --http` starts the gateway with the deployment and restarts it when it dies.
TEST(Gateway, TandemUpHttpStartsTheGatewaySupervised) {
  const int port = test::free_port();
  test::Deployment d({"--workers", "1", "--threads", "1", "--http", "127.0.0.1:" + std::to_string(port), "--model-name",
                      "served", "--restart-backoff-ms", "100"});
  ASSERT_TRUE(d.ok());
  auto served = [&] {
    const Reply r = http(port, "POST", "/v1/completions", "{\"model\":\"served\",\"prompt\":\"a\",\"max_tokens\":2}");
    return r.status == 200 && r.body.find("\"completion_tokens\":2") != std::string::npos;
  };
  auto wait_served = [&] {
    for (auto until = std::chrono::steady_clock::now() + 20s; std::chrono::steady_clock::now() < until;
         std::this_thread::sleep_for(50ms))
      if (served()) return true;
    return false;
  };
  ASSERT_TRUE(wait_served()) << d.output();
  pid_t gateway = -1;
  std::ifstream children("/proc/" + std::to_string(d.pid()) + "/task/" + std::to_string(d.pid()) + "/children");
  for (pid_t p; children >> p;)
    if (test::slurp("/proc/" + std::to_string(p) + "/cmdline").find(std::string("\0gateway\0", 9)) != std::string::npos)
      gateway = p;
  ASSERT_GT(gateway, 0) << d.output();
  test::signal_one(gateway, SIGKILL);
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(wait_served()) << d.output();
  EXPECT_NE(d.output().find("gateway (pid " + std::to_string(gateway) + ") exited"), std::string::npos) << d.output();
}

// HTTPS with --tls-cert/--tls-key (a self-signed certificate made here): whole and streamed
// responses, and a plain-HTTP client on the TLS port is refused without disturbing others.
TEST(Gateway, ServesHttpsWithTheGivenCertificate) {
  const std::string dir = test::temp_dir();
  const auto made = test::run_command("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost -keyout " +
                                      dir + "/key.pem -out " + dir + "/cert.pem");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  test::Deployment d(kDeploy);
  ASSERT_TRUE(d.ok());
  GatewayProcess g(d.endpoint(), test::model_file("tiny", 1),
                   {"--tls-cert", dir + "/cert.pem", "--tls-key", dir + "/key.pem"}, /*wait_ready=*/false);
  const std::string curl = "curl -s --cacert " + dir + "/cert.pem --resolve localhost:" + std::to_string(g.port()) +
                           ":127.0.0.1 https://localhost:" + std::to_string(g.port());
  test::CommandOutput whole;
  for (int i = 0; i < 100; ++i) {  // until the gateway has heard the scheduler is ready
    whole = test::run_command(curl + "/v1/completions -d '{\"prompt\":\"a\",\"max_tokens\":3}'");
    if (whole.out.find("\"completion_tokens\":3") != std::string::npos) break;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_NE(whole.out.find("\"completion_tokens\":3"), std::string::npos) << whole.out << whole.err;
  const auto streamed =
      test::run_command(curl + "/v1/completions -N -d '{\"prompt\":\"a\",\"max_tokens\":3,\"stream\":true}'");
  EXPECT_NE(streamed.out.find("data: [DONE]"), std::string::npos) << streamed.out << streamed.err;
  EXPECT_EQ(http(g.port(), "GET", "/v1/models").status, 0);  // plain HTTP: no HTTP answer
  EXPECT_EQ(test::run_command(curl + "/health -o /dev/null -w '%{http_code}'").out, "200");
}

TEST(Gateway, TokenizeAndDetokenizeRoundTrip) {
  test::Deployment d(kDeploy);
  ASSERT_TRUE(d.ok());
  GatewayProcess g(d.endpoint(), test::model_file("tiny", 1));
  const std::string ids = tokenize(g.port(), "hello world");
  ASSERT_FALSE(ids.empty());
  const Reply back = http(g.port(), "POST", "/detokenize", "{\"tokens\":[" + ids + "]}");
  EXPECT_EQ(back.status, 200);
  EXPECT_EQ(back.body, "{\"prompt\":\"hello world\"}");
  EXPECT_EQ(http(g.port(), "POST", "/detokenize", "{\"tokens\":[99999999]}").status, 400);
}

}  // namespace
}  // namespace tandem
