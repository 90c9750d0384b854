// The gateway's own Prometheus series, served by GET /metrics after the scheduler's: responses
// by HTTP status, connections open and accepted, accepts that failed (out of descriptors).
// Counted on the gateway's thread, except `open_connections` (a session may end on a helper
// thread that held it last). Pure: no sockets, no clock.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace tandem::gateway {

struct HttpCounters {
  // Responses by status code (100..599; 499: the client closed before the answer). One add per
  // request, in the access log's place.
  std::array<uint64_t, 600> responses{};
  std::atomic<int64_t> open_connections{0};
  uint64_t accepted = 0;
  uint64_t accept_failures = 0;

  void count_response(unsigned status) { ++responses[status < responses.size() ? status : 0]; }
};

// The media type of the text format (0.0.4) both parts are in.
inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

// Appends the counters to `out` in the text format, under tandem:gateway_* names (vLLM's
// namespacing, as the scheduler's), one family each, only the status codes seen.
void append_http_metrics(const HttpCounters& counters, std::string& out);

}  // namespace tandem::gateway
