#include "gateway/server.h"

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "gateway/http_metrics.h"
#include "gateway/response.h"
#include "gateway/served_model.h"
#include "runtime/json.h"
#include "runtime/mutex.h"

namespace tandem::gateway {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxIgnoredNamesLogged = 256;  // distinct unknown field names remembered

// Woken on the gateway's thread when events of its call have arrived.
class Waker {
 public:
  virtual ~Waker() = default;
  virtual void on_events() = 0;
};

// One call's events, handed from the client library's I/O thread to the gateway's: pushed
// there, taken here in batches; one wake-up is posted per batch, not per event.
class Feed {
 public:
  Feed(asio::any_io_executor ex, std::weak_ptr<Waker> waker) : ex_(std::move(ex)), waker_(std::move(waker)) {}

  void push(uint32_t choice, const Event& event) {
    {
      runtime::MutexLock lock(mu_);
      events_.emplace_back(choice, event);
      if (posted_) return;
      posted_ = true;
    }
    asio::post(ex_, [w = waker_] {
      if (auto s = w.lock()) s->on_events();
    });
  }
  // Swaps the arrived events into `out` (which the caller has emptied; its capacity is reused).
  void take(std::vector<std::pair<uint32_t, Event>>& out) {
    runtime::MutexLock lock(mu_);
    out.swap(events_);
    posted_ = false;
  }

 private:
  const asio::any_io_executor ex_;
  const std::weak_ptr<Waker> waker_;
  runtime::Mutex mu_;
  std::vector<std::pair<uint32_t, Event>> events_ TANDEM_GUARDED_BY(mu_);
  bool posted_ TANDEM_GUARDED_BY(mu_) = false;
};

// What every connection shares. Members are touched on the gateway's thread only, except
// the atomics (the readiness poller writes them) and the client (thread-safe).
struct Gateway {
  explicit Gateway(GatewayOptions o, ServedModel m) : options(std::move(o)), model(std::move(m)) {}

  HttpCounters counters;  // before io: sessions that io's destruction ends still count out
  asio::io_context io{1};
  GatewayOptions options;
  ServedModel model;
  ApiKeys keys;
  std::optional<ssl::context> tls;
  std::unique_ptr<Client> client;
  asio::thread_pool blocking{2};  // calls that wait for the scheduler's reply (tokenize, counts)
  std::atomic<bool> reachable{false}, ready{false}, draining{false};
  std::set<std::string> ignored_logged;
  std::mt19937_64 rng{std::random_device{}()};
  // Scrapes of GET /metrics waiting for the scheduler's answer: one query is in flight however
  // many scrapers ask (the endpoint needs no key), and every waiter gets its answer.
  std::vector<std::function<void(const Result<std::string>&)>> metrics_waiters;
  // Where error responses' unread request bytes are read to and dropped, by any connection.
  std::array<char, 4096> discard;

  // "req-" and 16 hex digits: the id of the request in the access log, the X-Request-Id
  // header, the response's id and the Submit's request id (so scheduler and worker logs join).
  std::string new_request_id() {
    char buf[24];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
    return std::string("req-") + buf;
  }
  void note_ignored(const std::vector<std::string>& names) {
    for (const std::string& n : names) {
      if (ignored_logged.size() >= kMaxIgnoredNamesLogged || !ignored_logged.insert(n).second) continue;
      spdlog::info("gateway: ignoring request field '{}' (logged once)", n.substr(0, 64));
    }
  }
};

// The state of one completion request (its choices) on a connection.
struct Call {
  // The session, held while the call runs: events reach it through a weak pointer, and no
  // I/O need be pending on the connection meanwhile. Released when the call ends.
  std::shared_ptr<void> session;
  ApiRequest request;
  std::shared_ptr<Feed> feed;
  std::optional<ResponseFormat> format;
  std::vector<std::string> ids;
  std::vector<ChoiceResult> choices;
  std::vector<bool> role_sent;
  // Chat output split into reasoning, content and tool calls (model/chat_output.h): one parser
  // per choice when the model's format has markers; empty: the text is content, as is.
  std::vector<model::ChatOutputParser> parsers;
  model::ChatDelta delta;  // reused for every token
  std::vector<std::pair<uint32_t, Event>> batch;
  Usage usage;
  size_t done = 0;
  bool submitted = false;
  bool ended = false;         // every choice has its final event, or an error response is on its way
  std::string head;           // the SSE response's header, until written
  bool headers = false;       // the SSE response has begun (head made)
  bool last_written = false;  // the chunked body's terminator was written
  std::string pending, writing;
  bool write_in_flight = false;
};

template <class Stream>
class Session : public Waker, public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, tcp::socket>;

  Session(Gateway& g, tcp::socket socket) : g_(g), stream_(make_stream(g, std::move(socket))), timer_(g.io) {
    beast::error_code ec;
    peer_ = beast::get_lowest_layer(stream_).remote_endpoint(ec).address().to_string(ec);
    ++g_.counters.open_connections;
  }
  ~Session() override { --g_.counters.open_connections; }

  void start() {
    if constexpr (kTls) {
      arm_timer();
      stream_.async_handshake(ssl::stream_base::server, [self = this->shared_from_this()](beast::error_code ec) {
        if (ec) return self->close();
        self->timer_.cancel();
        self->do_read();
      });
    } else {
      do_read();
    }
  }

  void on_events() override;

 private:
  static Stream make_stream(Gateway& g, tcp::socket socket) {
    if constexpr (kTls)
      return Stream(std::move(socket), *g.tls);
    else
      return socket;
  }
  auto& socket() { return beast::get_lowest_layer(stream_); }

  // Reading a request.
  void do_read();
  void start_parse();
  void on_header(beast::error_code ec);
  void read_body();
  void on_read_error(beast::error_code ec);
  void arm_timer();
  void handle();
  void route(const http::request<http::string_body>& req);

  // Writing a whole response; `close` ends the connection after it.
  void respond(http::status status, std::string body, bool close = false,
               const char* content_type = "application/json");
  void respond_error(const ApiError& e, bool close = false) {
    respond(static_cast<http::status>(e.status), error_body(e), close);
  }
  void on_written(beast::error_code ec, bool close);
  void access_log(unsigned status);
  void close();
  void close_after_send();
  void drain();

  // Completions.
  void completion(ApiKind kind, const std::string& body);
  void budget_then_submit();
  void submit();
  void watch();
  void on_watch(beast::error_code ec, size_t n);
  void client_gone(const char* why);
  void cancel_running();
  void start_parsers();
  void process(uint32_t i, Event& ev);
  void process_parsed(uint32_t i, Event& ev);
  void finish_parsed(uint32_t i, const FinalEvent& fin);
  void process_final(uint32_t i, Event& ev);
  void begin_stream();
  void open_choice(uint32_t i);
  void flush();
  void end_call();

  // Other endpoints.
  void tokenize(const std::string& body);
  void detokenize(const std::string& body);
  void models();
  void metrics();

  Gateway& g_;
  Stream stream_;
  asio::steady_timer timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> res_;
  std::string peer_;
  bool timed_out_ = false, closed_ = false;
  bool watching_ = false, read_after_watch_ = false, gone_ = false;
  // The request being served.
  std::string id_, method_, target_, principal_;
  Clock::time_point t0_;
  bool keep_alive_ = true;
  std::unique_ptr<Call> call_;
};

template <class Stream>
void Session<Stream>::arm_timer() {
  timed_out_ = false;
  timer_.expires_after(g_.options.read_timeout);
  timer_.async_wait([w = this->weak_from_this()](beast::error_code ec) {
    auto self = w.lock();
    if (ec || !self) return;
    self->timed_out_ = true;
    beast::error_code ignored;
    self->socket().cancel(ignored);
  });
}

template <class Stream>
void Session<Stream>::do_read() {
  arm_timer();
  if (watching_) {
    read_after_watch_ = true;  // the watch read already waits for the next request's bytes
    return;
  }
  start_parse();
}

template <class Stream>
void Session<Stream>::start_parse() {
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(g_.options.max_header_bytes));
  parser_->body_limit(g_.options.max_body_bytes);
  http::async_read_header(stream_, buffer_, *parser_,
                          [self = this->shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

template <class Stream>
void Session<Stream>::on_header(beast::error_code ec) {
  if (ec) return on_read_error(ec);
  const auto& req = parser_->get();
  if (beast::iequals(req[http::field::expect], "100-continue")) {
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    asio::async_write(stream_, asio::buffer(kContinue.data(), kContinue.size()),
                      [self = this->shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return self->close();
                        self->read_body();
                      });
    return;
  }
  read_body();
}

template <class Stream>
void Session<Stream>::read_body() {
  http::async_read(stream_, buffer_, *parser_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
    if (ec) return self->on_read_error(ec);
    self->timer_.cancel();
    self->handle();
  });
}

template <class Stream>
void Session<Stream>::on_read_error(beast::error_code ec) {
  timer_.cancel();
  t0_ = Clock::now();
  id_ = g_.new_request_id();
  method_ = "-";
  target_ = "-";
  if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset) return close();
  if (timed_out_) {
    if (!parser_->got_some() && buffer_.size() == 0) return close();  // an idle keep-alive connection
    return respond_error(
        ApiError{408, "the request was not received within " + std::to_string(g_.options.read_timeout.count()) + " ms",
                 "invalid_request_error", "", "request_timeout"},
        true);
  }
  if (ec == http::error::body_limit)
    return respond_error(ApiError{413, "the body exceeds " + std::to_string(g_.options.max_body_bytes) + " bytes",
                                  "invalid_request_error", "", "request_too_large"},
                         true);
  if (ec == http::error::header_limit)
    return respond_error(ApiError{431, "the header exceeds " + std::to_string(g_.options.max_header_bytes) + " bytes",
                                  "invalid_request_error", "", "header_too_large"},
                         true);
  if (ec.category() == http::make_error_code(http::error::bad_target).category())
    return respond_error(ApiError{400, "malformed HTTP request: " + ec.message()}, true);
  close();
}

template <class Stream>
void Session<Stream>::handle() {
  const auto& req = parser_->get();
  t0_ = Clock::now();
  id_ = g_.new_request_id();
  method_ = std::string(req.method_string());
  target_ = std::string(req.target().substr(0, 256));
  keep_alive_ = req.keep_alive();
  principal_.clear();
  // Probes and Prometheus' scrapes need no key (as vLLM: its --api-key guards /v1 alone).
  const std::string_view path = std::string_view(target_).substr(0, target_.find('?'));
  const bool probe = path == "/health" || path == "/ready" || path == "/metrics";
  if (!g_.keys.empty() && !probe) {
    const std::string* name =
        g_.keys.find(std::string_view(req[http::field::authorization].data(), req[http::field::authorization].size()));
    if (!name) {
      res_.set(http::field::www_authenticate, "Bearer");
      return respond_error(ApiError{401, "a valid API key is required (Authorization: Bearer KEY)",
                                    "invalid_request_error", "", "invalid_api_key"});
    }
    principal_ = *name;
  }
  route(req);
}

template <class Stream>
void Session<Stream>::route(const http::request<http::string_body>& req) {
  const std::string path = target_.substr(0, target_.find('?'));
  const bool get = req.method() == http::verb::get, post = req.method() == http::verb::post;
  auto wrong_method = [&](const char* allowed) {
    res_.set(http::field::allow, allowed);
    respond_error(ApiError{405, path + " takes " + allowed, "invalid_request_error", "", "method_not_allowed"});
  };
  if (path == "/health") {
    if (!get) return wrong_method("GET");
    return g_.reachable ? respond(http::status::ok, "{}")
                        : respond_error(ApiError{503, "the scheduler does not answer", "service_unavailable"});
  }
  if (path == "/ready") {
    if (!get) return wrong_method("GET");
    if (g_.ready && !g_.draining) return respond(http::status::ok, "{\"ready\":true}");
    return respond_error(
        ApiError{503, g_.draining ? "the service is draining" : "the service is not ready", "service_unavailable"});
  }
  if (path == "/v1/models") return get ? models() : wrong_method("GET");
  if (path == "/metrics") return get ? metrics() : wrong_method("GET");
  if (path == "/v1/completions") return post ? completion(ApiKind::kCompletion, req.body()) : wrong_method("POST");
  if (path == "/v1/chat/completions") return post ? completion(ApiKind::kChat, req.body()) : wrong_method("POST");
  if (path == "/tokenize") return post ? tokenize(req.body()) : wrong_method("POST");
  if (path == "/detokenize") return post ? detokenize(req.body()) : wrong_method("POST");
  respond_error(ApiError{404, "no such endpoint: " + path, "invalid_request_error", "", "not_found"});
}

template <class Stream>
void Session<Stream>::respond(http::status status, std::string body, bool close, const char* content_type) {
  res_.version(11);
  res_.result(status);
  res_.set(http::field::content_type, content_type);
  res_.set(http::field::server, "tandem-gateway");
  res_.set("X-Request-Id", id_);
  res_.keep_alive(keep_alive_ && !close);
  res_.body() = std::move(body);
  res_.prepare_payload();
  http::async_write(stream_, res_, [self = this->shared_from_this(), close](beast::error_code ec, size_t) {
    self->on_written(ec, close);
  });
}

template <class Stream>
void Session<Stream>::on_written(beast::error_code ec, bool close) {
  access_log(res_.result_int());
  const bool keep = !ec && !close && keep_alive_;
  res_ = {};
  call_.reset();
  if (ec) return this->close();
  if (!keep) return close_after_send();
  do_read();
}

template <class Stream>
void Session<Stream>::access_log(unsigned status) {
  g_.counters.count_response(status);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0_).count();
  uint64_t prompt = 0, completion = 0;
  if (call_) prompt = call_->usage.prompt_tokens, completion = call_->usage.completion_tokens;
  spdlog::info("gateway: {} {} \"{} {}\" {} {:.1f} ms prompt={} completion={} principal={}", id_, peer_, method_,
               target_, status, ms, prompt, completion, principal_.empty() ? "-" : principal_);
}

template <class Stream>
void Session<Stream>::close() {
  if (closed_) return;
  closed_ = true;
  timer_.cancel();
  beast::error_code ec;
  socket().shutdown(tcp::socket::shutdown_both, ec);
  socket().close(ec);
}

// After an error response to a request whose body was not read: stop sending, then read
// and drop what the client still sends for up to a second, so that the kernel does not reset
// the connection (and lose the response) over unread bytes.
template <class Stream>
void Session<Stream>::close_after_send() {
  if constexpr (kTls) {
    close();
  } else {
    beast::error_code ec;
    socket().shutdown(tcp::socket::shutdown_send, ec);
    timer_.expires_after(std::chrono::seconds(1));
    timer_.async_wait([self = this->shared_from_this()](beast::error_code) { self->close(); });
    drain();
  }
}

template <class Stream>
void Session<Stream>::drain() {
  socket().async_read_some(asio::buffer(g_.discard), [self = this->shared_from_this()](beast::error_code ec, size_t) {
    if (ec) return self->close();
    self->drain();
  });
}

template <class Stream>
void Session<Stream>::completion(ApiKind kind, const std::string& body) {
  Parsed parsed = parse_request(body, kind, g_.model.limits);
  g_.note_ignored(parsed.ignored_fields);
  if (!parsed.ok) return respond_error(parsed.error);
  if (!g_.ready || g_.draining)
    return respond_error(ApiError{503,
                                  g_.draining ? "the service is draining"
                                              : "the service is not ready (the scheduler has no workers yet, or "
                                                "does not answer)",
                                  "service_unavailable"});
  // The scheduler counts its per-client limits per principal: the API key's name, else `user`.
  if (principal_.empty()) principal_ = principal_of_user(parsed.request.user);
  call_ = std::make_unique<Call>();
  Call& c = *call_;
  c.session = this->shared_from_this();
  c.request = std::move(parsed.request);
  const size_t n = c.request.requests.size();
  for (size_t i = 0; i < n; ++i) c.ids.push_back(n == 1 ? id_ : id_ + "-" + std::to_string(i));
  c.choices.resize(n);
  c.role_sent.assign(n, false);
  if (kind == ApiKind::kChat) start_parsers();
  c.batch.reserve(64);
  c.feed = std::make_shared<Feed>(g_.io.get_executor(), this->weak_from_this());
  const std::string prefix = kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-";
  c.format.emplace(
      kind, prefix + id_, static_cast<int64_t>(std::time(nullptr)), g_.model.limits.name, c.request.logprobs,
      [tok = &g_.model.tokenizer](int32_t id, std::string& out) { tok->append_token_text(id, /*special=*/true, out); });
  watch();
  if (!c.request.max_tokens_given)
    budget_then_submit();
  else
    submit();
}

// Without max_tokens a request may run to the end of the context: its prompt is counted first
// (ids given as ids are counted here; text and conversations by the scheduler, as it would
// make them), off this thread, and max_tokens set to what is left.
template <class Stream>
void Session<Stream>::budget_then_submit() {
  std::vector<std::optional<TokenizeRequest>> asks;
  for (const GenerateRequest& r : call_->request.requests) {
    if (!r.prompt_tokens.empty()) {
      asks.emplace_back();
      continue;
    }
    asks.push_back(TokenizeRequest{r.prompt_text, r.messages, r.tools_json, r.add_generation_prompt, r.no_bos});
  }
  asio::post(g_.blocking, [self = this->shared_from_this(), asks = std::move(asks)] {
    std::vector<Result<size_t>> counts;
    for (const auto& ask : asks) counts.push_back(ask ? self->g_.client->count_tokens(*ask) : Result<size_t>(0));
    asio::post(self->g_.io, [self, counts = std::move(counts)]() mutable {
      if (self->gone_ || !self->call_) return;
      auto& requests = self->call_->request.requests;
      const uint32_t context = self->g_.model.limits.context_length;
      for (size_t i = 0; i < requests.size(); ++i) {
        if (!counts[i]) {
          FinalEvent fin;
          fin.code = counts[i].status().code();
          fin.error_code = code_name(fin.code);
          fin.error_message = counts[i].status().message();
          return self->respond_error(error_from_final(fin));
        }
        const size_t prompt = requests[i].prompt_tokens.empty() ? *counts[i] : requests[i].prompt_tokens.size();
        if (prompt >= context)
          return self->respond_error(ApiError{400,
                                              "the prompt's " + std::to_string(prompt) +
                                                  " tokens leave no room in the context of " + std::to_string(context),
                                              "invalid_request_error", "prompt", "context_length_exceeded"});
        requests[i].max_tokens = static_cast<uint32_t>(context - prompt);
      }
      self->submit();
    });
  });
}

template <class Stream>
void Session<Stream>::submit() {
  Call& c = *call_;
  c.submitted = true;
  for (size_t i = 0; i < c.request.requests.size(); ++i) {
    GenerateRequest r = std::move(c.request.requests[i]);
    r.id = c.ids[i];
    r.principal = principal_;
    r.stream = c.request.stream;
    g_.client->generate(std::move(r),
                        [feed = c.feed, i = static_cast<uint32_t>(i)](const Event& e) { feed->push(i, e); });
  }
}

// While a call runs, a read waits on the connection: the client closing it (EOF, reset) is
// seen at once and cancels the call, mid-stream or still queued. Bytes that arrive (a
// pipelined next request) are kept for the next parse, and end the watch: with a request
// waiting in the buffer a disconnect is seen at the next write instead.
template <class Stream>
void Session<Stream>::watch() {
  if (watching_ || gone_ || closed_ || buffer_.size() > 0) return;
  watching_ = true;
  stream_.async_read_some(buffer_.prepare(4096),
                          [self = this->shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
}

template <class Stream>
void Session<Stream>::on_watch(beast::error_code ec, size_t n) {
  watching_ = false;
  if (ec) {
    if (call_ && !call_->ended) return client_gone(timed_out_ ? "idle past the read timeout" : "the client closed");
    return close();
  }
  buffer_.commit(n);
  if (call_) return;  // a pipelined request: kept for after this call (whose disconnect a write now tells)
  if (read_after_watch_) {
    read_after_watch_ = false;
    start_parse();
  }
}

template <class Stream>
void Session<Stream>::cancel_running() {
  if (!call_ || !call_->submitted) return;
  for (size_t i = 0; i < call_->choices.size(); ++i)
    if (!call_->choices[i].done) (void)g_.client->cancel(call_->ids[i]);
}

template <class Stream>
void Session<Stream>::client_gone(const char* why) {
  if (gone_) return;
  gone_ = true;
  cancel_running();
  spdlog::info("gateway: {} cancelled: {}", id_, why);
  access_log(499);  // nginx's "client closed request"
  call_.reset();    // the caller's handler still holds the session
  close();
}

template <class Stream>
void Session<Stream>::on_events() {
  if (!call_) return;
  Call& c = *call_;
  c.batch.clear();
  c.feed->take(c.batch);
  if (gone_ || closed_) return;
  for (auto& [i, ev] : c.batch) {
    if (c.ended) break;
    process(i, ev);
  }
  if (call_ && call_->request.stream) flush();
}

template <class Stream>
void Session<Stream>::begin_stream() {
  Call& c = *call_;
  if (c.headers) return;
  c.headers = true;
  c.head =
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nServer: tandem-gateway\r\n"
      "X-Request-Id: " +
      id_ + "\r\nTransfer-Encoding: chunked\r\nConnection: " + (keep_alive_ ? "keep-alive" : "close") + "\r\n\r\n";
}

// A parser per choice when the model's template has think or tool-call markers; calls are
// parsed only when the request offers tools (and tool_choice is not "none": api.cpp then drops
// them), as vLLM's --enable-auto-tool-choice.
template <class Stream>
void Session<Stream>::start_parsers() {
  Call& c = *call_;
  model::ChatOutputFormat format = g_.model.chat_output;
  if (c.request.requests.front().tools_json.empty()) format.tools = model::ToolCallFormat::kNone;
  if (format.tools == model::ToolCallFormat::kNone && !format.reasoning) return;
  c.parsers.reserve(c.ids.size());
  for (size_t i = 0; i < c.ids.size(); ++i) {
    c.parsers.emplace_back(format, c.ids[i]);
    c.choices[i].parsed = true;
  }
}

// A token through the choice's parser: a streamed chunk when it released something (or has
// logprobs to carry); not streaming, the message grows.
template <class Stream>
void Session<Stream>::process_parsed(uint32_t i, Event& ev) {
  Call& c = *call_;
  c.delta.clear();
  c.parsers[i].feed_token(ev.token.id, ev.token.text, c.delta);
  if (!c.request.stream) {
    c.choices[i].message.merge(c.delta);
    if (c.request.logprobs >= 0) c.choices[i].tokens.push_back(std::move(ev.token));
    return;
  }
  open_choice(i);
  if (!c.delta.empty() || c.request.logprobs >= 0) c.format->delta_chunk(c.pending, i, c.delta, &ev.token);
}

// The end of a parsed choice: the scheduler's held-back text, then what the parser still held,
// and the finish_reason it says ("tool_calls" after a call).
template <class Stream>
void Session<Stream>::finish_parsed(uint32_t i, const FinalEvent& fin) {
  Call& c = *call_;
  c.delta.clear();
  c.parsers[i].feed(fin.text, c.delta);
  model::GenerationEnd end = model::GenerationEnd::kError;
  switch (fin.reason) {
    case FinishReason::kStop: end = model::GenerationEnd::kStop; break;
    case FinishReason::kLength: end = model::GenerationEnd::kLength; break;
    case FinishReason::kCancelled: end = model::GenerationEnd::kCancelled; break;
    case FinishReason::kError: break;
  }
  const std::string_view reason = c.parsers[i].finish(end, c.delta);
  if (!c.request.stream) {
    c.choices[i].message.merge(c.delta);
    c.choices[i].message.finish_reason = reason;
    return;
  }
  if (!c.delta.empty()) c.format->delta_chunk(c.pending, i, c.delta, nullptr);
  c.format->finish_chunk(c.pending, i, openai_finish_reason(reason));
}

// The stream's head and, in chat, the choice's first delta (its role), each once.
template <class Stream>
void Session<Stream>::open_choice(uint32_t i) {
  Call& c = *call_;
  begin_stream();
  if (c.request.kind == ApiKind::kChat && !c.role_sent[i]) {
    c.format->role_chunk(c.pending, i);
    c.role_sent[i] = true;
  }
}

template <class Stream>
void Session<Stream>::process(uint32_t i, Event& ev) {
  Call& c = *call_;
  if (ev.final) return process_final(i, ev);
  if (!c.parsers.empty()) return process_parsed(i, ev);
  if (!c.request.stream) {
    c.choices[i].text += ev.token.text;
    if (c.request.logprobs >= 0) c.choices[i].tokens.push_back(std::move(ev.token));
    return;
  }
  open_choice(i);
  c.format->token_chunk(c.pending, i, ev.token);
}

template <class Stream>
void Session<Stream>::process_final(uint32_t i, Event& ev) {
  Call& c = *call_;
  ChoiceResult& choice = c.choices[i];
  choice.done = true;
  choice.fin = std::move(ev.fin);
  ++c.done;
  c.usage.completion_tokens += choice.fin.completion_tokens;
  if (i % c.request.n == 0) {
    c.usage.prompt_tokens += choice.fin.prompt_tokens;
    c.usage.cached_tokens += choice.fin.cached_prompt_tokens;
  }
  const bool error = choice.fin.reason == FinishReason::kError;
  if (error && !c.headers) {
    // Nothing sent yet: the HTTP status says what went wrong (429 queue full, 400, 503...).
    c.ended = true;
    cancel_running();
    return respond_error(error_from_final(choice.fin));
  }
  if (error) {
    ResponseFormat::error_event(c.pending, error_from_final(choice.fin));
  } else if (!c.parsers.empty()) {
    if (c.request.stream) open_choice(i);
    finish_parsed(i, choice.fin);
  } else if (c.request.stream) {
    open_choice(i);
    if (!choice.fin.text.empty()) c.format->text_chunk(c.pending, i, choice.fin.text);
    c.format->finish_chunk(c.pending, i, choice.fin.reason);
  } else {
    choice.text += choice.fin.text;
  }
  if (c.done < c.choices.size()) return;
  c.ended = true;
  if (!c.request.stream) return respond(http::status::ok, c.format->full(c.choices, c.usage));
  if (c.request.include_usage) c.format->usage_chunk(c.pending, c.usage);
  ResponseFormat::done(c.pending);
}

// Writes what the stream has gathered as one HTTP chunk (the header first, the terminator
// last); events that arrive meanwhile gather for the next write.
template <class Stream>
void Session<Stream>::flush() {
  Call& c = *call_;
  if (c.write_in_flight || gone_ || !c.headers) return;
  const bool last = c.ended && !c.last_written;
  if (c.pending.empty() && !last) return;
  c.writing.swap(c.pending);
  c.pending.clear();
  static constexpr std::string_view kCrlf = "\r\n", kTerminator = "0\r\n\r\n";
  char size_line[24];  // the chunk's size in hex, then CRLF
  size_t len = 0;
  if (!c.writing.empty()) {
    for (size_t n = c.writing.size(); n != 0; n >>= 4) size_line[len++] = "0123456789abcdef"[n & 15];
    std::reverse(size_line, size_line + len);
    size_line[len++] = '\r';
    size_line[len++] = '\n';
  }
  std::array<asio::const_buffer, 5> bufs = {
      asio::buffer(c.head),
      asio::buffer(size_line, len),
      asio::buffer(c.writing),
      asio::buffer(kCrlf.data(), c.writing.empty() ? 0 : kCrlf.size()),
      asio::buffer(kTerminator.data(), last ? kTerminator.size() : 0),
  };
  c.write_in_flight = true;
  c.last_written = last;
  asio::async_write(stream_, bufs, [self = this->shared_from_this()](beast::error_code ec, size_t) {
    if (!self->call_ || self->gone_) return;
    Call& c = *self->call_;
    c.write_in_flight = false;
    c.head.clear();
    c.writing.clear();
    if (ec) return self->client_gone("a write failed");
    if (c.last_written) return self->end_call();
    self->flush();
  });
}

template <class Stream>
void Session<Stream>::end_call() {
  access_log(200);
  call_.reset();
  if (!keep_alive_) return close_after_send();
  do_read();
}

template <class Stream>
void Session<Stream>::models() {
  const ModelLimits& m = g_.model.limits;
  std::string body = "{\"object\":\"list\",\"data\":[{\"id\":";
  runtime::append_json_string(body, m.name);
  body += ",\"object\":\"model\",\"created\":" + std::to_string(std::time(nullptr)) +
          ",\"owned_by\":\"tandem\",\"max_model_len\":" + std::to_string(m.context_length) + "}]}";
  respond(http::status::ok, std::move(body));
}

// The scheduler's metrics (asked off this thread, one query for every scrape waiting), then
// the gateway's own. The scheduler not answering is a 503: the scrape fails, `up` says so.
template <class Stream>
void Session<Stream>::metrics() {
  const bool asking = !g_.metrics_waiters.empty();
  g_.metrics_waiters.push_back([self = this->shared_from_this()](const Result<std::string>& text) {
    if (!text)
      return self->respond_error(
          ApiError{503, "the scheduler's metrics did not come: " + text.status().message(), "service_unavailable"});
    std::string body = text.value();
    append_http_metrics(self->g_.counters, body);
    self->respond(http::status::ok, std::move(body), false, kPrometheusContentType);
  });
  if (asking) return;
  asio::post(g_.blocking, [&g = g_] {
    auto text = g.client->metrics_text();
    asio::post(g.io, [&g, text = std::move(text)] {
      auto waiters = std::move(g.metrics_waiters);
      g.metrics_waiters.clear();
      for (auto& answer : waiters) answer(text);
    });
  });
}

template <class Stream>
void Session<Stream>::tokenize(const std::string& body) {
  TokenizeBody parsed = parse_tokenize(body, g_.model.limits);
  if (!parsed.ok) return respond_error(parsed.error);
  asio::post(g_.blocking, [self = this->shared_from_this(), req = std::move(parsed.request)] {
    auto ids = self->g_.client->tokenize(req);
    asio::post(self->g_.io, [self, ids = std::move(ids)]() mutable {
      if (!ids) {
        FinalEvent fin;
        fin.code = ids.status().code();
        fin.error_code = code_name(fin.code);
        fin.error_message = ids.status().message();
        return self->respond_error(error_from_final(fin));
      }
      std::string out = "{\"count\":" + std::to_string(ids->size()) +
                        ",\"max_model_len\":" + std::to_string(self->g_.model.limits.context_length) + ",\"tokens\":[";
      for (size_t i = 0; i < ids->size(); ++i) out += (i ? "," : "") + std::to_string((*ids)[i]);
      self->respond(http::status::ok, out + "]}");
    });
  });
}

template <class Stream>
void Session<Stream>::detokenize(const std::string& body) {
  DetokenizeBody parsed = parse_detokenize(body, g_.model.limits);
  if (!parsed.ok) return respond_error(parsed.error);
  for (int32_t id : parsed.tokens)
    if (static_cast<uint32_t>(id) >= g_.model.tokenizer.vocab_size())
      return respond_error(ApiError{400,
                                    "tokens: " + std::to_string(id) + " is not in the vocabulary of " +
                                        std::to_string(g_.model.tokenizer.vocab_size()),
                                    "invalid_request_error", "tokens"});
  std::string out = "{\"prompt\":";
  runtime::append_json_string(out, g_.model.tokenizer.decode(parsed.tokens));
  respond(http::status::ok, out + "}");
}

// Accepts connections until the gateway stops. A failed accept (out of descriptors: EMFILE,
// ENFILE) leaves the connection in the kernel's backlog and is retried after kAcceptPause,
// not at once (the listening socket stays readable: an immediate retry would spin); the open
// connections are served meanwhile. Logged once per run of failures, not per retry.
class Listener : public std::enable_shared_from_this<Listener> {
 public:
  static constexpr std::chrono::milliseconds kAcceptPause{100};

  Listener(Gateway& g, tcp::acceptor acceptor) : g_(g), acceptor_(std::move(acceptor)), pause_(g.io) {}
  void accept() {
    acceptor_.async_accept([self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !self->acceptor_.is_open()) return;
      if (ec) return self->failed(ec);
      if (self->failures_ > 0) {
        spdlog::info("gateway: accepting again after {} failed attempts", self->failures_);
        self->failures_ = 0;
      }
      ++self->g_.counters.accepted;
      socket.set_option(tcp::no_delay(true), ec);
      if (self->g_.tls)
        std::make_shared<Session<ssl::stream<tcp::socket>>>(self->g_, std::move(socket))->start();
      else
        std::make_shared<Session<tcp::socket>>(self->g_, std::move(socket))->start();
      self->accept();
    });
  }
  void stop() {
    beast::error_code ec;
    acceptor_.close(ec);
  }

 private:
  void failed(beast::error_code ec) {
    ++g_.counters.accept_failures;
    if (failures_++ == 0)
      spdlog::warn("gateway: accept failed: {}; serving the open connections and retrying every {} ms", ec.message(),
                   kAcceptPause.count());
    pause_.expires_after(kAcceptPause);
    pause_.async_wait([self = shared_from_this()](beast::error_code) { self->accept(); });
  }

  Gateway& g_;
  tcp::acceptor acceptor_;
  asio::steady_timer pause_;
  uint64_t failures_ = 0;  // in the current run of failed accepts
};

// Asks the scheduler for its state every `period` until stopped; the gateway answers
// /health, /ready and refuses work (503) from what it last heard.
class ReadinessPoller {
 public:
  static constexpr std::chrono::seconds kSilentFor{3};

  explicit ReadinessPoller(Gateway& g) : g_(g), thread_([this] { run(); }) {}
  ~ReadinessPoller() {
    {
      runtime::MutexLock lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void run() {
    Clock::time_point last_answer{};  // of the scheduler, to the last poll it answered
    for (;;) {
      auto status = g_.client->status(std::chrono::milliseconds(1000));
      // An answer is taken as it is. A poll not answered (a scheduler busy for a moment, its
      // reply queued behind a full step's events) changes nothing until the scheduler has
      // been silent for kSilentFor: one slow reply must not turn a stream of requests into 503s.
      const bool silent = !status && Clock::now() - last_answer >= kSilentFor;
      if (status) last_answer = Clock::now();
      if (status || silent) {
        const bool ready = status && status->ready;
        if (ready != g_.ready.load()) spdlog::info("gateway: the scheduler is {}", ready ? "ready" : "not ready");
        g_.reachable = status.is_ok();
        g_.ready = ready;
        g_.draining = status && status->draining;
      }
      runtime::MutexLock lock(mu_);
      const auto until = Clock::now() + g_.options.ready_poll;
      while (!stop_ && cv_.wait_until(mu_, until)) {
      }
      if (stop_) return;
    }
  }

  Gateway& g_;
  runtime::Mutex mu_;
  runtime::CondVar cv_;
  bool stop_ TANDEM_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

Result<tcp::endpoint> parse_listen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return Status::invalid("--listen: '" + listen + "' must be HOST:PORT");
  std::string host = listen.substr(0, colon);
  const std::string port = listen.substr(colon + 1);
  if (host.empty()) host = "127.0.0.1";
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end || p < 0 || p > 65535)
    return Status::invalid("--listen: port must be 0..65535, got '" + port + "'");
  beast::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (ec) return Status::invalid("--listen: '" + host + "' is not an IP address");
  return tcp::endpoint(address, static_cast<uint16_t>(p));
}

// Up to the hard limit: every connection is a descriptor. Logged once: the limit bounds the
// connections open at once (past it accepts fail and are retried, see Listener).
void raise_nofile_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return;
  const rlim_t soft = r.rlim_cur;
  if (r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &r) != 0) r.rlim_cur = soft;
  }
  auto shown = [](rlim_t v) { return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v); };
  spdlog::info("gateway: open-file limit (RLIMIT_NOFILE) {} (soft was {}, hard {}): the connections it can hold",
               shown(r.rlim_cur), shown(soft), shown(r.rlim_max));
}

Status load_tls(Gateway& g) {
  const GatewayOptions& o = g.options;
  if (o.tls_cert.empty() != o.tls_key.empty()) return Status::invalid("--tls-cert and --tls-key go together");
  if (o.tls_cert.empty()) return Status::ok();
  g.tls.emplace(ssl::context::tls_server);
  g.tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                     ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
  beast::error_code ec;
  g.tls->use_certificate_chain_file(o.tls_cert, ec);
  if (ec) return Status::invalid("--tls-cert " + o.tls_cert + ": " + ec.message());
  g.tls->use_private_key_file(o.tls_key, ssl::context::pem, ec);
  if (ec) return Status::invalid("--tls-key " + o.tls_key + ": " + ec.message());
  return Status::ok();
}

}  // namespace

Status check_listen(const std::string& listen) { return parse_listen(listen).status(); }

Status run_gateway(const GatewayOptions& options, const std::function<void(const std::string&)>& on_listening) {
  auto model = load_served_model(options.model_path, options.model_name);
  if (!model) return model.status();
  auto listen = parse_listen(options.listen);
  if (!listen) return listen.status();
  Gateway g(options, std::move(model.value()));
  const model::ChatOutputFormat& chat = g.model.chat_output;
  spdlog::info("gateway: chat output: tool calls {} (when a request offers tools), reasoning {}",
               model::tool_call_format_name(chat.tools),
               !chat.reasoning            ? "off"
               : chat.starts_in_reasoning ? "on (opened by the prompt)"
                                          : "on");
  if (!options.api_key_file.empty()) {
    auto keys = ApiKeys::load(options.api_key_file);
    if (!keys) return keys.status();
    g.keys = std::move(keys.value());
  }
  TANDEM_RETURN_IF_ERROR(load_tls(g));
  auto client = Client::connect(options.client);
  if (!client) return client.status();
  g.client = std::move(client.value());
  raise_nofile_limit();

  tcp::acceptor acceptor(g.io);
  beast::error_code ec;
  acceptor.open(listen->protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(*listen, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::invalid("--listen " + options.listen + ": " + ec.message());
  const tcp::endpoint bound = acceptor.local_endpoint(ec);
  auto listener = std::make_shared<Listener>(g, std::move(acceptor));
  listener->accept();
  asio::signal_set signals(g.io, SIGINT, SIGTERM);
  signals.async_wait([&](beast::error_code, int sig) {
    spdlog::info("gateway: signal {}: stopping", sig);
    listener->stop();
    g.io.stop();
  });
  ReadinessPoller poller(g);
  const std::string host =
      bound.address().is_v6() ? "[" + bound.address().to_string() + "]" : bound.address().to_string();
  on_listening(std::string(g.tls ? "https://" : "http://") + host + ":" + std::to_string(bound.port()));
  g.io.run();
  g.blocking.stop();
  g.blocking.join();
  return Status::ok();
}

}  // namespace tandem::gateway
