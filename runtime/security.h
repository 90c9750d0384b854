// CurveZMQ for tandem's sockets (tcp:// across hosts): the scheduler's sockets are CURVE
// servers holding the secret key; workers and clients must know the server's public key
// to complete the handshake, so a peer without it can neither submit nor register.
// Keys are Z85 text (40 characters), one per file: DIR/server.pub and DIR/server.key.
#pragma once

#include <string>

#include "runtime/status.h"

namespace tandem::runtime {

struct CurveKeys {
  std::string server_public;  // Z85
  std::string server_secret;  // Z85; empty on a client or worker
  bool enabled() const { return !server_public.empty(); }
};

// Reads DIR/server.pub (and DIR/server.key when `need_secret`). Errors name the file.
[[nodiscard]] Result<CurveKeys> load_curve_keys(const std::string& dir, bool need_secret);

// Makes a fresh server key pair in DIR (created 0700): server.pub (0644), server.key (0600).
// Refuses to overwrite existing keys.
[[nodiscard]] Status write_curve_keys(const std::string& dir);

// A fresh key pair held in memory: a socket bound with it is a CURVE server whose public key
// its peers learn from the scheduler (a decode worker's KV socket).
[[nodiscard]] Result<CurveKeys> ephemeral_curve_keys();

// Makes `socket` (a raw ZeroMQ socket) a CURVE server (keys with a secret) or a CURVE client
// of that server (an ephemeral key pair of its own). Must run before bind/connect.
[[nodiscard]] Status apply_curve(void* socket, const CurveKeys& keys);

}  // namespace tandem::runtime
