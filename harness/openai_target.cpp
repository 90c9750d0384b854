// The OpenAI-compatible target: POST /v1/completions or /v1/chat/completions with stream:true over
// HTTP/1.1 (Boost.Beast on the target's own I/O thread, keep-alive connections pooled), each SSE
// chunk with text one token arrival, the final usage chunk the token counts.
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <optional>
#include <string_view>
#include <thread>

#include "runtime/json.h"
#include "runtime/json_value.h"
#include "tandem/bench.h"

namespace tandem::bench {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using runtime::append_json_string;
using runtime::JsonValue;

// "http://host[:port][/prefix]" split; the prefix without trailing slash or "/v1".
struct Url {
  std::string host, port, prefix;
};

Result<Url> parse_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.compare(0, scheme.size(), scheme) != 0)
    return Status::invalid("--openai-url must start with http:// (https is not supported): " + url);
  std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  Url out;
  out.prefix = slash == std::string::npos ? "" : rest.substr(slash);
  while (!out.prefix.empty() && out.prefix.back() == '/') out.prefix.pop_back();
  if (out.prefix.size() >= 3 && out.prefix.compare(out.prefix.size() - 3, 3, "/v1") == 0)
    out.prefix.resize(out.prefix.size() - 3);
  const size_t colon = hostport.rfind(':');
  out.host = hostport.substr(0, colon);
  out.port = colon == std::string::npos ? "80" : hostport.substr(colon + 1);
  if (out.host.empty() || out.port.empty() || out.port.find_first_not_of("0123456789") != std::string::npos)
    return Status::invalid("malformed --openai-url: " + url);
  return out;
}

class OpenAITarget final : public Target {
 public:
  OpenAITarget(OpenAIOptions options, Url url)
      : options_(std::move(options)), url_(std::move(url)), work_(asio::make_work_guard(io_)) {
    thread_ = std::thread([this] { io_.run(); });
  }
  ~OpenAITarget() override {
    // Requests still in flight are dropped without a finish(): the runner already gave up on them.
    work_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  void start(std::shared_ptr<RequestTracker> tracker) override;
  std::string describe() const override {
    return std::string(options_.chat ? "openai-chat" : "openai") + " http://" + url_.host + ":" + url_.port +
           url_.prefix + " " + options_.model;
  }

  // Pool of idle keep-alive connections (I/O thread only).
  void release(std::unique_ptr<beast::tcp_stream> stream) {
    if (idle_.size() < 1024) idle_.push_back(std::move(stream));
  }

  const OpenAIOptions options_;
  const Url url_;
  asio::io_context io_;
  std::optional<tcp::resolver::results_type> endpoints_;  // resolved once, I/O thread only

 private:
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::vector<std::unique_ptr<beast::tcp_stream>> idle_;
  std::thread thread_;
};

// The JSON body: greedy, streamed, with the usage chunk at the end.
std::string request_body(const OpenAIOptions& options, const BenchRequest& b) {
  std::string body = "{\"model\":";
  append_json_string(body, options.model);
  if (options.chat) {
    body += ",\"messages\":[{\"role\":\"user\",\"content\":";
    append_json_string(body, b.prompt_text);
    body += "}]";
  } else if (options.token_prompts && !b.prompt_tokens.empty()) {
    body += ",\"prompt\":[";
    for (size_t i = 0; i < b.prompt_tokens.size(); ++i) body += (i ? "," : "") + std::to_string(b.prompt_tokens[i]);
    body += ']';
  } else {
    body += ",\"prompt\":";
    append_json_string(body, b.prompt_text);
  }
  body += ",\"max_tokens\":" + std::to_string(b.max_tokens);
  body += ",\"stream\":true,\"stream_options\":{\"include_usage\":true}";
  if (b.temperature > 0)
    body += ",\"temperature\":" + std::to_string(b.temperature) + ",\"seed\":" + std::to_string(b.seed);
  else
    body += ",\"temperature\":0";
  if (b.ignore_eos) body += ",\"ignore_eos\":true";
  for (size_t i = 0; i < b.logit_bias.size(); ++i)
    body += (i ? ",\"" : ",\"logit_bias\":{\"") + std::to_string(b.logit_bias[i].first) +
            "\":" + std::to_string(b.logit_bias[i].second) + (i + 1 == b.logit_bias.size() ? "}" : "");
  body += '}';
  return body;
}

// A usage count in [0, 2^32) or nothing.
std::optional<uint32_t> count(const JsonValue& v) {
  if (!v.is_number() || !(v.as_double() >= 0) || v.as_double() > UINT32_MAX) return std::nullopt;
  return static_cast<uint32_t>(v.as_double());
}

// Whether a chunk's choice is a token arrival. Completions: a "text" field, even empty (a token
// that ends inside a UTF-8 sequence), but not an empty closing chunk with the finish reason
// (llama.cpp's server sends one after the last token; vLLM puts the reason on the last token's
// chunk). Chat: non-empty delta "content", "reasoning_content" or "reasoning" (not the role-only
// first chunk nor the closing one).
bool is_token(const JsonValue& choice, bool chat, bool has_reason) {
  auto nonempty = [](const JsonValue& v) { return v.is_string() && !v.as_string().empty(); };
  if (!chat) return choice["text"].is_string() && !(has_reason && choice["text"].as_string().empty());
  const JsonValue& delta = choice["delta"];
  return nonempty(delta["content"]) || nonempty(delta["reasoning_content"]) || nonempty(delta["reasoning"]);
}

// One request on one connection; lives on the target's I/O thread only.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(OpenAITarget& target, std::shared_ptr<RequestTracker> tracker, std::unique_ptr<beast::tcp_stream> stream,
              bool reused)
      : target_(target), tracker_(std::move(tracker)), stream_(std::move(stream)), reused_(reused) {
    req_.body() = request_body(target_.options_, tracker_->request());
    req_.method(http::verb::post);
    req_.target(target_.url_.prefix + (target_.options_.chat ? "/v1/chat/completions" : "/v1/completions"));
    req_.version(11);
    req_.set(http::field::host, target_.url_.host + ":" + target_.url_.port);
    req_.set(http::field::content_type, "application/json");
    req_.set(http::field::accept, "text/event-stream");
    req_.keep_alive(true);
    req_.prepare_payload();
  }

  void run() { reused_ ? write() : connect(); }

 private:
  void connect() {
    auto self = shared_from_this();
    auto do_connect = [self](const tcp::resolver::results_type& eps) {
      self->stream_->expires_after(std::chrono::seconds(10));
      self->stream_->async_connect(eps, [self](beast::error_code ec, const tcp::endpoint&) {
        if (ec) return self->fail("connect: " + ec.message());
        // Small writes go out at once (no Nagle wait behind an unacknowledged segment), as
        // every HTTP client library sets it.
        beast::error_code ignored;
        self->stream_->socket().set_option(tcp::no_delay(true), ignored);
        self->write();
      });
    };
    if (target_.endpoints_) return do_connect(*target_.endpoints_);
    auto resolver = std::make_shared<tcp::resolver>(target_.io_);
    resolver->async_resolve(target_.url_.host, target_.url_.port,
                            [self, resolver, do_connect](beast::error_code ec, tcp::resolver::results_type r) {
                              if (ec) return self->fail("resolve: " + ec.message());
                              self->target_.endpoints_ = r;
                              do_connect(r);
                            });
  }

  // Once: the pooled connection was closed by the server; a new one.
  void retry_fresh() {
    retried_ = true;
    reused_ = false;
    stream_ = std::make_unique<beast::tcp_stream>(target_.io_);
    buffer_.clear();
    connect();
  }

  void write() {
    auto self = shared_from_this();
    stream_->expires_after(target_.options_.read_timeout);
    http::async_write(*stream_, req_, [self](beast::error_code ec, size_t) {
      if (ec) {
        // A pooled connection the server closed meanwhile: retry once on a fresh one.
        if (self->reused_ && !self->retried_) return self->retry_fresh();
        return self->fail("write: " + ec.message());
      }
      self->parser_.emplace();
      // Not boost::none: Boost 1.74 compares a Content-Length against an empty limit as exceeded.
      self->parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
      self->read_more();
    });
  }

  void read_more() {
    if (finished_) return;
    parser_->get().body().data = body_buf_;
    parser_->get().body().size = sizeof body_buf_;
    stream_->expires_after(target_.options_.read_timeout);
    auto self = shared_from_this();
    http::async_read_some(*stream_, buffer_, *parser_, [self](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (finished_) return;
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      // A kept-alive connection closed by the server before any byte of the reply: retry once.
      if (reused_ && !retried_ && !parser_->is_header_done() && ec == http::error::end_of_stream) return retry_fresh();
      if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == http::error::partial_message)
        return fail("connection closed mid-stream");
      if (ec == beast::error::timeout)
        return fail("timeout: server silent for " + std::to_string(target_.options_.read_timeout.count()) + " ms");
      return fail("read: " + ec.message());
    }
    const size_t got = sizeof body_buf_ - parser_->get().body().size;
    const bool header = parser_->is_header_done();
    const unsigned status = header ? parser_->get().result_int() : 0;
    if (header && status == 200) consume(body_buf_, got);
    if (header && status != 200)
      error_body_.append(body_buf_, std::min(got, size_t{512} - std::min(error_body_.size(), size_t{512})));
    if (finished_) return;
    if (!parser_->is_done()) return read_more();
    if (status != 200) {
      for (char& c : error_body_)
        if (c == '\n' || c == '\r') c = ' ';
      return fail("HTTP " + std::to_string(status) + (error_body_.empty() ? "" : ": " + error_body_));
    }
    if (!line_.empty()) consume("\n", 1);  // a last line without its newline
    finish(Outcome::kCompleted, finish_reason_);
  }

  void consume(const char* data, size_t n) {
    for (size_t i = 0; i < n && !finished_; ++i) {
      const char c = data[i];
      if (c != '\n') {
        if (line_.size() < (1u << 20)) line_ += c;
        continue;
      }
      if (!line_.empty() && line_.back() == '\r') line_.pop_back();
      if (line_.compare(0, 5, "data:") == 0) {
        size_t p = 5;
        while (p < line_.size() && line_[p] == ' ') ++p;
        handle_data(std::string_view(line_).substr(p));
      }
      line_.clear();
    }
  }

  void handle_data(std::string_view payload) {
    if (payload == "[DONE]") return;  // the end of the stream comes with the end of the body
    auto chunk = runtime::parse_json(payload);
    if (!chunk) return fail("malformed SSE chunk: " + chunk.status().message());
    if (const JsonValue* error = chunk->find("error"); error && !error->is_null()) {
      const JsonValue& msg = (*error)["message"];
      return fail("server error: " + (msg.is_string() ? msg.as_string() : std::string(payload.substr(0, 200))));
    }
    const JsonValue& choice = (*chunk)["choices"][0];
    const JsonValue& reason = choice["finish_reason"];
    const bool has_reason = reason.is_string() && !reason.as_string().empty();
    if (has_reason) finish_reason_ = reason.as_string();
    const JsonValue& usage = (*chunk)["usage"];
    if (auto n = count(usage["prompt_tokens"])) prompt_tokens_ = *n;
    if (auto n = count(usage["completion_tokens"])) completion_tokens_ = *n;
    if (auto n = count(usage["prompt_tokens_details"]["cached_tokens"])) cached_tokens_ = *n;
    if (!is_token(choice, target_.options_.chat, has_reason)) return;  // e.g. the usage chunk
    const uint32_t n = tracker_->token();
    const uint32_t cancel_after = tracker_->request().cancel_after;
    if (cancel_after > 0 && n == cancel_after) {
      beast::error_code ignored;
      stream_->socket().shutdown(tcp::socket::shutdown_both, ignored);
      finish(Outcome::kCancelled, "cancelled");
    }
  }

  void fail(std::string why) { finish(Outcome::kFailed, "error", std::move(why)); }

  // Finishes the tracker once; a connection whose reply was read whole and may be kept alive
  // goes back to the pool, any other is closed.
  void finish(Outcome outcome, const std::string& reason, std::string error = {}) {
    if (finished_) return;
    finished_ = true;
    if (outcome == Outcome::kCompleted && parser_ && parser_->is_done() && parser_->get().keep_alive() &&
        buffer_.size() == 0) {
      stream_->expires_never();
      target_.release(std::move(stream_));
    } else {
      stream_->close();
    }
    tracker_->finish(outcome, reason, std::move(error), prompt_tokens_, cached_tokens_,
                     outcome == Outcome::kCompleted ? completion_tokens_ : 0);
  }

  OpenAITarget& target_;
  std::shared_ptr<RequestTracker> tracker_;
  std::unique_ptr<beast::tcp_stream> stream_;
  bool reused_;
  bool retried_ = false;
  bool finished_ = false;
  http::request<http::string_body> req_;
  beast::flat_buffer buffer_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  char body_buf_[16384];
  std::string line_;        // the SSE line being assembled
  std::string error_body_;  // body of a non-200 reply (bounded)
  std::string finish_reason_ = "length";
  uint32_t prompt_tokens_ = 0, cached_tokens_ = 0;
  uint32_t completion_tokens_ = 0;  // usage.completion_tokens; 0: count the arrivals
};

void OpenAITarget::start(std::shared_ptr<RequestTracker> tracker) {
  asio::post(io_, [this, tracker = std::move(tracker)]() mutable {
    const bool reused = !idle_.empty();
    auto stream = reused ? std::move(idle_.back()) : std::make_unique<beast::tcp_stream>(io_);
    if (reused) idle_.pop_back();
    std::make_shared<HttpSession>(*this, std::move(tracker), std::move(stream), reused)->run();
  });
}

}  // namespace

Result<std::unique_ptr<Target>> make_openai_target(const OpenAIOptions& options) {
  auto url = parse_url(options.url);
  if (!url) return url.status();
  if (options.model.empty()) return Status::invalid("--model NAME is required with --openai-url");
  if (options.chat && options.token_prompts)
    return Status::invalid("--token-prompts cannot be used with --openai-chat (chat messages are text)");
  return std::unique_ptr<Target>(new OpenAITarget(options, std::move(url.value())));
}

}  // namespace tandem::bench
