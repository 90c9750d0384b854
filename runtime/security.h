// CurveZMQ for tandem's sockets (tcp:// across hosts): the scheduler's sockets are CURVE
// servers holding the secret key; workers and clients must know the server's public key
// to complete the handshake, so a peer without it can neither submit nor register.
// Keys are Z85 text (40 characters), one per file: DIR/server.pub and DIR/server.key.
// Workers and clients may also hold key pairs of their own (DIR/NAME.key, DIR/NAME.pub), which
// the scheduler's allow-lists name (runtime/zap.h): a credential, not just a way in.
#pragma once

#include <string>

#include "runtime/status.h"

namespace tandem::runtime {

struct CurveKeys {
  std::string server_public = {};  // Z85
  std::string server_secret = {};  // Z85; empty on a client or worker
  // A CURVE client's own key pair (a worker's or a client's credential); empty: a fresh key
  // pair per socket, which no allow-list names.
  std::string client_public = {}, client_secret = {};
  // A CURVE server's ZAP domain (ZMQ_ZAP_DOMAIN): the policy of runtime/zap.h its peers are
  // checked against. Empty: none set.
  std::string zap_domain = {};
  bool enabled() const { return !server_public.empty(); }
};

// A key pair from its secret key file (Z85, as NAME.key); the public key is derived from it.
// Errors name the file and, as always, never contain the key.
[[nodiscard]] Result<CurveKeys> load_key_pair(const std::string& secret_path);

// Makes a fresh key pair DIR/NAME.key (0600) and DIR/NAME.pub (0644) for a worker or a client;
// NAME is letters, digits, '-', '_' and '.'. Refuses to overwrite. Returns the public key.
[[nodiscard]] Result<std::string> write_named_key_pair(const std::string& dir, const std::string& name);

// Reads DIR/server.pub (and DIR/server.key when `need_secret`). Errors name the file.
[[nodiscard]] Result<CurveKeys> load_curve_keys(const std::string& dir, bool need_secret);

// Makes a fresh server key pair in DIR (created 0700): server.pub (0644), server.key (0600).
// Refuses to overwrite existing keys.
[[nodiscard]] Status write_curve_keys(const std::string& dir);

// A fresh key pair held in memory: a socket bound with it is a CURVE server whose public key
// its peers learn from the scheduler (a decode worker's KV socket).
[[nodiscard]] Result<CurveKeys> ephemeral_curve_keys();

// Makes `socket` (a raw ZeroMQ socket) a CURVE server (keys with a secret; with its ZAP domain)
// or a CURVE client of that server (with keys.client_*, else an ephemeral key pair of its own).
// Must run before bind/connect.
[[nodiscard]] Status apply_curve(void* socket, const CurveKeys& keys);

}  // namespace tandem::runtime
