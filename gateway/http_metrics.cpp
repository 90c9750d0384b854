#include "gateway/http_metrics.h"

namespace tandem::gateway {

namespace {

void family(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, const char* name, const std::string& labels, int64_t value) {
  out += name;
  out += labels;
  out += ' ';
  out += std::to_string(value);
  out += '\n';
}

}  // namespace

void append_http_metrics(const HttpCounters& c, std::string& out) {
  constexpr const char* kRequests = "tandem:gateway_http_requests_total";
  family(out, kRequests, "counter",
         "HTTP requests answered by the gateway, by status code (499: the client closed before the answer).");
  for (size_t code = 0; code < c.responses.size(); ++code)
    if (c.responses[code] > 0)
      sample(out, kRequests, "{code=\"" + std::to_string(code) + "\"}", static_cast<int64_t>(c.responses[code]));
  constexpr const char* kOpen = "tandem:gateway_open_connections";
  family(out, kOpen, "gauge", "HTTP connections open now.");
  sample(out, kOpen, "", c.open_connections.load(std::memory_order_relaxed));
  constexpr const char* kAccepted = "tandem:gateway_connections_total";
  family(out, kAccepted, "counter", "HTTP connections accepted.");
  sample(out, kAccepted, "", static_cast<int64_t>(c.accepted));
  constexpr const char* kFailed = "tandem:gateway_accept_failures_total";
  family(out, kFailed, "counter",
         "accept() calls that failed (out of descriptors: EMFILE, ENFILE); each is retried after 100 ms.");
  sample(out, kFailed, "", static_cast<int64_t>(c.accept_failures));
}

}  // namespace tandem::gateway
