// tandem's OpenAI-compatible HTTP gateway: an actor process of its own that speaks HTTP/1.1
// (Boost.Beast on one Asio thread, many keep-alive connections, optional TLS) to OpenAI
// clients and is one client of the scheduler through libtandem-client. It reads only the
// model file's metadata (name, context length, vocabulary, chat template) and adds no path
// into the scheduler: messages go as the client library's chat submission, ids as tokens.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "tandem/client.h"
#include "tandem/status.h"

namespace tandem::gateway {

struct GatewayOptions {
  ClientOptions client;                   // the scheduler's endpoint and credentials
  std::string listen = "127.0.0.1:8000";  // HOST:PORT (PORT 0: the kernel picks one)
  std::string model_path;                 // GGUF: metadata only
  std::string model_name;                 // "": general.name, else the file's stem
  std::string api_key_file;               // lines "KEY [NAME]"; "": no keys asked for
  std::string tls_cert, tls_key;          // PEM files; both or neither
  size_t max_body_bytes = 4u << 20;       // larger: 413
  size_t max_header_bytes = 16u << 10;    // larger: 431
  // From the moment a connection may send a request (accepted, or its last response sent)
  // to that request's last body byte; past it a partial request gets 408 and the connection
  // closes (slow-loris), an idle keep-alive connection just closes.
  std::chrono::milliseconds read_timeout{10000};
  std::chrono::milliseconds ready_poll{500};  // how often the scheduler's readiness is asked
};

// Errors: `listen` is not HOST:PORT with an IP address (IPv6 in brackets) and a port 0..65535.
[[nodiscard]] Status check_listen(const std::string& listen);

// Runs the gateway until SIGTERM or SIGINT. `on_listening` is called with the bound address
// ("http://127.0.0.1:8000") once it accepts. Errors: the model file, a key or TLS file that
// does not load, an address that does not bind (nothing is served then).
[[nodiscard]] Status run_gateway(const GatewayOptions& options,
                                 const std::function<void(const std::string&)>& on_listening);

}  // namespace tandem::gateway
