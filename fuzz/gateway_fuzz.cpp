// libFuzzer target: arbitrary bytes as what an HTTP client sends the gateway. The first byte
// picks the door: 0 the raw request through Beast's request parser with the gateway's limits
// (then its body, if the request parsed, as a /v1/completions body), 1 a /v1/completions
// body, 2 a /v1/chat/completions body, 3 a /tokenize body, 4 a /detokenize body (gateway/api.h).
// Must never crash, hang or trip ASan/UBSan; aborts unless every refusal is an error object
// that is valid JSON with a message, and every accepted request has prompts x n choices, each
// with a prompt, max_tokens within the context and sampling values the scheduler accepts.
// A parsed request's events are also formatted (gateway/response.h) with text from the input.
#include <boost/beast/http.hpp>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "client/sampling.h"
#include "gateway/api.h"
#include "gateway/response.h"
#include "model/sampling_params.h"

using namespace tandem;
using namespace tandem::gateway;

namespace {

[[noreturn]] void violated(const char* what, std::string_view detail) {
  std::fprintf(stderr, "gateway_fuzz: %s: %.*s\n", what, static_cast<int>(detail.size()), detail.data());
  std::abort();
}

const ModelLimits kLimits{"fuzz-model", 512, 8};

void check_error(const ApiError& e) {
  if (e.message.empty() || e.status < 400 || e.status > 599) violated("an error without message or status", e.message);
  const auto body = nlohmann::json::parse(error_body(e), nullptr, false);
  if (body.is_discarded() || !body.contains("error") || !body["error"].contains("message"))
    violated("an error body that is not the OpenAI error object", error_body(e));
}

void check_request(const Parsed& p, std::string_view text) {
  if (!p.ok) return check_error(p.error);
  const ApiRequest& r = p.request;
  if (r.requests.empty() || r.n == 0 || r.n > kLimits.max_n || r.requests.size() % r.n)
    violated("choices are not prompts x n", std::to_string(r.requests.size()));
  for (const GenerateRequest& g : r.requests) {
    if (r.kind == ApiKind::kChat && g.messages.empty()) violated("a chat request without messages", "");
    if (r.max_tokens_given && (g.max_tokens == 0 || g.max_tokens > kLimits.context_length))
      violated("max_tokens outside the context", std::to_string(g.max_tokens));
    if (Status st = model::validate(sampling_params(g)); !st) violated("sampling the scheduler refuses", st.message());
  }
  // Format events of every choice with the input's bytes as token text.
  ResponseFormat format(r.kind, "cmpl-x", 1, kLimits.name, r.logprobs,
                        [&](int32_t id, std::string& out) { out.append(text.substr(0, static_cast<size_t>(id) % 8)); });
  std::string out;
  std::vector<ChoiceResult> choices(r.requests.size());
  for (uint32_t i = 0; i < r.requests.size(); ++i) {
    TokenEvent t{static_cast<int32_t>(i), std::string(text.substr(0, i % 5)), -0.5f, {{1, -1.0f}, {2, -2.0f}}};
    format.role_chunk(out, i);
    format.token_chunk(out, i, t);
    format.finish_chunk(out, i, FinishReason::kLength);
    choices[i].text = t.text;
    choices[i].tokens.push_back(t);
  }
  format.usage_chunk(out, Usage{1, 2, 0});
  if (nlohmann::json::parse(format.full(choices, Usage{1, 2, 0}), nullptr, false).is_discarded())
    violated("a whole response that is not JSON", "");
}

void raw_http(std::string_view bytes) {
  namespace http = boost::beast::http;
  http::request_parser<http::string_body> parser;
  parser.header_limit(16 << 10);
  parser.body_limit(64 << 10);
  parser.eager(true);
  boost::beast::error_code ec;
  size_t used = 0;
  while (used < bytes.size() && !parser.is_done()) {
    const size_t n = parser.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    if (ec == http::error::need_more) break;
    if (ec || n == 0) return;
    used += n;
  }
  if (parser.is_done()) check_request(parse_request(parser.get().body(), ApiKind::kCompletion, kLimits), bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 5) {
    case 0: raw_http(body); break;
    case 1: check_request(parse_request(body, ApiKind::kCompletion, kLimits), body); break;
    case 2: check_request(parse_request(body, ApiKind::kChat, kLimits), body); break;
    case 3:
      if (auto t = parse_tokenize(body, kLimits); !t.ok) check_error(t.error);
      break;
    case 4:
      if (auto d = parse_detokenize(body, kLimits); !d.ok) check_error(d.error);
      break;
  }
  return 0;
}
