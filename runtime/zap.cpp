#include "runtime/zap.h"

#include <spdlog/spdlog.h>
#include <zmq.h>

#include <charconv>
#include <fstream>
#include <sstream>
#include <vector>

namespace tandem::runtime {

namespace {

constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
constexpr size_t kZ85KeyChars = 40;
constexpr size_t kRawKeyBytes = 32;

bool is_key(const std::string& word) {
  uint8_t raw[kRawKeyBytes];
  return word.size() == kZ85KeyChars && zmq_z85_decode(raw, word.c_str()) != nullptr;
}

bool parse_int(std::string_view text, int32_t& out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

// `priority=LO..HI` into the credential; false when malformed.
bool parse_priority(const std::string& word, Credential& c) {
  constexpr std::string_view kPrefix = "priority=";
  if (word.rfind(kPrefix, 0) != 0) return false;
  const std::string_view range = std::string_view(word).substr(kPrefix.size());
  const size_t dots = range.find("..");
  if (dots == std::string_view::npos) return false;
  return parse_int(range.substr(0, dots), c.min_priority) && parse_int(range.substr(dots + 2), c.max_priority) &&
         c.min_priority <= c.max_priority;
}

}  // namespace

Result<AllowList> AllowList::load(const std::string& path, const std::string& flag, Of of) {
  std::ifstream f(path);
  if (!f) return Status::invalid(flag + ": cannot read " + path);
  AllowList list;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    // Words up to a comment: a word starting with '#' (Z85 keys may hold '#', never first).
    std::istringstream in(line);
    std::vector<std::string> words;
    for (std::string w; in >> w && w[0] != '#';) words.push_back(std::move(w));
    if (words.empty()) continue;
    TANDEM_RETURN_IF_ERROR(list.add_line(words, flag + ": " + path + " line " + std::to_string(n), of));
  }
  if (f.bad()) return Status::invalid(flag + ": error reading " + path);
  return list;
}

Status AllowList::add_line(const std::vector<std::string>& words, const std::string& where, Of of) {
  const bool clients = of == Of::kClients;
  if (clients && words[0] == "principal") {
    if (words.size() < 2) return Status::invalid(where + ": a principal line needs a name after `principal`");
    Credential c{words[1]};
    if (words.size() < 3 || !parse_priority(words[2], c))
      return Status::invalid(where + ": expected priority=LO..HI (integers, LO <= HI) after the principal's name");
    if (words.size() > 3) return Status::invalid(where + ": unexpected text after the principal's priority range");
    if (principals_.count(c.name)) return Status::invalid(where + ": the principal " + c.name + " is listed twice");
    principals_.emplace(c.name, std::move(c));
    return Status::ok();
  }
  if (!is_key(words[0]))
    return Status::invalid(where + ": the first word is not a Z85 public key (40 characters, as in NAME.pub)" +
                           (clients ? " nor `principal`" : ""));
  if (words.size() < 2) return Status::invalid(where + ": a key needs a name after it");
  Credential c{words[1]};
  bool ranged = false;
  for (size_t i = 2; i < words.size(); ++i) {
    if (clients && words[i] == "proxy" && !c.proxy) {
      c.proxy = true;
    } else if (words[i].rfind("priority=", 0) == 0 && !ranged) {
      if (!parse_priority(words[i], c))
        return Status::invalid(where + ": expected priority=LO..HI (integers, LO <= HI) after the name");
      ranged = true;
    } else {
      return Status::invalid(where + ": unexpected text after the name (a key takes priority=LO..HI" +
                             (clients ? " and proxy, once each)" : " once; proxy only in a client list)"));
    }
  }
  if (key_by_name_.count(c.name)) return Status::invalid(where + ": the name " + c.name + " is listed twice");
  if (by_key_.count(words[0])) return Status::invalid(where + ": this key is listed twice");
  key_by_name_.emplace(c.name, words[0]);
  by_key_.emplace(words[0], std::move(c));
  return Status::ok();
}

const Credential* AllowList::find_principal(const std::string& name) const {
  auto it = principals_.find(name);
  return it == principals_.end() ? nullptr : &it->second;
}

const Credential* AllowList::find_key(const std::string& z85) const {
  auto it = by_key_.find(z85);
  return it == by_key_.end() ? nullptr : &it->second;
}

const Credential* AllowList::find_name(const std::string& name) const {
  auto it = key_by_name_.find(name);
  return it == key_by_name_.end() ? nullptr : find_key(it->second);
}

Result<std::unique_ptr<ZapHandler>> ZapHandler::start(EventLoop& loop) {
  // The handler is created before its socket so that the socket's callback can reach it.
  std::unique_ptr<ZapHandler> handler(new ZapHandler(nullptr));
  ZapHandler* self = handler.get();
  auto socket = loop.bind(
      zmq::socket_type::rep, kZapEndpoint, [self](Frames& f) { self->on_request(f); }, CurveKeys{});
  if (!socket) return Status::error(socket.status().code(), "ZAP handler: " + socket.status().message());
  handler->socket_ = std::move(socket.value());
  return handler;
}

void ZapHandler::allow_listed(const std::string& domain, std::shared_ptr<const AllowList> list) {
  policies_[domain] = Policy{std::move(list)};
}

void ZapHandler::allow_any(const std::string& domain) { policies_[domain] = Policy{nullptr}; }

// RFC 27: request [version, request id, domain, address, routing id, mechanism, credentials...];
// reply [version, request id, status code, status text, user id, metadata].
void ZapHandler::on_request(Frames& frames) {
  if (frames.size() < 6) {  // not a ZAP request (libzmq sends none such); a REP socket must still answer
    Frames empty(1);
    (void)socket_->send(empty);
    return;
  }
  const std::string domain = frames[2].to_string(), address = frames[3].to_string();
  const std::string mechanism = frames[5].to_string();
  std::string key, user_id, why;
  if (mechanism == "CURVE" && frames.size() >= 7 && frames[6].size() == kRawKeyBytes) {
    char z85[kZ85KeyChars + 1];
    zmq_z85_encode(z85, static_cast<const uint8_t*>(frames[6].data()), kRawKeyBytes);
    key = z85;
  }
  auto policy = policies_.find(domain);
  if (key.empty()) {
    why = "not a CURVE peer";
  } else if (policy == policies_.end()) {
    why = "no policy for its ZAP domain";
  } else if (!policy->second.list) {
    user_id = key;
  } else if (const Credential* c = policy->second.list->find_key(key)) {
    user_id = c->name;
  } else {
    why = "its key is not on the allow-list";
  }
  const bool ok = why.empty();
  if (!ok) {
    ++refused_;
    // Bounded logging: a peer retrying every second must not fill the log.
    if (refused_ <= 10 || refused_ % 1000 == 0)
      spdlog::warn("zap: refused a peer from {} on domain '{}': {} ({} refused so far)", address, domain, why,
                   refused_);
  }
  Frames reply;
  reply.emplace_back("1.0", 3);
  reply.push_back(std::move(frames[1]));
  reply.emplace_back(ok ? "200" : "400", 3);
  const std::string text = ok ? "OK" : "not allowed";
  reply.emplace_back(text.data(), text.size());
  reply.emplace_back(user_id.data(), user_id.size());
  reply.emplace_back();
  if (SendResult st = socket_->send(reply); !st) spdlog::error("zap: reply failed: {}", st.message());
}

std::string sender_of(const zmq::message_t& frame) {
  const char* user = zmq_msg_gets(const_cast<zmq_msg_t*>(frame.handle()), "User-Id");
  return user ? user : "";
}

}  // namespace tandem::runtime
