// tandem bench: targets, workload, load generator and statistics (see tandem/bench.h).
#include "tandem/bench.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "runtime/json.h"
#include "tandem/client.h"

namespace tandem::bench {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

using runtime::append_json_string;

using runtime::json_number;

// ---- a minimal JSON reader for dataset lines and SSE chunks (flat fields only) ----

struct JsonCursor {
  const std::string& s;
  size_t i = 0;
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  }
  bool eat(char c) {
    ws();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  bool string(std::string& out) {
    if (!eat('"')) return false;
    out.clear();
    while (i < s.size()) {
      char c = s[i++];
      if (c == '"') return true;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size()) return false;
      char e = s[i++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i + 4 > s.size()) return false;
          unsigned cp = static_cast<unsigned>(std::strtoul(s.substr(i, 4).c_str(), nullptr, 16));
          i += 4;
          if (cp < 0x80) {
            out += static_cast<char>(cp);
          } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          } else {  // surrogates are passed through as-is (3 bytes each); prompts rarely hold them
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          }
          break;
        }
        default: out += e;
      }
    }
    return false;
  }
  bool number(double& out) {
    ws();
    const char* begin = s.c_str() + i;
    char* end = nullptr;
    out = std::strtod(begin, &end);
    if (end == begin) return false;
    i += static_cast<size_t>(end - begin);
    return true;
  }
  // Skips any value (nesting bounded by the input length).
  bool skip() {
    ws();
    if (i >= s.size()) return false;
    if (s[i] == '"') {
      std::string tmp;
      return string(tmp);
    }
    if (s[i] == '{' || s[i] == '[') {
      int depth = 0;
      bool in_str = false;
      for (; i < s.size(); ++i) {
        char c = s[i];
        if (in_str) {
          if (c == '\\') ++i;
          else if (c == '"') in_str = false;
        } else if (c == '"') {
          in_str = true;
        } else if (c == '{' || c == '[') {
          ++depth;
        } else if (c == '}' || c == ']') {
          if (--depth == 0) {
            ++i;
            return true;
          }
        }
      }
      return false;
    }
    while (i < s.size() && s[i] != ',' && s[i] != '}' && s[i] != ']') ++i;
    return true;
  }
};

struct DatasetLine {
  std::string prompt;
  std::vector<int32_t> prompt_tokens;
  std::optional<uint32_t> output_len;
};

Result<DatasetLine> parse_dataset_line(const std::string& line) {
  JsonCursor c{line};
  DatasetLine out;
  if (!c.eat('{')) return Status::invalid("not a JSON object");
  if (c.eat('}')) return out;
  for (;;) {
    std::string key;
    if (!c.string(key) || !c.eat(':')) return Status::invalid("malformed key");
    if (key == "prompt") {
      if (!c.string(out.prompt)) return Status::invalid("\"prompt\" must be a string");
    } else if (key == "prompt_tokens") {
      if (!c.eat('[')) return Status::invalid("\"prompt_tokens\" must be an array of token ids");
      if (!c.eat(']')) {
        for (;;) {
          double v;
          if (!c.number(v) || v < 0 || v > INT32_MAX) return Status::invalid("bad token id in \"prompt_tokens\"");
          out.prompt_tokens.push_back(static_cast<int32_t>(v));
          if (c.eat(']')) break;
          if (!c.eat(',')) return Status::invalid("malformed \"prompt_tokens\"");
        }
      }
    } else if (key == "output_len") {
      double v;
      if (!c.number(v) || v < 1 || v > 1e7) return Status::invalid("\"output_len\" must be a positive integer");
      out.output_len = static_cast<uint32_t>(v);
    } else if (!c.skip()) {
      return Status::invalid("malformed value of \"" + key + "\"");
    }
    if (c.eat('}')) return out;
    if (!c.eat(',')) return Status::invalid("malformed object");
  }
}

// ---- tandem target ----

class TandemTarget final : public Target {
 public:
  TandemTarget(std::string endpoint, std::unique_ptr<Client> client)
      : endpoint_(std::move(endpoint)), client_(std::move(client)) {}
  ~TandemTarget() override { client_.reset(); }  // every request still live gets its final event

  void start(std::shared_ptr<RequestTracker> tracker) override {
    const BenchRequest& b = tracker->request();
    GenerateRequest req;
    req.id = "bench-" + std::to_string(next_id_.fetch_add(1));
    req.prompt_tokens = b.prompt_tokens;
    req.prompt_text = b.prompt_text;
    req.max_tokens = b.max_tokens;
    req.ignore_eos = b.ignore_eos;
    const std::string id = req.id;
    Client* client = client_.get();
    const uint32_t cancel_after = b.cancel_after;
    client_->generate(std::move(req), [tracker, client, id, cancel_after](const Event& ev) {
      if (!ev.final) {
        if (tracker->token() == cancel_after) (void)client->cancel(id);
        return;
      }
      const FinalEvent& f = ev.fin;
      switch (f.reason) {
        case FinishReason::kCancelled: tracker->finish(Outcome::kCancelled, "cancelled", {}, f.prompt_tokens); break;
        case FinishReason::kError:
          tracker->finish(Outcome::kFailed, "error", f.error_code + ": " + f.error_message, f.prompt_tokens);
          break;
        default:
          tracker->finish(Outcome::kCompleted, finish_reason_name(f.reason), {}, f.prompt_tokens, f.cached_prompt_tokens);
      }
    });
  }
  std::string describe() const override { return "tandem " + endpoint_; }

 private:
  std::string endpoint_;
  std::unique_ptr<Client> client_;
  std::atomic<uint64_t> next_id_{0};
};

// ---- OpenAI-compatible target ----

class OpenAITarget;

// One request on one connection; lives on the target's I/O thread only.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(OpenAITarget& target, std::shared_ptr<RequestTracker> tracker, std::unique_ptr<beast::tcp_stream> stream,
              bool reused);
  void run();

 private:
  void connect();
  void write();
  void on_read(beast::error_code ec, size_t n);
  void read_more();
  void consume(const char* data, size_t n);
  void handle_data(const std::string& payload);
  void fail(std::string why);
  void done(Outcome outcome, const std::string& reason);

  OpenAITarget& target_;
  std::shared_ptr<RequestTracker> tracker_;
  std::unique_ptr<beast::tcp_stream> stream_;
  bool reused_;
  bool retried_ = false;
  bool finished_ = false;
  bool saw_done_ = false;
  http::request<http::string_body> req_;
  beast::flat_buffer buffer_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  char body_buf_[16384];
  std::string line_;          // the SSE line being assembled
  std::string error_body_;    // body of a non-200 reply (bounded)
  std::string finish_reason_ = "length";
  uint32_t prompt_tokens_ = 0;
};

class OpenAITarget final : public Target {
 public:
  OpenAITarget(OpenAIOptions options, std::string host, std::string port, std::string prefix)
      : options_(std::move(options)),
        host_(std::move(host)),
        port_(std::move(port)),
        prefix_(std::move(prefix)),
        work_(asio::make_work_guard(io_)) {
    thread_ = std::thread([this] { io_.run(); });
  }
  ~OpenAITarget() override {
    // Requests still in flight are dropped without a finish(): the runner already gave up on them.
    work_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  void start(std::shared_ptr<RequestTracker> tracker) override {
    asio::post(io_, [this, tracker = std::move(tracker)]() mutable {
      std::unique_ptr<beast::tcp_stream> stream;
      bool reused = false;
      if (!idle_.empty()) {
        stream = std::move(idle_.back());
        idle_.pop_back();
        reused = true;
      } else {
        stream = std::make_unique<beast::tcp_stream>(io_);
      }
      std::make_shared<HttpSession>(*this, std::move(tracker), std::move(stream), reused)->run();
    });
  }
  std::string describe() const override { return "openai http://" + host_ + ":" + port_ + prefix_ + " " + options_.model; }

  // Pool of idle keep-alive connections (I/O thread only).
  void release(std::unique_ptr<beast::tcp_stream> stream) {
    if (idle_.size() < 1024) idle_.push_back(std::move(stream));
  }

  const OpenAIOptions options_;
  const std::string host_, port_, prefix_;
  asio::io_context io_;
  std::optional<tcp::resolver::results_type> endpoints_;  // resolved once, I/O thread only

 private:
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::vector<std::unique_ptr<beast::tcp_stream>> idle_;
  std::thread thread_;
};

HttpSession::HttpSession(OpenAITarget& target, std::shared_ptr<RequestTracker> tracker,
                         std::unique_ptr<beast::tcp_stream> stream, bool reused)
    : target_(target), tracker_(std::move(tracker)), stream_(std::move(stream)), reused_(reused) {
  const BenchRequest& b = tracker_->request();
  std::string body = "{\"model\":";
  append_json_string(body, target_.options_.model);
  body += ",\"prompt\":";
  if (target_.options_.token_prompts && !b.prompt_tokens.empty()) {
    body += '[';
    for (size_t i = 0; i < b.prompt_tokens.size(); ++i) {
      if (i) body += ',';
      body += std::to_string(b.prompt_tokens[i]);
    }
    body += ']';
  } else {
    append_json_string(body, b.prompt_text);
  }
  body += ",\"max_tokens\":" + std::to_string(b.max_tokens);
  body += ",\"stream\":true,\"stream_options\":{\"include_usage\":true},\"temperature\":0";
  if (b.ignore_eos) body += ",\"ignore_eos\":true";
  body += '}';
  req_.method(http::verb::post);
  req_.target(target_.prefix_ + "/v1/completions");
  req_.version(11);
  req_.set(http::field::host, target_.host_ + ":" + target_.port_);
  req_.set(http::field::content_type, "application/json");
  req_.set(http::field::accept, "text/event-stream");
  req_.keep_alive(true);
  req_.body() = std::move(body);
  req_.prepare_payload();
}

void HttpSession::run() {
  if (reused_) {
    write();
  } else {
    connect();
  }
}

void HttpSession::connect() {
  auto self = shared_from_this();
  auto do_connect = [self](const tcp::resolver::results_type& eps) {
    self->stream_->expires_after(std::chrono::seconds(10));
    self->stream_->async_connect(eps, [self](beast::error_code ec, const tcp::endpoint&) {
      if (ec) return self->fail("connect: " + ec.message());
      self->write();
    });
  };
  if (target_.endpoints_) return do_connect(*target_.endpoints_);
  auto resolver = std::make_shared<tcp::resolver>(target_.io_);
  resolver->async_resolve(target_.host_, target_.port_,
                          [self, resolver, do_connect](beast::error_code ec, tcp::resolver::results_type r) {
                            if (ec) return self->fail("resolve: " + ec.message());
                            self->target_.endpoints_ = r;
                            do_connect(r);
                          });
}

void HttpSession::write() {
  auto self = shared_from_this();
  stream_->expires_after(target_.options_.read_timeout);
  http::async_write(*stream_, req_, [self](beast::error_code ec, size_t) {
    if (ec) {
      // A pooled connection the server closed meanwhile: retry once on a fresh one.
      if (self->reused_ && !self->retried_) {
        self->retried_ = true;
        self->reused_ = false;
        self->stream_ = std::make_unique<beast::tcp_stream>(self->target_.io_);
        return self->connect();
      }
      return self->fail("write: " + ec.message());
    }
    self->parser_.emplace();
    // Not boost::none: Boost 1.74 compares a Content-Length against an empty limit as exceeded.
    self->parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    self->read_more();
  });
}

void HttpSession::read_more() {
  if (finished_) return;
  parser_->get().body().data = body_buf_;
  parser_->get().body().size = sizeof body_buf_;
  stream_->expires_after(target_.options_.read_timeout);
  auto self = shared_from_this();
  http::async_read_some(*stream_, buffer_, *parser_,
                        [self](beast::error_code ec, size_t n) { self->on_read(ec, n); });
}

void HttpSession::on_read(beast::error_code ec, size_t) {
  if (finished_) return;
  if (ec == http::error::need_buffer) ec = {};
  if (ec) {
    // A kept-alive connection closed by the server before any byte of the reply: retry once.
    if (reused_ && !retried_ && !parser_->is_header_done() && ec == http::error::end_of_stream) {
      retried_ = true;
      reused_ = false;
      stream_ = std::make_unique<beast::tcp_stream>(target_.io_);
      buffer_.clear();
      return connect();
    }
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == http::error::partial_message)
      return fail("connection closed mid-stream");
    if (ec == beast::error::timeout) return fail("timeout: server silent for " +
                                                 std::to_string(target_.options_.read_timeout.count()) + " ms");
    return fail("read: " + ec.message());
  }
  const size_t got = sizeof body_buf_ - parser_->get().body().size;
  if (parser_->is_header_done()) {
    const unsigned status = parser_->get().result_int();
    if (status != 200) {
      error_body_.append(body_buf_, std::min(got, size_t{512} - std::min(error_body_.size(), size_t{512})));
    } else {
      consume(body_buf_, got);
    }
  }
  if (finished_) return;
  if (parser_->is_done()) {
    const unsigned status = parser_->get().result_int();
    if (status != 200) {
      std::string body = error_body_;
      for (char& c : body)
        if (c == '\n' || c == '\r') c = ' ';
      return fail("HTTP " + std::to_string(status) + (body.empty() ? "" : ": " + body));
    }
    if (!line_.empty()) consume("\n", 1);  // a last line without its newline
    return done(Outcome::kCompleted, finish_reason_);
  }
  read_more();
}

void HttpSession::consume(const char* data, size_t n) {
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
      handle_data(line_.substr(p));
    }
    line_.clear();
  }
}

// Finds a flat field `"key":` in a chunk and reads a string or a number after it.
bool find_string_field(const std::string& json, const char* key, std::string& out) {
  const std::string pat = std::string("\"") + key + "\"";
  size_t at = json.find(pat);
  if (at == std::string::npos) return false;
  JsonCursor c{json, at + pat.size()};
  if (!c.eat(':')) return false;
  return c.string(out);
}

bool find_number_field(const std::string& json, const char* key, double& out) {
  const std::string pat = std::string("\"") + key + "\"";
  size_t at = json.find(pat);
  if (at == std::string::npos) return false;
  JsonCursor c{json, at + pat.size()};
  if (!c.eat(':')) return false;
  return c.number(out);
}

void HttpSession::handle_data(const std::string& payload) {
  if (payload == "[DONE]") {
    saw_done_ = true;
    return;
  }
  if (payload.compare(0, 9, "{\"error\":") == 0) {
    std::string msg;
    if (!find_string_field(payload, "message", msg)) msg = payload.substr(0, 200);
    return fail("server error: " + msg);
  }
  std::string reason;
  if (find_string_field(payload, "finish_reason", reason) && !reason.empty()) finish_reason_ = reason;
  double pt;
  if (find_number_field(payload, "prompt_tokens", pt) && pt >= 0) prompt_tokens_ = static_cast<uint32_t>(pt);
  if (payload.find("\"text\"") == std::string::npos) return;  // e.g. the usage chunk
  // A closing chunk: empty text with the finish reason (llama.cpp's server sends one after the
  // last token; vLLM puts the reason on the last token's chunk instead).
  if (!reason.empty() && payload.find("\"text\":\"\"") != std::string::npos) return;
  const uint32_t n = tracker_->token();
  const uint32_t cancel_after = tracker_->request().cancel_after;
  if (cancel_after > 0 && n == cancel_after) {
    beast::error_code ignored;
    stream_->socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_->close();
    done(Outcome::kCancelled, "cancelled");
  }
}

void HttpSession::fail(std::string why) {
  if (finished_) return;
  finished_ = true;
  stream_->close();
  tracker_->finish(Outcome::kFailed, "error", std::move(why), prompt_tokens_);
}

void HttpSession::done(Outcome outcome, const std::string& reason) {
  if (finished_) return;
  finished_ = true;
  if (outcome == Outcome::kCompleted && parser_ && parser_->is_done() && parser_->get().keep_alive() &&
      buffer_.size() == 0) {
    stream_->expires_never();
    target_.release(std::move(stream_));
  }
  tracker_->finish(outcome, reason, {}, prompt_tokens_);
}

// "http://host[:port][/prefix]" -> host, port, prefix (no trailing slash, no "/v1").
Status parse_url(const std::string& url, std::string& host, std::string& port, std::string& prefix) {
  const std::string scheme = "http://";
  if (url.compare(0, scheme.size(), scheme) != 0)
    return Status::invalid("--openai-url must start with http:// (https is not supported): " + url);
  std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  prefix = slash == std::string::npos ? "" : rest.substr(slash);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (prefix.size() >= 3 && prefix.compare(prefix.size() - 3, 3, "/v1") == 0) prefix.resize(prefix.size() - 3);
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos) {
    host = hostport;
    port = "80";
  } else {
    host = hostport.substr(0, colon);
    port = hostport.substr(colon + 1);
  }
  if (host.empty() || port.empty() || port.find_first_not_of("0123456789") != std::string::npos)
    return Status::invalid("malformed --openai-url: " + url);
  return Status::ok();
}

// ---- workload ----

constexpr int32_t kFirstTokenId = 3, kTokenIdEnd = 259;  // byte tokens exist in every byte-level vocabulary

const char* const kWords[] = {"the", "of",   "and",  "to",   "in",    "is",   "you",  "that", "it",  "he",
                              "was", "for",  "on",   "are",  "as",    "with", "his",  "they", "at",  "be",
                              "this", "have", "from", "or",  "one",   "had",  "by",   "word", "but", "not",
                              "what", "all",  "were", "we",  "when",  "your", "can",  "said", "there", "use"};

uint32_t pick(const LengthRange& r, std::mt19937_64& rng) {
  if (r.hi <= r.lo) return r.lo;
  return std::uniform_int_distribution<uint32_t>(r.lo, r.hi)(rng);
}

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

}  // namespace

// ---- RequestTracker ----

RequestTracker::RequestTracker(BenchRequest request, std::function<void()> on_finish)
    : request_(std::move(request)), on_finish_(std::move(on_finish)), input_tokens_(request_.input_tokens) {
  // A server may stream a little more than asked (a final chunk); the slack avoids regrowth.
  token_times_.reserve(static_cast<size_t>(request_.max_tokens) + 8);
}

void RequestTracker::finish(Outcome outcome, std::string finish_reason, std::string error, uint32_t input_tokens,
                            uint32_t cached_tokens) {
  if (done_.load(std::memory_order_relaxed)) return;
  finished_at_ = Clock::now();
  outcome_ = outcome;
  finish_reason_ = std::move(finish_reason);
  error_ = std::move(error);
  if (input_tokens > 0) input_tokens_ = input_tokens;
  cached_tokens_ = cached_tokens;
  done_.store(true, std::memory_order_release);
  if (on_finish_) on_finish_();
}

// ---- targets ----

Result<std::unique_ptr<Target>> make_tandem_target(const std::string& endpoint) {
  ClientOptions options;
  options.endpoint = endpoint;
  auto client = Client::connect(options);
  if (!client) return client.status();
  return std::unique_ptr<Target>(new TandemTarget(endpoint, std::move(client.value())));
}

Result<std::unique_ptr<Target>> make_openai_target(const OpenAIOptions& options) {
  std::string host, port, prefix;
  TANDEM_RETURN_IF_ERROR(parse_url(options.url, host, port, prefix));
  if (options.model.empty()) return Status::invalid("--model NAME is required with --openai-url");
  return std::unique_ptr<Target>(new OpenAITarget(options, host, port, prefix));
}

// ---- workload ----

Result<LengthRange> parse_length_range(const std::string& text) {
  auto parse_one = [](const std::string& s, uint32_t& out) {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return false;
    out = static_cast<uint32_t>(std::stoul(s));
    return true;
  };
  LengthRange r;
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    if (!parse_one(text, r.lo)) return Status::invalid("length must be N or A:B, got '" + text + "'");
    r.hi = r.lo;
  } else if (!parse_one(text.substr(0, colon), r.lo) || !parse_one(text.substr(colon + 1), r.hi) || r.lo > r.hi) {
    return Status::invalid("length range must be A:B with A <= B, got '" + text + "'");
  }
  return r;
}

Result<Workload> Workload::create(WorkloadOptions options) {
  if (options.cancel_fraction < 0 || options.cancel_fraction > 1)
    return Status::invalid("--cancel-fraction must be in [0, 1]");
  if (options.prefix_groups == 0) return Status::invalid("--prefix-groups must be >= 1");
  if (options.shared_prefix > 0 && options.dataset.empty() && options.input_len.lo <= options.shared_prefix)
    return Status::invalid("--input-len (" + std::to_string(options.input_len.lo) + ") must exceed --shared-prefix (" +
                           std::to_string(options.shared_prefix) + "): a prompt is its shared prefix plus unique tokens");
  if (options.output_len.lo == 0 && options.dataset.empty()) return Status::invalid("--output-len must be >= 1");
  Workload w;
  w.options_ = options;
  if (!options.dataset.empty()) {
    std::ifstream in(options.dataset);
    if (!in) return Status::invalid("cannot read --dataset " + options.dataset);
    std::string line;
    size_t lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      auto parsed = parse_dataset_line(line);
      if (!parsed) return Status::invalid(options.dataset + ":" + std::to_string(lineno) + ": " + parsed.status().message());
      if (parsed->prompt.empty() && parsed->prompt_tokens.empty())
        return Status::invalid(options.dataset + ":" + std::to_string(lineno) + ": needs \"prompt\" or \"prompt_tokens\"");
      Entry e;
      e.text = std::move(parsed->prompt);
      e.tokens = std::move(parsed->prompt_tokens);
      e.output_len = parsed->output_len.value_or(0);
      w.dataset_.push_back(std::move(e));
    }
    if (w.dataset_.empty()) return Status::invalid("--dataset " + options.dataset + " has no requests");
  }
  std::mt19937_64 rng(options.seed ^ 0x5eedf00dULL);
  std::uniform_int_distribution<int32_t> id(kFirstTokenId, kTokenIdEnd - 1);
  for (uint32_t g = 0; options.shared_prefix > 0 && g < options.prefix_groups; ++g) {
    std::vector<int32_t> p(options.shared_prefix);
    for (auto& t : p) t = id(rng);
    w.prefixes_.push_back(std::move(p));
  }
  return w;
}

BenchRequest Workload::make(uint64_t index) const {
  std::mt19937_64 rng(options_.seed * 0x9E3779B97F4A7C15ULL + index * 0xBF58476D1CE4E5B9ULL + 1);
  BenchRequest r;
  r.index = index;
  r.ignore_eos = options_.ignore_eos;
  std::vector<int32_t> tokens;
  if (!dataset_.empty()) {
    const Entry& e = dataset_[index % dataset_.size()];
    r.prompt_text = e.text;
    r.prompt_tokens = e.tokens;
    r.max_tokens = e.output_len > 0 ? e.output_len : std::max<uint32_t>(1, pick(options_.output_len, rng));
    r.input_tokens = !e.tokens.empty() ? static_cast<uint32_t>(e.tokens.size()) : 0;
  } else {
    const uint32_t len = pick(options_.input_len, rng);
    r.max_tokens = std::max<uint32_t>(1, pick(options_.output_len, rng));
    std::uniform_int_distribution<int32_t> id(kFirstTokenId, kTokenIdEnd - 1);
    if (!prefixes_.empty()) {  // the prompt's first shared_prefix tokens; len counts them
      const auto& p = prefixes_[index % prefixes_.size()];
      tokens.insert(tokens.end(), p.begin(), p.end());
    }
    while (tokens.size() < len) tokens.push_back(id(rng));
    r.input_tokens = static_cast<uint32_t>(tokens.size());
    // Text prompts: one common English word per token id (about one token each in BPE vocabularies).
    r.prompt_text.reserve(tokens.size() * 5);
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) r.prompt_text += ' ';
      r.prompt_text += kWords[static_cast<size_t>(tokens[i]) % (sizeof kWords / sizeof kWords[0])];
    }
    if (!options_.text_prompts) {
      r.prompt_tokens = std::move(tokens);
      r.prompt_text.clear();
    }
  }
  if (options_.cancel_fraction > 0 && std::uniform_real_distribution<double>(0, 1)(rng) < options_.cancel_fraction)
    r.cancel_after = std::max<uint32_t>(1, options_.cancel_after);
  return r;
}

// ---- statistics ----

Distribution distribution(std::vector<double> values) {
  Distribution d;
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.count = values.size();
  double sum = 0;
  for (double v : values) sum += v;
  d.mean = sum / static_cast<double>(values.size());
  d.p50 = percentile(values, 0.50);
  d.p90 = percentile(values, 0.90);
  d.p99 = percentile(values, 0.99);
  d.max = values.back();
  return d;
}

Summary summarize(const std::vector<std::shared_ptr<RequestTracker>>& trackers, Clock::time_point t0,
                  const LoadOptions& load) {
  Summary s;
  s.rate = load.rate;
  s.burstiness = load.burstiness;
  s.concurrency = load.concurrency;
  std::vector<double> ttft, itl, tpot, e2e;
  std::map<std::string, uint64_t> errors;
  Clock::time_point last = t0;
  uint64_t good = 0;
  for (const auto& t : trackers) {
    RequestRecord r;
    r.index = t->request().index;
    r.start_s = std::chrono::duration<double>(t->sent() - t0).count();
    if (!t->finished()) {  // no final event within the drain timeout: the target may still write to it
      r.input_tokens = t->request().input_tokens;
      r.finish_reason = "error";
      r.error = "no final event within the drain timeout";
      r.outcome = Outcome::kFailed;
      ++s.failed;
      ++errors[r.error];
      s.records.push_back(std::move(r));
      continue;
    }
    const auto& times = t->token_times();
    r.input_tokens = t->input_tokens();
    r.cached_tokens = t->cached_tokens();
    r.output_tokens = static_cast<uint32_t>(times.size());
    r.finish_reason = t->finish_reason();
    r.error = t->error();
    r.outcome = t->outcome();
    r.e2e_ms = ms_between(t->sent(), t->finished_at());
    if (!times.empty()) r.ttft_ms = ms_between(t->sent(), times.front());
    r.itl_ms.reserve(times.size());
    r.token_s.reserve(times.size());
    for (size_t i = 0; i < times.size(); ++i) {
      if (i > 0) r.itl_ms.push_back(ms_between(times[i - 1], times[i]));
      r.token_s.push_back(std::chrono::duration<double>(times[i] - t0).count());
    }
    if (times.size() > 1) r.tpot_ms = ms_between(times.front(), times.back()) / static_cast<double>(times.size() - 1);
    last = std::max(last, t->finished_at());
    // A failed request's prompt may never have been processed; its streamed tokens were.
    if (r.outcome != Outcome::kFailed) s.input_tokens += r.input_tokens, s.cached_input_tokens += r.cached_tokens;
    s.output_tokens += r.output_tokens;
    switch (r.outcome) {
      case Outcome::kCompleted: {
        ++s.completed;
        if (!times.empty()) ttft.push_back(r.ttft_ms);
        itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
        if (times.size() > 1) tpot.push_back(r.tpot_ms);
        e2e.push_back(r.e2e_ms);
        const bool ttft_ok = load.slo_ttft_ms <= 0 || (!times.empty() && r.ttft_ms <= load.slo_ttft_ms);
        const bool tpot_ok = load.slo_tpot_ms <= 0 || r.tpot_ms <= load.slo_tpot_ms;
        if (ttft_ok && tpot_ok) ++good;
        break;
      }
      case Outcome::kCancelled: ++s.cancelled; break;
      case Outcome::kFailed:
        ++s.failed;
        ++errors[r.error.empty() ? "unknown" : r.error];
        break;
    }
    s.records.push_back(std::move(r));
  }
  s.duration_s = std::chrono::duration<double>(last - t0).count();
  if (s.duration_s > 0) {
    s.requests_per_s = static_cast<double>(s.completed) / s.duration_s;
    s.input_tokens_per_s = static_cast<double>(s.input_tokens) / s.duration_s;
    s.output_tokens_per_s = static_cast<double>(s.output_tokens) / s.duration_s;
    if (load.slo_ttft_ms > 0 || load.slo_tpot_ms > 0) s.goodput_requests_per_s = static_cast<double>(good) / s.duration_s;
  } else if (load.slo_ttft_ms > 0 || load.slo_tpot_ms > 0) {
    s.goodput_requests_per_s = 0.0;
  }
  for (auto& [reason, n] : errors) s.errors.emplace_back(reason, n);
  std::stable_sort(s.errors.begin(), s.errors.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  s.ttft_ms = distribution(std::move(ttft));
  s.itl_ms = distribution(std::move(itl));
  s.tpot_ms = distribution(std::move(tpot));
  s.e2e_ms = distribution(std::move(e2e));
  return s;
}

// ---- the load generator ----

Result<Summary> run(Target& target, const Workload& workload, const LoadOptions& load) {
  if (load.num_requests == 0 && load.duration_s <= 0)
    return Status::invalid("give --num-requests N and/or --duration S");
  if (load.rate <= 0 && load.concurrency == 0) return Status::invalid("give --rate R and/or --concurrency C");
  if (!(load.burstiness > 0)) return Status::invalid("--burstiness must be > 0");

  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t in_flight = 0;  // guarded by mu
    uint64_t finished = 0;   // guarded by mu
  };
  auto shared = std::make_shared<Shared>();
  auto on_finish = [shared] {
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      --shared->in_flight;
      ++shared->finished;
    }
    shared->cv.notify_all();
  };
  auto launch = [&](uint64_t index, std::vector<std::shared_ptr<RequestTracker>>& into) {
    auto tracker = std::make_shared<RequestTracker>(workload.make(index), on_finish);
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      ++shared->in_flight;
    }
    tracker->mark_sent();
    into.push_back(tracker);
    target.start(std::move(tracker));
  };
  // Waits until at most `cap` requests are in flight, or `deadline`; false on the deadline.
  auto wait_in_flight = [&](uint64_t cap, Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(shared->mu);
    return shared->cv.wait_until(lock, deadline, [&] { return shared->in_flight <= cap; });
  };

  // Warmup: its own requests, at the same concurrency cap (or one at a time), not counted.
  if (load.warmup > 0) {
    std::vector<std::shared_ptr<RequestTracker>> warm;
    const uint64_t cap = load.concurrency > 0 ? load.concurrency : 1;
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(load.drain_timeout_s));
    for (uint32_t i = 0; i < load.warmup; ++i) {
      if (!wait_in_flight(cap - 1, deadline)) break;
      launch(~0ULL - i, warm);
    }
    (void)wait_in_flight(0, deadline);
  }
  {
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->finished = 0;
  }

  std::vector<std::shared_ptr<RequestTracker>> trackers;
  if (load.num_requests > 0) trackers.reserve(load.num_requests);
  std::mt19937_64 rng(load.seed ^ 0xa11e55ULL);
  std::gamma_distribution<double> gap(load.burstiness, load.rate > 0 ? 1.0 / (load.rate * load.burstiness) : 1.0);
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point stop_sending =
      load.duration_s > 0 ? t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(load.duration_s))
                          : Clock::time_point::max();
  Clock::time_point next_arrival = t0;
  Clock::time_point next_progress = t0 + load.progress_interval;
  auto report = [&](Clock::time_point now) {
    if (!load.progress || now < next_progress) return;
    next_progress = now + load.progress_interval;
    uint64_t done;
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      done = shared->finished;
    }
    // Tokens so far: read only from finished trackers (live ones belong to the target).
    uint64_t tokens = 0;
    for (const auto& t : trackers)
      if (t->finished()) tokens += t->token_times().size();
    const double secs = std::chrono::duration<double>(now - t0).count();
    load.progress(done, load.num_requests, secs > 0 ? static_cast<double>(tokens) / secs : 0);
  };

  for (uint64_t i = 0;; ++i) {
    if (load.num_requests > 0 && i >= load.num_requests) break;
    if (load.rate > 0) {
      next_arrival += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
      if (i == 0) next_arrival = t0;  // the first request goes at once
    }
    bool stop = false;
    for (;;) {  // bounded: every pass waits up to a progress interval, and stop_sending ends it
      const auto now = Clock::now();
      report(now);
      if (now >= stop_sending) {
        stop = true;
        break;
      }
      const auto wake = std::min({now + load.progress_interval, stop_sending,
                                  load.rate > 0 ? next_arrival : Clock::time_point::max()});
      if (load.concurrency > 0) {
        std::unique_lock<std::mutex> lock(shared->mu);
        if (shared->in_flight >= load.concurrency) {
          shared->cv.wait_until(lock, wake, [&] { return shared->in_flight < load.concurrency; });
          continue;
        }
      }
      if (load.rate > 0 && now < next_arrival) {
        std::this_thread::sleep_until(std::min(wake, next_arrival));
        continue;
      }
      break;
    }
    if (stop) break;
    launch(i, trackers);
  }
  // Drain: wait for requests in flight, bounded by the drain timeout.
  const auto drain_deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(load.drain_timeout_s));
  for (;;) {
    const auto now = Clock::now();
    report(now);
    if (now >= drain_deadline) break;
    if (wait_in_flight(0, std::min(drain_deadline, now + load.progress_interval))) break;
  }
  Summary s = summarize(trackers, t0, load);
  s.target = target.describe();
  return s;
}

// ---- output ----

namespace {

void append_distribution(std::string& out, const char* name, const Distribution& d) {
  out += '"';
  out += name;
  out += "\":{\"count\":" + std::to_string(d.count) + ",\"mean\":" + json_number(d.mean) + ",\"p50\":" + json_number(d.p50) +
         ",\"p90\":" + json_number(d.p90) + ",\"p99\":" + json_number(d.p99) + ",\"max\":" + json_number(d.max) + "}";
}

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kCompleted: return "completed";
    case Outcome::kCancelled: return "cancelled";
    default: return "failed";
  }
}

}  // namespace

std::string summary_json(const Summary& s, bool with_records) {
  std::string out = "{\"target\":";
  append_json_string(out, s.target);
  out += ",\"load\":{\"rate\":" + json_number(s.rate) + ",\"burstiness\":" + json_number(s.burstiness) +
         ",\"concurrency\":" + std::to_string(s.concurrency) + "}";
  out += ",\"duration_s\":" + json_number(s.duration_s);
  out += ",\"requests\":{\"completed\":" + std::to_string(s.completed) + ",\"failed\":" + std::to_string(s.failed) +
         ",\"cancelled\":" + std::to_string(s.cancelled) + ",\"errors\":{";
  for (size_t i = 0; i < s.errors.size(); ++i) {
    if (i) out += ',';
    append_json_string(out, s.errors[i].first);
    out += ':' + std::to_string(s.errors[i].second);
  }
  out += "}}";
  out += ",\"tokens\":{\"input\":" + std::to_string(s.input_tokens) + ",\"cached_input\":" +
         std::to_string(s.cached_input_tokens) + ",\"output\":" + std::to_string(s.output_tokens) + "}";
  out += ",\"throughput\":{\"requests_per_s\":" + json_number(s.requests_per_s) +
         ",\"input_tokens_per_s\":" + json_number(s.input_tokens_per_s) +
         ",\"output_tokens_per_s\":" + json_number(s.output_tokens_per_s) + "}";
  out += ",\"goodput\":{\"requests_per_s\":" +
         (s.goodput_requests_per_s ? json_number(*s.goodput_requests_per_s) : std::string("null")) + "}";
  out += ',';
  append_distribution(out, "ttft_ms", s.ttft_ms);
  out += ',';
  append_distribution(out, "itl_ms", s.itl_ms);
  out += ',';
  append_distribution(out, "tpot_ms", s.tpot_ms);
  out += ',';
  append_distribution(out, "e2e_ms", s.e2e_ms);
  if (with_records) {
    out += ",\"records\":[";
    for (size_t i = 0; i < s.records.size(); ++i) {
      const RequestRecord& r = s.records[i];
      if (i) out += ',';
      out += "{\"index\":" + std::to_string(r.index) + ",\"outcome\":\"" + outcome_name(r.outcome) +
             "\",\"finish_reason\":";
      append_json_string(out, r.finish_reason);
      out += ",\"error\":";
      append_json_string(out, r.error);
      out += ",\"start_s\":" + json_number(r.start_s) + ",\"input_tokens\":" + std::to_string(r.input_tokens) +
             ",\"cached_tokens\":" + std::to_string(r.cached_tokens) + ",\"output_tokens\":" + std::to_string(r.output_tokens) + ",\"ttft_ms\":" + json_number(r.ttft_ms) +
             ",\"tpot_ms\":" + json_number(r.tpot_ms) + ",\"e2e_ms\":" + json_number(r.e2e_ms) + ",\"itl_ms\":[";
      for (size_t k = 0; k < r.itl_ms.size(); ++k) {
        if (k) out += ',';
        out += json_number(r.itl_ms[k]);
      }
      out += "]}";
    }
    out += ']';
  }
  out += '}';
  return out;
}

std::string summary_table(const Summary& s) {
  std::string out;
  char line[256];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof line, fmt, args...);
    out += line;
  };
  add("target              %s\n", s.target.c_str());
  add("load                rate %s req/s, burstiness %.3g, concurrency %s\n",
      s.rate > 0 ? json_number(s.rate).c_str() : "unpaced", s.burstiness,
      s.concurrency > 0 ? std::to_string(s.concurrency).c_str() : "uncapped");
  add("duration            %.3f s\n", s.duration_s);
  add("requests            %llu completed, %llu failed, %llu cancelled\n", static_cast<unsigned long long>(s.completed),
      static_cast<unsigned long long>(s.failed), static_cast<unsigned long long>(s.cancelled));
  for (const auto& [reason, n] : s.errors) add("  error x%-6llu     %.180s\n", static_cast<unsigned long long>(n), reason.c_str());
  add("throughput          %.2f req/s, %.1f input tok/s, %.1f output tok/s\n", s.requests_per_s, s.input_tokens_per_s,
      s.output_tokens_per_s);
  if (s.cached_input_tokens)
    add("prefix cache        %.1f%% of input tokens served from the server's cache\n",
        100.0 * double(s.cached_input_tokens) / double(s.input_tokens));
  if (s.goodput_requests_per_s) add("goodput             %.2f req/s within the SLOs\n", *s.goodput_requests_per_s);
  add("%-12s %10s %10s %10s %10s %10s %8s\n", "(ms)", "mean", "p50", "p90", "p99", "max", "n");
  for (const auto& [name, d] : {std::pair<const char*, const Distribution*>{"ttft", &s.ttft_ms},
                                {"itl", &s.itl_ms},
                                {"tpot", &s.tpot_ms},
                                {"e2e", &s.e2e_ms}})
    add("%-12s %10.2f %10.2f %10.2f %10.2f %10.2f %8llu\n", name, d->mean, d->p50, d->p90, d->p99, d->max,
        static_cast<unsigned long long>(d->count));
  return out;
}

}  // namespace tandem::bench
