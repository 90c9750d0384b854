#include "runtime/security.h"

#include <sys/stat.h>
#include <zmq.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace tandem::runtime {

namespace {

constexpr size_t kZ85KeyChars = 40;

Result<std::string> read_key(const std::string& path, const char* flag = "--curve-keys") {
  std::ifstream f(path);
  if (!f) return Status::invalid(std::string(flag) + ": cannot read " + path);
  std::string key;
  f >> key;
  uint8_t raw[32];
  if (key.size() != kZ85KeyChars || !zmq_z85_decode(raw, key.c_str()))
    return Status::invalid(std::string(flag) + ": " + path + " is not a Z85 CURVE key (40 characters)");
  return key;
}

Status write_file(const std::string& path, const char* text, mode_t mode) {
  std::ofstream f(path);
  f << text << "\n";
  f.close();
  if (!f || chmod(path.c_str(), mode) != 0) return Status::invalid("cannot write " + path);
  return Status::ok();
}

}  // namespace

Result<CurveKeys> load_curve_keys(const std::string& dir, bool need_secret) {
  CurveKeys keys;
  auto pub = read_key(dir + "/server.pub");
  if (!pub) return pub.status();
  keys.server_public = *pub;
  if (need_secret) {
    auto secret = read_key(dir + "/server.key");
    if (!secret) return secret.status();
    keys.server_secret = *secret;
  }
  return keys;
}

namespace {

// Creates DIR (0700) and a fresh key pair DIR/BASE.key (0600), DIR/BASE.pub (0644); the public key.
Result<std::string> write_key_pair(const std::string& dir, const std::string& base) {
  if (!zmq_has("curve")) return Status::error(Code::kInternal, "this libzmq was built without CURVE");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || chmod(dir.c_str(), 0700) != 0) return Status::invalid("--out: cannot create " + dir);
  const std::string secret_path = dir + "/" + base + ".key";
  if (std::filesystem::exists(secret_path))
    return Status::invalid("--out: " + secret_path + " exists; not overwriting a key in use");
  char pub[kZ85KeyChars + 1], secret[kZ85KeyChars + 1];
  if (zmq_curve_keypair(pub, secret) != 0) return Status::error(Code::kInternal, "zmq_curve_keypair failed");
  TANDEM_RETURN_IF_ERROR(write_file(secret_path, secret, 0600));
  TANDEM_RETURN_IF_ERROR(write_file(dir + "/" + base + ".pub", pub, 0644));
  return std::string(pub);
}

}  // namespace

Status write_curve_keys(const std::string& dir) { return write_key_pair(dir, "server").status(); }

Result<std::string> write_named_key_pair(const std::string& dir, const std::string& name) {
  const bool valid =
      !name.empty() && name != "server" && name[0] != '.' &&
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") == std::string::npos;
  if (!valid) return Status::invalid("--name " + name + ": use letters, digits, '-', '_' and '.' (and not \"server\")");
  return write_key_pair(dir, name);
}

Result<CurveKeys> load_key_pair(const std::string& secret_path) {
  auto secret = read_key(secret_path, "key file");
  if (!secret) return secret.status();
  char pub[kZ85KeyChars + 1];
  if (zmq_curve_public(pub, secret->c_str()) != 0) return Status::invalid(secret_path + ": not a CURVE secret key");
  CurveKeys keys;
  keys.client_public = pub;
  keys.client_secret = *secret;
  return keys;
}

Result<CurveKeys> ephemeral_curve_keys() {
  char pub[kZ85KeyChars + 1], secret[kZ85KeyChars + 1];
  if (zmq_curve_keypair(pub, secret) != 0) return Status::error(Code::kInternal, "zmq_curve_keypair failed");
  return CurveKeys{pub, secret};
}

Status apply_curve(void* socket, const CurveKeys& keys) {
  auto set = [&](int option, const std::string& value, const char* name) -> Status {
    if (zmq_setsockopt(socket, option, value.c_str(), value.size()) == 0) return Status::ok();
    return Status::error(Code::kInvalidArgument, std::string("setsockopt ") + name + ": " + zmq_strerror(zmq_errno()));
  };
  if (!keys.server_secret.empty()) {
    const int on = 1;
    if (zmq_setsockopt(socket, ZMQ_CURVE_SERVER, &on, sizeof(on)) != 0)
      return Status::error(Code::kInvalidArgument, std::string("ZMQ_CURVE_SERVER: ") + zmq_strerror(zmq_errno()));
    if (!keys.zap_domain.empty()) TANDEM_RETURN_IF_ERROR(set(ZMQ_ZAP_DOMAIN, keys.zap_domain, "ZMQ_ZAP_DOMAIN"));
    return set(ZMQ_CURVE_SECRETKEY, keys.server_secret, "ZMQ_CURVE_SECRETKEY");
  }
  char pub[kZ85KeyChars + 1], secret[kZ85KeyChars + 1];
  if (!keys.client_secret.empty()) {
    std::snprintf(pub, sizeof(pub), "%s", keys.client_public.c_str());
    std::snprintf(secret, sizeof(secret), "%s", keys.client_secret.c_str());
  } else if (zmq_curve_keypair(pub, secret) != 0) {
    return Status::error(Code::kInternal, "zmq_curve_keypair failed");
  }
  TANDEM_RETURN_IF_ERROR(set(ZMQ_CURVE_SERVERKEY, keys.server_public, "ZMQ_CURVE_SERVERKEY"));
  TANDEM_RETURN_IF_ERROR(set(ZMQ_CURVE_PUBLICKEY, pub, "ZMQ_CURVE_PUBLICKEY"));
  return set(ZMQ_CURVE_SECRETKEY, secret, "ZMQ_CURVE_SECRETKEY");
}

}  // namespace tandem::runtime
