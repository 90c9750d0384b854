#include "scheduler/actor.h"

#include <spdlog/spdlog.h>
#include <time.h>

#include <csignal>
#include <filesystem>
#include <optional>
#include <unordered_map>

#include "model/gguf.h"
#include "runtime/event_loop.h"
#include "runtime/wire.h"
#include "runtime/zap.h"
#include "scheduler/actor_wire.h"
#include "scheduler/client_outbox.h"
#include "scheduler/prompt_pool.h"
#include "scheduler/registration.h"
#include "scheduler/status_reply.h"

namespace tandem::scheduler {

namespace {

constexpr uint32_t kVersion = runtime::kProtocolVersion;
// Prompt jobs of tokenize queries carry this bit; the core numbers its own jobs below it.
constexpr uint64_t kQueryJob = uint64_t{1} << 63;
// A handler turn using more of the loop thread's CPU than this is a planning stall (StatusReply).
constexpr int64_t kPlanningStallUs = 1000;

int64_t thread_cpu_us() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1000000 + ts.tv_nsec / 1000;
}

// What two workers must agree on for KV to move between them: block size, storage
// format (bits, scheme and rotation seed or group, last layer, F32 window) and so bytes per block.
std::string kv_format(const v1::Register& reg) {
  const bool rotated = reg.kv_quant_scheme() == v1::KV_QUANT_SCHEME_ROTATED;
  std::string f = !reg.kv_bits() ? "f32"
                  : rotated      ? "rotated " + std::to_string(reg.kv_bits()) + "-bit (seed " +
                                  std::to_string(reg.kv_rotation_seed()) + ")"
                            : "q" + std::to_string(reg.kv_bits()) + "/g" + std::to_string(reg.kv_group_size());
  if (reg.kv_bits() && reg.kv_skip_last_layer()) f += "+f32-last";
  if (reg.kv_bits()) f += " with an F32 window of " + std::to_string(reg.kv_tail_blocks()) + " tail blocks";
  if (reg.kv_ring_blocks())
    f += ", windowed layers in rings of window " + std::to_string(reg.kv_ring_window()) + " (--kv-rings)";
  return f + ", " + std::to_string(reg.block_tokens()) + " tokens and " + std::to_string(reg.block_bytes()) +
         " bytes per block";
}

}  // namespace

class Actor final : public Sink {
 public:
  Actor(const ActorOptions& options, model::ModelConfig config, const PromptRenderer& renderer, std::string fingerprint,
        std::string model_name)
      : options_(options),
        renderer_(renderer),
        fingerprint_(std::move(fingerprint)),
        model_name_(std::move(model_name)),
        loop_(limits(options)),
        core_(core_config(options), config, renderer, *this),
        client_limits_(client_socket_limits(options, config)),
        outbox_(static_cast<uint32_t>(client_limits_.send_hwm), outbox_callbacks()) {
    registration_.max_worker_kv_bytes = options.max_worker_kv_bytes ? options.max_worker_kv_bytes : host_mem_total();
    registration_.min_kv_bytes_per_token = min_kv_bytes_per_token(config);
    if (options.prompt_threads > 0) {
      // Results come back through the loop, as any message does: the core is this thread's alone.
      pool_ = std::make_unique<PromptPool>(
          renderer, options.prompt_threads, [this](uint64_t job, Result<std::vector<int32_t>> ids) {
            runtime::asio::post(loop_.io(),
                                [this, job, ids = std::move(ids)]() mutable { on_prompt(job, std::move(ids)); });
          });
    }
  }

  // A plan's deadline is never shorter than the time a silent worker is given.
  static SchedulerConfig core_config(const ActorOptions& options) {
    SchedulerConfig c = options.core;
    c.step_deadline_floor_ms = options.heartbeat_ms * options.worker_liveness;
    return c;
  }

  // The send queue per peer is bounded: a client that stops reading is found out (ClientOutbox).
  static runtime::SocketLimits limits(const ActorOptions& options) {
    runtime::SocketLimits l;
    l.send_hwm = static_cast<int>(options.client_send_queue);
    return l;
  }

  // The client socket's: inbound messages of one frame, at most the largest Submit a client
  // may send under the admission limits, and no more than that over all the frames of one
  // message (max_multipart_bytes left at one frame's worth: ZeroMQ drops a peer whose message
  // of many small frames passes it); outbound, the queue bound that keeps a client's queued
  // replies within client_send_bytes.
  static runtime::SocketLimits client_socket_limits(const ActorOptions& options, const model::ModelConfig& config) {
    runtime::SocketLimits l = limits(options);
    AdmissionLimits admission;
    admission.context_length = config.context_length;
    l.max_message_bytes = static_cast<int64_t>(max_client_message_bytes(admission));
    l.max_message_parts = 2;  // the peer's identity and one frame
    l.send_hwm = static_cast<int>(send_hwm_for(options.client_send_bytes, options.client_send_queue));
    return l;
  }

  Status start() {
    TANDEM_RETURN_IF_ERROR(load_kv_endpoint_allow());
    TANDEM_RETURN_IF_ERROR(start_curve());
    auto clients = loop_.bind(
        zmq::socket_type::router, options_.client_endpoint,
        [this](runtime::Frames& f) { on_client(f, clients_->last_message_parts()); }, in_domain("client"),
        client_limits_);
    if (!clients) return clients.status();
    clients_ = std::move(clients.value());
    spdlog::info(
        "scheduler: client messages of at most {} bytes; replies queued to a client: {} messages of at most "
        "{} bytes",
        client_limits_.max_message_bytes, client_limits_.send_hwm, kReplyChunkBytes);
    auto workers = loop_.bind(
        zmq::socket_type::router, options_.worker_endpoint, [this](runtime::Frames& f) { on_worker(f); },
        in_domain("worker"));
    if (!workers) return workers.status();
    workers_ = std::move(workers.value());
    if (!options_.admin_endpoint.empty()) {
      if (options_.admin_endpoint.rfind("ipc://", 0) != 0)
        return Status::invalid("--admin-endpoint " + options_.admin_endpoint +
                               ": must be ipc:// (its folder's permissions decide who may drain)");
      auto admin = loop_.bind(
          zmq::socket_type::router, options_.admin_endpoint, [this](runtime::Frames& f) { on_admin(f); },
          in_domain("admin"));
      if (!admin) return admin.status();
      admin_ = std::move(admin.value());
    }
    liveness_ = loop_.every(std::chrono::milliseconds(options_.heartbeat_ms), [this] { check_liveness(); });
    deadlines_ = loop_.every(std::chrono::milliseconds(10), [this] {
      core_.tick(clock_us());
      flush();
      if (drain_deadline_us_ > 0) check_drain();
    });
    minute_ = loop_.every(std::chrono::seconds(1), [this] { last_minute_.sample(core_.stats()); });
    loop_.on_signal({SIGINT, SIGTERM, SIGQUIT}, [this](int sig) {
      if (sig != SIGQUIT && drain_deadline_us_ == 0) {
        spdlog::info("scheduler: signal {}: draining", sig);
        begin_drain(options_.drain_timeout_ms);
        return;
      }
      spdlog::info("scheduler: signal {}, shutting down", sig);
      stop_now();
    });
    loop_.on_signal({SIGHUP}, [this](int) { reload_allow_lists(); });
    spdlog::info("scheduler: clients on {}, workers on {}, model fingerprint {}", options_.client_endpoint,
                 options_.worker_endpoint, fingerprint_);
    return Status::ok();
  }

  void run() { loop_.run(); }

  // CurveZMQ: the server keys, and the ZAP handler with the allow-lists (before any bind: until
  // the handler exists libzmq lets every CURVE client in).
  Status start_curve() {
    if (options_.curve_keys_dir.empty()) {
      if (!options_.worker_keys.empty() || !options_.client_keys.empty())
        return Status::invalid("--worker-keys and --client-keys need --curve-keys: without CurveZMQ no key is checked");
      return Status::ok();
    }
    auto keys = runtime::load_curve_keys(options_.curve_keys_dir, /*need_secret=*/true);
    if (!keys) return keys.status();
    curve_ = *keys;
    auto zap = runtime::ZapHandler::start(loop_);
    if (!zap) return zap.status();
    zap_ = std::move(zap.value());
    zap_->allow_any("admin");  // ipc:// only: its folder's permissions decide
    TANDEM_RETURN_IF_ERROR(load_allow_lists());
    if (!worker_keys_)
      spdlog::warn("scheduler: CurveZMQ without --worker-keys: any holder of server.pub may register as a worker");
    return Status::ok();
  }

  // The server keys with a ZAP domain; disabled keys (plain sockets) without CurveZMQ.
  runtime::CurveKeys in_domain(const char* domain) const {
    runtime::CurveKeys keys = curve_;
    keys.zap_domain = domain;
    return keys;
  }

  // Reads both lists; only when both read well do they replace the ones in force.
  Status load_allow_lists() {
    std::shared_ptr<const runtime::AllowList> lists[2];
    const std::string* paths[2] = {&options_.worker_keys, &options_.client_keys};
    const char* flags[2] = {"--worker-keys", "--client-keys"};
    const runtime::AllowList::Of of[2] = {runtime::AllowList::Of::kWorkers, runtime::AllowList::Of::kClients};
    for (int i = 0; i < 2; ++i) {
      if (paths[i]->empty()) continue;
      auto list = runtime::AllowList::load(*paths[i], flags[i], of[i]);
      if (!list) return list.status();
      lists[i] = std::make_shared<const runtime::AllowList>(std::move(list.value()));
    }
    worker_keys_ = std::move(lists[0]);
    client_keys_ = std::move(lists[1]);
    for (auto [domain, list] : {std::pair{"worker", &worker_keys_}, std::pair{"client", &client_keys_}}) {
      if (*list)
        zap_->allow_listed(domain, *list);
      else
        zap_->allow_any(domain);
    }
    spdlog::info("scheduler: allow-lists: {} worker keys, {} client keys, {} principal ranges", describe(worker_keys_),
                 describe(client_keys_), client_keys_ ? client_keys_->principals() : 0);
    return Status::ok();
  }

  static std::string describe(const std::shared_ptr<const runtime::AllowList>& list) {
    return list ? std::to_string(list->size()) : "any";
  }

  // --kv-endpoint-allow and the entries of --kv-endpoint-allow-file. A file that cannot be read
  // leaves the list in force.
  Status load_kv_endpoint_allow() {
    std::vector<std::string> allow = options_.kv_endpoint_allow;
    if (!options_.kv_endpoint_allow_file.empty()) {
      auto listed = read_allow_file(options_.kv_endpoint_allow_file);
      if (!listed) return listed.status();
      allow.insert(allow.end(), listed->begin(), listed->end());
      spdlog::info("scheduler: kv_endpoint allow-list: {} entries", allow.size());
    }
    registration_.kv_endpoint_allow = std::move(allow);
    return Status::ok();
  }

  // SIGHUP: the kv_endpoint allow-list and the key allow-lists. A bad file keeps its list in
  // force. Workers whose key is gone, or whose kv_endpoint is no longer allowed, are fenced as
  // dead ones are (their sequences go elsewhere); connections of removed clients stay, their
  // new requests are refused.
  void reload_allow_lists() {
    std::vector<std::pair<std::string, const char*>> fenced;  // identity, why
    if (Status st = load_kv_endpoint_allow(); !st) {
      spdlog::error("scheduler: SIGHUP: {}; the kv_endpoint allow-list in force stays", st.message());
    } else {
      for (const auto& [identity, peer] : worker_by_identity_)
        if (!peer.kv_endpoint.empty() &&
            check_kv_endpoint(peer.kv_endpoint, peer.from, registration_.kv_endpoint_allow))
          fenced.emplace_back(identity, "its kv_endpoint is no longer allowed");
    }
    if (!zap_) {
      spdlog::info("scheduler: SIGHUP: no key allow-lists without --curve-keys");
    } else if (Status st = load_allow_lists(); !st) {
      spdlog::error("scheduler: SIGHUP: {}; the allow-lists in force stay", st.message());
    } else if (worker_keys_) {
      for (const auto& [identity, peer] : worker_by_identity_)
        if (!worker_keys_->find_name(peer.credential))
          fenced.emplace_back(identity, "its key left the worker allow-list");
    }
    const int64_t now = clock_us();
    for (const auto& [identity, why] : fenced) {
      auto it = worker_by_identity_.find(identity);
      if (it == worker_by_identity_.end()) continue;  // fenced for both reasons
      spdlog::warn("scheduler: worker {} (pid {}) fenced: {}", it->second.id, it->second.pid, why);
      forget_worker(identity, now);
    }
    core_.tick(now);
    flush();
  }

  // With --client-keys: the Submit's sender must still be listed, a principal only sent by a
  // `proxy` key, and the priority in the key's range and in its principal's (a `principal`
  // line). Without the list anyone may name a principal: it is a label. Empty: admitted; else
  // the refusal's message (naming the range, never another key).
  std::pair<v1::ErrorCode, std::string> check_credential(const zmq::message_t& frame, const v1::Submit& s) const {
    if (!client_keys_) return {v1::ERROR_CODE_UNSPECIFIED, {}};
    const runtime::Credential* c = client_keys_->find_name(runtime::sender_of(frame));
    if (!c)
      return {v1::ERROR_CODE_PERMISSION_DENIED, "this client's key is no longer on the scheduler's client allow-list"};
    if (!s.principal().empty() && !c->proxy)
      return {v1::ERROR_CODE_PERMISSION_DENIED,
              "principal: only a proxy may send requests for a principal, and this client's key is not listed with "
              "`proxy` in the scheduler's --client-keys"};
    const auto outside = [&](const runtime::Credential& range, const std::string& whose) {
      if (s.priority() >= range.min_priority && s.priority() <= range.max_priority) return std::string();
      return "priority " + std::to_string(s.priority()) + " is outside the range " + whose +
             " allows: " + std::to_string(range.min_priority) + ".." + std::to_string(range.max_priority);
    };
    std::string why = outside(*c, "this client's key");
    if (const runtime::Credential* p = s.principal().empty() ? nullptr : client_keys_->find_principal(s.principal());
        p && why.empty())
      why = outside(*p, "principal '" + s.principal() + "'");
    return {why.empty() ? v1::ERROR_CODE_UNSPECIFIED : v1::ERROR_CODE_INVALID_ARGUMENT, why};
  }

  // ActorHarness: the handlers the sockets call, fed directly, and the loop's clock and context.
  void feed_client(runtime::Frames& frames) { on_client(frames, frames.size()); }
  void liveness_now() { check_liveness(); }
  void pass_time(int64_t us) { skew_us_ += us; }
  zmq::context_t& context() { return loop_.zmq(); }
  void feed_worker(runtime::Frames& frames) { on_worker(frames); }
  void tick_now() {
    core_.tick(clock_us());
    flush();
  }

  // Sink
  void send_plan(uint32_t worker_id, const StepPlan& plan) override {
    auto it = worker_identity_.find(worker_id);
    if (it == worker_identity_.end()) return;
    command_.Clear();
    command_.set_version(kVersion);
    to_proto(plan, *command_.mutable_plan());
    command_.mutable_plan()->set_epoch(worker_id);  // a worker's epoch is its registration's id
    send(*workers_, it->second, command_);
  }

  void send_command(uint32_t worker_id, const Command& command) override {
    auto it = worker_identity_.find(worker_id);
    if (it == worker_identity_.end()) return;
    command_.Clear();
    to_proto(command, command_);
    command_.set_version(kVersion);
    if (command_.has_kv_expect()) command_.mutable_kv_expect()->set_epoch(worker_id);
    if (command_.has_kv_send()) command_.mutable_kv_send()->set_epoch(worker_id);
    send(*workers_, it->second, command_);
  }

  bool renders_async() const override { return pool_ != nullptr; }
  void render_async(uint64_t job, PromptInput input) override { pool_->post(job, std::move(input)); }
  void cancel_render(uint64_t job) override { (void)pool_->cancel(job); }

  // Events are coalesced per client and sent when the current turn of the loop ends
  // (flush()): one message per client per step, not one per token.
  void send_events(const std::string& client, const RequestEvents& events) override {
    if (events.final && spdlog::should_log(spdlog::level::debug)) {
      const FinalEvent& f = *events.final;
      spdlog::debug(
          "scheduler: request {} finished: {} {} prompt {} completion {} queue {:.1f} ms ttft {:.1f} ms total {:.1f} "
          "ms principal {}",
          events.request_id, v1::FinishReason_Name(f.finish_reason), f.error_message, f.prompt_tokens,
          f.completion_tokens, f.queue_ms, f.ttft_ms, f.total_ms, f.principal.empty() ? "-" : f.principal);
    }
    events_wire_.Clear();
    to_proto(events, events_wire_);
    outbox_.add(client, events_wire_);
  }

  // The loop's clock: steady time, moved on by the fuzz harness (pass_time) only.
  int64_t clock_us() const { return runtime::now_us() + skew_us_; }

  void flush() {
    outbox_.flush(clock_us());
    outbox_.trim(client_seen_.size());
  }

 private:
  struct WorkerPeer {
    uint32_t id;
    Role role;
    uint32_t pid;
    int64_t last_seen_us;
    std::string kv_format;
    uint64_t weight_bytes, kv_bytes;
    std::string credential;   // its key's name on the worker allow-list; empty without one
    std::string kv_endpoint;  // as registered, and where from: checked again when the allow-list changes
    RegisteringPeer from;
  };

  ClientOutbox::Callbacks outbox_callbacks() {
    ClientOutbox::Callbacks c;
    c.send = [this](const std::string& client, const v1::SchedulerReply& reply) {
      return try_send(*clients_, client, reply);
    };
    // Its requests are cancelled: memory stays bounded, the workers' time goes to others.
    c.stopped_reading = [this](const std::string& client) {
      spdlog::warn("scheduler: a client stopped reading ({} messages queued to it): cancelling its {} requests",
                   client_limits_.send_hwm, core_.live_requests(client));
      core_.client_gone(client, clock_us(),
                        "the client stopped reading its events (" + std::to_string(client_limits_.send_hwm) +
                            " messages, up to " + std::to_string(options_.client_send_bytes) + " bytes, queued)");
    };
    c.known = [this](const std::string& client) { return client_seen_.count(client) > 0; };
    return c;
  }

  void send(runtime::Socket& socket, const std::string& identity, const google::protobuf::MessageLite& m) {
    if (runtime::SendResult st = try_send(socket, identity, m); !st)
      spdlog::warn("scheduler: send to a peer failed: {}", st.message());
  }

  runtime::SendResult try_send(runtime::Socket& socket, const std::string& identity,
                               const google::protobuf::MessageLite& m) {
    runtime::Frames frames;
    frames.emplace_back(identity.data(), identity.size());
    frames.push_back(runtime::to_frame(m));
    return socket.send(frames);
  }

  void protocol_error(runtime::Socket& socket, const std::string& identity, v1::ErrorCode code,
                      const std::string& message) {
    reply_.Clear();
    reply_.set_version(kVersion);
    reply_.mutable_error()->set_code(code);
    reply_.mutable_error()->set_message(message);
    send(socket, identity, reply_);
  }

  // `parts`: the message's frames, the identity and those the socket dropped included.
  void on_client(runtime::Frames& frames, size_t parts) {
    const int64_t cpu0 = thread_cpu_us();
    const int64_t now = clock_us();
    if (parts != 2 || frames.size() != 2) {
      if (!frames.empty())
        protocol_error(*clients_, frames[0].to_string(), v1::ERROR_CODE_INVALID_ARGUMENT,
                       "expected one frame per message, got " + std::to_string(std::max(parts, frames.size()) - 1));
      return;
    }
    const std::string identity = frames[0].to_string();
    // Each client identity costs the scheduler state until it has been silent for the client
    // timeout: past max_clients a new one is turned away, and the known ones keep being served.
    if (options_.max_clients && client_seen_.size() >= options_.max_clients && !client_seen_.count(identity)) {
      protocol_error(*clients_, identity, v1::ERROR_CODE_OVERLOADED,
                     "the scheduler serves " + std::to_string(options_.max_clients) + " clients at most; retry later");
      return;
    }
    client_seen_[identity] = now;
    if (Status st = runtime::parse_frame(frames[1], client_msg_); !st) {
      protocol_error(*clients_, identity, v1::ERROR_CODE_INVALID_ARGUMENT, st.message());
      return;
    }
    if (!runtime::protocol_version_served(client_msg_.version())) {
      protocol_error(*clients_, identity, v1::ERROR_CODE_INVALID_ARGUMENT,
                     "protocol version " + std::to_string(client_msg_.version()) +
                         " is not supported (this scheduler speaks " + std::to_string(kVersion) + ")");
      return;
    }
    switch (client_msg_.body_case()) {
      case v1::ClientMessage::kSubmit:
        if (drain_deadline_us_ > 0) {
          refuse_while_draining(identity, client_msg_.submit().request_id());
          break;
        }
        if (spdlog::should_log(spdlog::level::debug)) {
          const v1::Submit& s = client_msg_.submit();
          spdlog::debug(
              "scheduler: submit {} (principal {}): {} prompt {}, max_tokens {}, temperature {}, top_k {}, top_p {}, "
              "seed {}, stops {}+{}, stream {}, priority {}, timeout {} ms",
              s.request_id(),
              s.principal().empty()            ? "-"
              : check_principal(s.principal()) ? s.principal()
                                               : "(invalid)",
              s.has_chat()   ? "messages"
              : s.has_text() ? "text"
                             : "tokens",
              s.has_chat()   ? static_cast<size_t>(s.chat().messages_size())
              : s.has_text() ? s.text().size()
                             : static_cast<size_t>(s.tokens().ids_size()),
              s.max_tokens(), s.sampling().temperature(), s.sampling().top_k(), s.sampling().top_p(),
              s.sampling().seed(), s.stop_token_sequences_size(), s.stop_strings_size(), s.stream(), s.priority(),
              s.timeout_ms());
        }
        if (outbox_.refuse_submit_if_stalled(identity, client_msg_.submit().request_id())) {
          core_.count_refusal(v1::ERROR_CODE_OVERLOADED);
          break;
        }
        if (auto [code, why] = check_credential(frames[1], client_msg_.submit()); !why.empty()) {
          core_.count_refusal(code);
          RequestEvents ev;
          send_events(identity, set_refusal(ev, client_msg_.submit().request_id(), code, why));
          break;
        }
        core_.submit(identity, client_msg_.submit(), now);
        break;
      case v1::ClientMessage::kCancel: core_.cancel(identity, client_msg_.cancel().request_id(), now); break;
      case v1::ClientMessage::kHeartbeat: break;
      case v1::ClientMessage::kStatus: send_status(*clients_, identity, client_msg_.status().query_id()); break;
      case v1::ClientMessage::kTokenize: on_tokenize(identity, client_msg_.tokenize()); break;
      case v1::ClientMessage::kMetrics: send_metrics(*clients_, identity, client_msg_.metrics().query_id()); break;
      case v1::ClientMessage::kDrain:
        protocol_error(*clients_, identity, v1::ERROR_CODE_PERMISSION_DENIED,
                       "Drain is not taken on the client endpoint: send it to the scheduler's admin endpoint "
                       "(tandem up: ipc://RUNTIME_DIR/admin.sock)");
        return;
      default: protocol_error(*clients_, identity, v1::ERROR_CODE_INVALID_ARGUMENT, "empty client message"); return;
    }
    core_.tick(now);
    flush();
    account_turn(cpu0);
  }

  // A prompt's ids from the pool: a request's (the core's job) or a tokenize query's.
  void on_prompt(uint64_t job, Result<std::vector<int32_t>> ids) {
    const int64_t cpu0 = thread_cpu_us();
    const int64_t now = clock_us();
    if (job & kQueryJob) {
      auto it = queries_.find(job);
      if (it == queries_.end()) return;
      const TokenizeWaiter waiter = std::move(it->second);
      queries_.erase(it);
      send_tokenized(waiter, ids);
      account_turn(cpu0);
      return;
    }
    core_.on_prompt(job, std::move(ids), now);
    core_.tick(now);
    flush();
    account_turn(cpu0);
  }

  // Tokenize queries: made into ids as a Submit's prompt is (on the pool when there is one),
  // at most max_queue at a time.
  void on_tokenize(const std::string& identity, const v1::TokenizeQuery& q) {
    TokenizeWaiter waiter{identity, q.query_id(), q.count_only()};
    auto in =
        prompt_input(q.text(), q.has_chat() ? &q.chat() : nullptr, q.no_bos(), AdmissionLimits{}.max_prompt_bytes);
    if (!in) return send_tokenized(waiter, in.status());
    if (!pool_) return send_tokenized(waiter, renderer_.render(*in));
    if (queries_.size() >= options_.core.max_queue) {
      return send_tokenized(waiter, Status::error(Code::kOverloaded, "too many tokenize queries in progress (" +
                                                                         std::to_string(queries_.size()) + ")"));
    }
    const uint64_t job = kQueryJob | next_query_job_++;
    queries_.emplace(job, std::move(waiter));
    pool_->post(job, std::move(in.value()));
  }

  struct TokenizeWaiter {
    std::string identity;
    uint64_t query_id;
    bool count_only;
  };

  void send_tokenized(const TokenizeWaiter& waiter, const Result<std::vector<int32_t>>& ids) {
    reply_.Clear();
    reply_.set_version(kVersion);
    v1::TokenizeReply* r = reply_.mutable_tokenized();
    r->set_query_id(waiter.query_id);
    if (ids) {
      r->set_count(static_cast<uint32_t>(ids->size()));
      if (!waiter.count_only) r->mutable_ids()->Add(ids->begin(), ids->end());
    } else {
      r->set_error_code(ids.status().code() == Code::kOverloaded ? v1::ERROR_CODE_OVERLOADED
                                                                 : v1::ERROR_CODE_INVALID_ARGUMENT);
      r->set_error_message(ids.status().message());
    }
    send_query_reply(*clients_, waiter.identity);
  }

  // Sends reply_ (a query's) in messages of at most kReplyChunkBytes, as events are: what a
  // client's socket queues stays within its byte budget (queue bound x kReplyChunkBytes). A
  // tokenize reply larger than the whole budget is refused instead (OVERLOADED, naming it). A
  // client whose queue is full is not reading: the rest of the reply is dropped (its query
  // times out on its side) and its requests' events find the queue full too (ClientOutbox).
  void send_query_reply(runtime::Socket& socket, const std::string& identity) {
    split_query_reply(reply_, kReplyChunkBytes, reply_parts_);
    const size_t queue_bound = static_cast<size_t>(client_limits_.send_hwm);
    if (&socket == clients_.get() && reply_parts_.size() > queue_bound && reply_.has_tokenized()) {
      v1::TokenizeReply* r = reply_.mutable_tokenized();
      r->clear_ids();
      r->set_error_code(v1::ERROR_CODE_OVERLOADED);
      r->set_error_message("the reply (" + std::to_string(reply_parts_.size()) + " messages of up to " +
                           std::to_string(kReplyChunkBytes) + " bytes) is larger than this client's send budget (" +
                           std::to_string(queue_bound) + " messages, --client-send-bytes " +
                           std::to_string(options_.client_send_bytes) + "): ask for the count only");
      split_query_reply(reply_, kReplyChunkBytes, reply_parts_);
    }
    for (const v1::SchedulerReply& part : reply_parts_) {
      if (runtime::SendResult st = try_send(socket, identity, part); !st) {
        spdlog::debug("scheduler: a query reply to a client was dropped: {}", st.message());
        return;
      }
    }
  }

  // A handler's thread CPU time since `cpu0`, counted as a planning stall past 1 ms.
  void account_turn(int64_t cpu0) {
    const int64_t used = thread_cpu_us() - cpu0;
    cpu_us_ += used;
    planning_stalls_ += used > kPlanningStallUs;
  }

  // The admin endpoint: Drain, StatusQuery and Heartbeat; nothing that submits or cancels.
  void on_admin(runtime::Frames& frames) {
    if (frames.size() != 2) return;
    const std::string identity = frames[0].to_string();
    if (Status st = runtime::parse_frame(frames[1], client_msg_); !st) {
      protocol_error(*admin_, identity, v1::ERROR_CODE_INVALID_ARGUMENT, st.message());
      return;
    }
    switch (client_msg_.body_case()) {
      case v1::ClientMessage::kStatus: send_status(*admin_, identity, client_msg_.status().query_id()); return;
      case v1::ClientMessage::kMetrics: send_metrics(*admin_, identity, client_msg_.metrics().query_id()); return;
      case v1::ClientMessage::kHeartbeat: return;
      case v1::ClientMessage::kDrain:
        if (drain_deadline_us_ == 0) {
          const uint32_t t = client_msg_.drain().timeout_ms();
          spdlog::info("scheduler: drain requested on the admin endpoint");
          begin_drain(t ? t : options_.drain_timeout_ms);
        }
        send_status(*admin_, identity, 0);
        return;
      default:
        protocol_error(*admin_, identity, v1::ERROR_CODE_INVALID_ARGUMENT,
                       "the admin endpoint takes Drain, StatusQuery, MetricsQuery and Heartbeat; requests go to the "
                       "client endpoint");
    }
  }

  void on_worker(runtime::Frames& frames) {
    const int64_t cpu0 = thread_cpu_us();
    const int64_t now = clock_us();
    if (frames.size() != 2) return;
    const std::string identity = frames[0].to_string();
    if (Status st = runtime::parse_frame(frames[1], worker_msg_); !st) {
      spdlog::warn("scheduler: dropped a malformed worker message: {}", st.message());
      return;
    }
    if (!runtime::protocol_version_served(worker_msg_.version())) {
      refuse(identity, v1::REFUSAL_REASON_VERSION,
             "protocol version " + std::to_string(worker_msg_.version()) + " is not supported (this scheduler speaks " +
                 std::to_string(kVersion) + ")");
      return;
    }
    if (worker_msg_.has_register_()) {
      on_register(identity, worker_msg_.register_(), registering_peer(frames[1]), runtime::sender_of(frames[1]), now);
    } else {
      auto it = worker_by_identity_.find(identity);
      if (it == worker_by_identity_.end()) {
        // Unknown (e.g. declared dead earlier): tell it to register again.
        refuse(identity, v1::REFUSAL_REASON_UNKNOWN_WORKER, "unknown worker: register first");
        return;
      }
      WorkerPeer& peer = it->second;
      peer.last_seen_us = now;
      // Fencing: a result or an ack of an earlier registration of this peer (it was declared
      // dead, e.g. stopped, and came back) must not touch what was re-placed meanwhile.
      if (worker_msg_.has_result() && worker_msg_.result().epoch() == peer.id) {
        from_proto(worker_msg_.result(), result_);
        core_.on_result(peer.id, result_, now);
      }
      if (worker_msg_.has_kv_received() && worker_msg_.kv_received().epoch() == peer.id) {
        from_proto(worker_msg_.kv_received(), ack_);
        core_.on_kv_received(peer.id, ack_, now);
      }
    }
    core_.tick(now);
    flush();
    account_turn(cpu0);
  }

  void refuse(const std::string& identity, v1::RefusalReason reason, const std::string& message) {
    command_.Clear();
    command_.set_version(kVersion);
    v1::RegisterReply* r = command_.mutable_register_reply();
    r->set_accepted(false);
    r->set_error_code(v1::ERROR_CODE_INVALID_ARGUMENT);
    r->set_error_message(message);
    r->set_reason(reason);
    send(*workers_, identity, command_);
  }

  // Over ipc:// (inproc:// in the harness) the peer is on this host; over tcp:// ZeroMQ gives
  // its address as the message's Peer-Address.
  RegisteringPeer registering_peer(zmq::message_t& frame) const {
    RegisteringPeer peer;
    const std::string& ep = options_.worker_endpoint;
    peer.local = ep.rfind("ipc://", 0) == 0 || ep.rfind("inproc://", 0) == 0;
    if (!peer.local)
      if (const char* address = zmq_msg_gets(frame.handle(), "Peer-Address")) peer.address = address;
    return peer;
  }

  // The checks of registration.h: a KV pool a worker could hold, a kv_endpoint of its own.
  std::optional<Refusal> check_kv(const std::string& name, const v1::Register& reg, const RegisteringPeer& peer) {
    std::optional<Refusal> refusal = check_kv_scheme(reg);
    if (!refusal) refusal = check_kv_pool(reg, registration_);
    if (!refusal && !reg.kv_endpoint().empty())
      refusal = check_kv_endpoint(reg.kv_endpoint(), peer, registration_.kv_endpoint_allow);
    if (refusal)
      spdlog::warn(
          "scheduler: refused worker {} (pid {}) registering from {}: {} ({} blocks of {} bytes, kv_endpoint {})", name,
          reg.pid(), peer.local ? "this host" : peer.address, refusal->message, reg.kv_blocks(), reg.block_bytes(),
          reg.kv_endpoint());
    return refusal;
  }

  // `credential`: the name its key has on the worker allow-list (ZAP's User-Id).
  void on_register(const std::string& identity, const v1::Register& reg, const RegisteringPeer& peer,
                   const std::string& credential, int64_t now) {
    // The handshake checked the key; a key removed since (SIGHUP) must not come back on the same
    // connection.
    if (worker_keys_ && !worker_keys_->find_name(credential)) {
      spdlog::warn("scheduler: refused worker {} (pid {}): its key is no longer on the worker allow-list", reg.name(),
                   reg.pid());
      refuse(identity, v1::REFUSAL_REASON_CREDENTIAL, "this worker's key is not on the scheduler's worker allow-list");
      return;
    }
    if (reg.model_fingerprint() != fingerprint_) {
      spdlog::warn("scheduler: refused worker {} (pid {}): model fingerprint {} differs from ours {}", reg.name(),
                   reg.pid(), reg.model_fingerprint(), fingerprint_);
      // The refusal names neither fingerprint: the scheduler's would tell any peer what to claim.
      refuse(identity, v1::REFUSAL_REASON_MODEL_FINGERPRINT,
             "the model fingerprint differs from the scheduler's: worker and scheduler must load the same model file");
      return;
    }
    const std::optional<Role> role = runtime::role_from_proto(reg.role());
    if (!role) {
      refuse(identity, v1::REFUSAL_REASON_ROLE,
             "worker role " + std::to_string(reg.role()) + " is not one of both, prefill, decode");
      return;
    }
    if (*role == Role::kDecode && reg.kv_endpoint().empty()) {
      refuse(identity, v1::REFUSAL_REASON_KV_ENDPOINT,
             "a decode worker must give the kv_endpoint prefill workers send KV to");
      return;
    }
    // KV moves between prefill and decode workers as raw blocks: they must agree on the format.
    if (*role != Role::kBoth) {
      for (const auto& [other_identity, peer] : worker_by_identity_) {
        if (peer.role == Role::kBoth || other_identity == identity || peer.kv_format == kv_format(reg)) continue;
        spdlog::warn("scheduler: refused worker {}: KV format {} differs from worker {}'s {}", reg.name(),
                     kv_format(reg), peer.id, peer.kv_format);
        refuse(identity, v1::REFUSAL_REASON_KV_FORMAT,
               "KV format " + kv_format(reg) + " differs from registered worker " + std::to_string(peer.id) + "'s " +
                   peer.kv_format + ": prefill and decode workers must store KV alike");
        return;
      }
    }
    if (auto refusal = check_kv(reg.name(), reg, peer)) {
      refuse(identity, refusal->reason, refusal->message);
      return;
    }
    if (auto old = worker_by_identity_.find(identity); old != worker_by_identity_.end()) {
      forget_worker(identity, now);  // re-registration: its old state is gone
    }
    const uint32_t id = next_worker_id_++;
    worker_by_identity_[identity] =
        WorkerPeer{id,
                   *role,
                   reg.pid(),
                   now,
                   kv_format(reg),
                   reg.weight_bytes(),
                   uint64_t{reg.kv_blocks()} * (reg.block_bytes() + reg.draft_block_bytes()) +
                       uint64_t{reg.kv_ring_blocks()} * reg.kv_ring_block_bytes(),
                   credential,
                   reg.kv_endpoint(),
                   peer};
    worker_identity_[id] = identity;
    core_.add_worker(
        id,
        WorkerInfo{*role, reg.kv_blocks(), reg.block_tokens(), reg.kv_endpoint(), reg.kv_tail_blocks(),
                   reg.kv_public_key(), reg.kv_sender_public_key(),
                   std::min(reg.spec_tokens(), WorkerInfo::kMaxSpecTokens), reg.state_slots(), reg.kv_ring_blocks(),
                   reg.kv_ring_window(), reg.state_checkpoints(), reg.checkpoint_interval()},
        now);
    command_.Clear();
    command_.set_version(kVersion);
    v1::RegisterReply* r = command_.mutable_register_reply();
    r->set_accepted(true);
    r->set_worker_id(id);
    r->set_epoch(id);
    r->set_heartbeat_ms(options_.heartbeat_ms);
    send(*workers_, identity, command_);
    spdlog::info(
        "scheduler: worker {} registered: {} (pid {}), role {}, {} KV blocks of {} tokens, {} threads, {} drafts per "
        "round",
        id, reg.name(), reg.pid(), role_name(*role), reg.kv_blocks(), reg.block_tokens(), reg.threads(),
        std::min(reg.spec_tokens(), WorkerInfo::kMaxSpecTokens));
  }

  void check_liveness() {
    const int64_t now = clock_us();
    const int64_t period_us = int64_t{options_.heartbeat_ms} * 1000;
    const int64_t worker_timeout = period_us * options_.worker_liveness;
    // A tick that comes more than a period late means this process itself was held up (an
    // overloaded host, a stop): whatever peers sent meanwhile is still unread, so that time
    // is not counted against them.
    if (last_liveness_us_ > 0 && now - last_liveness_us_ > 2 * period_us) {
      const int64_t held = now - last_liveness_us_ - period_us;
      for (auto& [identity, peer] : worker_by_identity_) peer.last_seen_us += held;
      for (auto& [identity, seen] : client_seen_) seen += held;
      core_.postpone_step_deadlines(held);
      spdlog::warn("scheduler: held up for {} ms; not counted against silent workers and clients", held / 1000);
    }
    last_liveness_us_ = now;
    std::vector<std::string> dead;
    for (auto& [identity, peer] : worker_by_identity_)
      if (now - peer.last_seen_us > worker_timeout) dead.push_back(identity);
    for (const std::string& identity : dead) {
      const WorkerPeer& peer = worker_by_identity_[identity];
      spdlog::warn("scheduler: worker {} (pid {}) silent for {} ms: declared dead", peer.id, peer.pid,
                   (now - peer.last_seen_us) / 1000);
      forget_worker(identity, now);
    }
    // A worker that heartbeats but sits on a plan (it lost it, its handler threw, it is not a
    // worker) is fenced as a dead one: its sequences move, its next message is refused as
    // UNKNOWN_WORKER and a real worker registers again with a clean state.
    while (const std::optional<Core::Overdue> late = core_.overdue_worker(now)) {
      const std::string identity = worker_identity_[late->worker_id];
      spdlog::warn(
          "scheduler: worker {} (pid {}) fenced: step {} ({} tokens) unanswered for {} ms, past its deadline of {} ms",
          late->worker_id, worker_by_identity_[identity].pid, late->step_id, late->tokens, late->waited_us / 1000,
          late->deadline_us / 1000);
      forget_worker(identity, now);
    }
    std::vector<std::string> gone;
    for (auto& [identity, seen] : client_seen_) {
      if (now - seen <= int64_t{options_.client_timeout_ms} * 1000) continue;
      gone.push_back(identity);
    }
    for (const std::string& identity : gone) {
      if (core_.live_requests(identity) > 0) {
        spdlog::info("scheduler: a client went silent; cancelling its {} requests", core_.live_requests(identity));
        core_.client_gone(identity, now);
      }
      client_seen_.erase(identity);
    }
    core_.tick(now);
    flush();
  }

  // The dead-worker path (a silent worker, a fenced one): its sequences fail over (or end with
  // UNAVAILABLE when no worker is left) and the scheduler no longer knows its identity.
  void forget_worker(const std::string& identity, int64_t now) {
    const uint32_t id = worker_by_identity_[identity].id;
    core_.remove_worker(id, now);
    worker_identity_.erase(id);
    worker_by_identity_.erase(identity);
  }

  // `query_id`: the StatusQuery's, echoed so the client can match the reply to its query.
  void send_status(runtime::Socket& socket, const std::string& identity, uint64_t query_id) {
    reply_.Clear();
    reply_.set_version(kVersion);
    ActorStatus actor;
    actor.query_id = query_id;
    actor.now_us = clock_us();
    actor.scheduler_cpu_us = cpu_us_;
    actor.planning_stalls = planning_stalls_;
    actor.draining = drain_deadline_us_ > 0;
    actor.minute_ago = last_minute_.oldest(core_.stats());
    actor.peer = [this](uint32_t worker_id) -> std::optional<WorkerPeerInfo> {
      auto it = worker_identity_.find(worker_id);
      if (it == worker_identity_.end()) return std::nullopt;
      const WorkerPeer& peer = worker_by_identity_[it->second];
      return WorkerPeerInfo{peer.pid, peer.last_seen_us, peer.weight_bytes, peer.kv_bytes};
    };
    fill_status_reply(core_, actor, *reply_.mutable_status());
    send_query_reply(socket, identity);
  }

  // The MetricsReply: a few KiB (about 0.3 KiB more per worker), sent as the StatusReply is
  // (one part below 16 KiB, counted in the client's byte budget).
  void send_metrics(runtime::Socket& socket, const std::string& identity, uint64_t query_id) {
    reply_.Clear();
    reply_.set_version(kVersion);
    fill_metrics_reply(core_, model_name_, query_id, *reply_.mutable_metrics());
    send_query_reply(socket, identity);
  }

  // Draining: no new admissions; what runs gets until the deadline, then is cancelled.
  void begin_drain(uint32_t timeout_ms) {
    drain_deadline_us_ = clock_us() + int64_t{timeout_ms} * 1000 + 1;
    spdlog::info("scheduler: draining: {} queued, {} running, {} ms to finish", core_.queued(), core_.running(),
                 timeout_ms);
  }

  void check_drain() {
    const int64_t now = clock_us();
    if (!core_.idle() && now >= drain_deadline_us_) {
      spdlog::warn("scheduler: drain timeout: cancelling {} queued and {} running requests", core_.queued(),
                   core_.running());
      core_.cancel_all("the scheduler is draining and its drain timeout passed", now);
      core_.tick(now);
      flush();
    }
    if (core_.idle()) {
      spdlog::info("scheduler: drained");
      stop_now();
    }
  }

  void refuse_while_draining(const std::string& identity, const std::string& request_id) {
    core_.count_refusal(v1::ERROR_CODE_UNAVAILABLE);
    RequestEvents ev;
    send_events(identity, set_refusal(ev, request_id, v1::ERROR_CODE_UNAVAILABLE,
                                      "the scheduler is draining: it admits no new requests"));
  }

  void stop_now() {
    flush();
    shutdown_workers();
    loop_.stop();
  }

  void shutdown_workers() {
    command_.Clear();
    command_.set_version(kVersion);
    command_.mutable_shutdown()->set_drain(false);
    for (auto& [identity, peer] : worker_by_identity_) send(*workers_, identity, command_);
  }

  ActorOptions options_;
  PromptRenderer renderer_;
  std::string fingerprint_;
  std::string model_name_;  // metrics' model_name label: general.name, else the file's stem
  RegistrationLimits registration_;
  runtime::EventLoop loop_;
  Core core_;
  runtime::SocketLimits client_limits_;
  runtime::CurveKeys curve_;                  // disabled without --curve-keys
  std::unique_ptr<runtime::ZapHandler> zap_;  // with --curve-keys; before the sockets it checks
  std::shared_ptr<const runtime::AllowList> worker_keys_, client_keys_;  // null: any key
  std::unique_ptr<runtime::Socket> clients_, workers_, admin_;           // admin_: null without --admin-endpoint
  std::unique_ptr<runtime::EventLoop::Timer> liveness_, deadlines_, minute_;
  ClientOutbox outbox_;
  LastMinute last_minute_;
  int64_t drain_deadline_us_ = 0;  // > 0: draining
  int64_t last_liveness_us_ = 0;   // when check_liveness last ran
  int64_t skew_us_ = 0;            // ActorHarness::pass_time
  std::unordered_map<std::string, WorkerPeer> worker_by_identity_;
  std::unordered_map<uint32_t, std::string> worker_identity_;
  std::unordered_map<std::string, int64_t> client_seen_;
  uint32_t next_worker_id_ = 1;
  int64_t cpu_us_ = 0;
  uint64_t planning_stalls_ = 0;
  v1::ClientMessage client_msg_;
  v1::WorkerMessage worker_msg_;
  v1::SchedulerReply reply_;
  std::vector<v1::SchedulerReply> reply_parts_;  // reply_ in messages of at most kReplyChunkBytes
  v1::SchedulerCommand command_;
  StepResult result_;  // worker_msg_'s, for the core (reused: capacity kept)
  KvReceived ack_;
  v1::RequestEvents events_wire_;                         // send_events' (reused)
  std::unordered_map<uint64_t, TokenizeWaiter> queries_;  // tokenize queries on the pool, by job
  uint64_t next_query_job_ = 1;
  // Last: destroyed first, its threads joined before anything their results would touch.
  std::unique_ptr<PromptPool> pool_;
};

namespace {

// The actor for `options`, started (its sockets bound), not yet running.
Result<std::unique_ptr<Actor>> start_actor(const ActorOptions& options) {
  auto file = model::GgufFile::open(options.model_path);
  if (!file) return file.status();
  auto config = model::read_model_config(**file);
  if (!config) return config.status();
  auto tokenizer = model::Tokenizer::from_gguf(**file);
  if (!tokenizer) return tokenizer.status();
  const std::string fingerprint = model::model_fingerprint(**file, *config);
  const PromptRenderer renderer(std::move(tokenizer.value()), (*file)->get_string("tokenizer.chat_template"));
  std::string name = (*file)->get_string("general.name").value_or("");
  if (name.empty()) name = std::filesystem::path(options.model_path).stem().string();
  auto actor = std::make_unique<Actor>(options, *config, renderer, fingerprint, std::move(name));
  TANDEM_RETURN_IF_ERROR(actor->start());
  return actor;
}

}  // namespace

Status run_scheduler(const ActorOptions& options) {
  auto actor = start_actor(options);
  if (!actor) return actor.status();
  (*actor)->run();
  return Status::ok();
}

Result<std::unique_ptr<ActorHarness>> ActorHarness::create(const ActorOptions& options) {
  ActorOptions inline_prompts = options;
  inline_prompts.prompt_threads = 0;  // the harness runs no loop to bring results back
  return around<ActorHarness>(start_actor(inline_prompts));
}

ActorHarness::ActorHarness(std::unique_ptr<Actor> actor) : Harness(std::move(actor)) {}
ActorHarness::~ActorHarness() = default;
void ActorHarness::client(runtime::Frames& frames) { actor().feed_client(frames); }
void ActorHarness::worker(runtime::Frames& frames) { actor().feed_worker(frames); }
void ActorHarness::tick() { actor().tick_now(); }
void ActorHarness::check_liveness() { actor().liveness_now(); }
void ActorHarness::pass_time(std::chrono::microseconds d) { actor().pass_time(d.count()); }
zmq::context_t& ActorHarness::context() { return actor().context(); }

}  // namespace tandem::scheduler
