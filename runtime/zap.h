// Who may connect to a CURVE server socket, by its peer's public key: a ZAP handler (ZeroMQ RFC 27)
// at inproc://zeromq.zap.01 in an EventLoop's context, served on the loop's own thread (it is one
// more socket in the loop; libzmq's I/O thread waits for the reply without blocking anything).
//
// Each CURVE server socket names a ZAP domain (CurveKeys::zap_domain), and each domain has a
// policy: an allow-list (only listed keys complete the handshake; every message from the peer
// carries the credential's name as its "User-Id" property, zmq_msg_gets) or any key (the
// "User-Id" is the peer's public key in Z85). A domain without a policy refuses every peer.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/event_loop.h"
#include "runtime/status.h"

namespace tandem::runtime {

// One line of an allow-list: a key's name and what it may do (or a principal's range).
struct Credential {
  std::string name;
  // The Submit.priority range this credential may use (client lists, `priority=LO..HI`).
  int32_t min_priority = std::numeric_limits<int32_t>::min();
  int32_t max_priority = std::numeric_limits<int32_t>::max();
  // A proxy (client lists, `proxy`): may send requests for others (Submit.principal).
  bool proxy = false;
  bool has_priority_range() const {
    return min_priority != std::numeric_limits<int32_t>::min() || max_priority != std::numeric_limits<int32_t>::max();
  }
};

// An allow-list file: one credential a line, `KEY NAME [priority=LO..HI] [proxy]` (KEY: a Z85
// public key, the text of NAME.pub; the options in any order); in a client list also
// `principal NAME priority=LO..HI`: the range of requests a proxy sends for principal NAME (a
// Z85 key is never the word `principal`: it has 40 characters). A word starting with `#` starts
// a comment (a Z85 key may contain `#` but never starts with it), blank lines are skipped.
// Names are unique among keys, and among principals.
class AllowList {
 public:
  enum class Of { kWorkers, kClients };  // `proxy` and principal lines: client lists only
  // Errors name the file and line, never a key. `flag` prefixes them ("--worker-keys").
  [[nodiscard]] static Result<AllowList> load(const std::string& path, const std::string& flag, Of of);
  const Credential* find_key(const std::string& z85) const;
  const Credential* find_name(const std::string& name) const;
  const Credential* find_principal(const std::string& name) const;  // a `principal` line
  size_t size() const { return by_key_.size(); }
  size_t principals() const { return principals_.size(); }

 private:
  // One line's words (no comment): a key's or a principal's; the error names `where`.
  [[nodiscard]] Status add_line(const std::vector<std::string>& words, const std::string& where, Of of);

  std::unordered_map<std::string, Credential> by_key_;
  std::unordered_map<std::string, std::string> key_by_name_;
  std::unordered_map<std::string, Credential> principals_;
};

class ZapHandler {
 public:
  // Binds the handler in `loop`'s context. Call before binding any CURVE server socket: until a
  // handler exists, libzmq lets every CURVE client in.
  [[nodiscard]] static Result<std::unique_ptr<ZapHandler>> start(EventLoop& loop);

  // Peers in `domain` must hold a key of `list` (replacing the domain's previous policy; the
  // connections already made stay: their owner decides what to do with them).
  void allow_listed(const std::string& domain, std::shared_ptr<const AllowList> list);
  // Any CURVE key is let in; its User-Id is the key (Z85), for the socket's owner to check.
  void allow_any(const std::string& domain);

  uint64_t refused() const { return refused_; }

 private:
  struct Policy {
    std::shared_ptr<const AllowList> list;  // null: any key
  };
  explicit ZapHandler(std::unique_ptr<Socket> socket) : socket_(std::move(socket)) {}
  void on_request(Frames& frames);

  std::unique_ptr<Socket> socket_;
  std::unordered_map<std::string, Policy> policies_;
  uint64_t refused_ = 0;
};

// Who sent a message, as its socket's ZAP policy named the peer ("User-Id"): the credential's
// name in an allow-list domain, the Z85 public key in an any-key domain; empty without ZAP.
std::string sender_of(const zmq::message_t& frame);

}  // namespace tandem::runtime
