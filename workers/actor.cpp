#include "workers/actor.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <deque>
#include <numeric>
#include <optional>
#include <thread>
#include <unordered_map>

#include "runtime/event_loop.h"
#include "runtime/sampling_proto.h"
#include "runtime/security.h"
#include "runtime/step_plan.h"
#include "runtime/wire.h"
#include "runtime/zap.h"
#include "tandem/v1/worker.pb.h"
#include "workers/engine/hybrid.h"
#include "workers/engine/sampler.h"
#include "workers/draft_model.h"
#include "workers/kv_transfer.h"
#include "workers/memory_budget.h"
#include "workers/sequence_table.h"
#include "workers/step_sampler.h"

namespace tandem::worker {

namespace {

constexpr uint32_t kVersion = runtime::kProtocolVersion;
// Transfers that arrive before the scheduler's KvExpect wait this long, this many at most
// (the two come over different sockets; a transfer for an abandoned handoff never matches).
constexpr int64_t kEarlyTransferUs = 10'000'000;
constexpr size_t kEarlyTransfers = 64;

namespace v1 = tandem::v1;

// The bounds the sequence table checks plans against: the engine's and the pool's.
TableLimits limits_of(const engine::Engine& engine, const engine::KvPool& pool, uint32_t spec_tokens,
                      const workers::DraftModel* draft, const engine::StatePool* states, uint32_t checkpoints) {
  return TableLimits{.vocab_size = engine.config().vocab_size,
                     .context_length = engine.config().context_length,
                     .n_blocks = pool.n_blocks(),
                     .block_tokens = pool.block_tokens(),
                     .tail_blocks = pool.tail_blocks(),
                     .kv_format = pool.format().to_string(),
                     .spec_tokens = spec_tokens,
                     .draft_model = draft != nullptr,
                     .draft_context_length = draft ? draft->engine().config().context_length : 0,
                     .state_slots = states != nullptr ? states->slots() - checkpoints : 0,
                     .ring_blocks = pool.ring_blocks(),
                     .ring_window = pool.ring_blocks() > 0 ? engine.config().sliding_window : 0};
}

}  // namespace

class Actor {
 public:
  Actor(const WorkerOptions& options, std::unique_ptr<engine::Engine> engine, std::unique_ptr<engine::KvPool> pool,
        std::unique_ptr<workers::DraftModel> draft, std::unique_ptr<engine::StatePool> states, std::string fingerprint)
      : options_(options),
        engine_(std::move(engine)),
        pool_(std::move(pool)),
        draft_(std::move(draft)),
        states_(std::move(states)),
        fingerprint_(std::move(fingerprint)),
        step_sampler_(engine_->config().vocab_size, engine_->threads()),
        head_outweighs_layers_(engine::head_outweighs_layers(engine_->config())),
        table_(limits_of(*engine_, *pool_, options.role == runtime::Role::kPrefill ? 0 : options.spec_tokens,
                         draft_.get(), states_.get(), states_ ? options_.state_checkpoints : 0),
               states_.get()) {}

  // CurveZMQ: the scheduler's public key and this worker's own key pair (its credential).
  Status start_curve() {
    if (options_.curve_keys_dir.empty()) {
      if (!options_.worker_key.empty()) return Status::invalid("--worker-key needs --curve-keys");
      return Status::ok();
    }
    auto keys = runtime::load_curve_keys(options_.curve_keys_dir, /*need_secret=*/false);
    if (!keys) return keys.status();
    auto own =
        options_.worker_key.empty() ? runtime::ephemeral_curve_keys() : runtime::load_key_pair(options_.worker_key);
    if (!own) return Status::invalid("--worker-key: " + own.status().message());
    // ephemeral_curve_keys() gives a server pair; either way it becomes this worker's client key.
    keys->client_public = own->client_secret.empty() ? own->server_public : own->client_public;
    keys->client_secret = own->client_secret.empty() ? own->server_secret : own->client_secret;
    own_keys_ = *keys;
    loop_.use_curve(*keys);
    curve_ = true;
    if (options_.role != runtime::Role::kDecode) return Status::ok();
    // The KV socket is a CURVE server of its own (prefill workers learn its public key from the
    // scheduler): the scheduler's key pair is not the worker's to hold. Its ZAP domain lets any
    // key in and names it, so each transfer is checked against its KvExpect's sender.
    auto zap = runtime::ZapHandler::start(loop_);
    if (!zap) return zap.status();
    zap_ = std::move(zap.value());
    zap_->allow_any("kv");
    auto kv = runtime::ephemeral_curve_keys();
    if (!kv) return kv.status();
    kv_keys_ = *kv;
    kv_keys_.zap_domain = "kv";
    return Status::ok();
  }

  Status start() {
    TANDEM_RETURN_IF_ERROR(start_curve());
    if (options_.role == runtime::Role::kDecode) {
      // A transfer is many frames: bounded as a whole by the largest this pool can take.
      runtime::SocketLimits limits = loop_.limits();
      limits.max_multipart_bytes = static_cast<int64_t>(max_transfer_bytes(*pool_, engine_->config().context_length) +
                                                        max_state_bytes(states_.get()));
      auto kv = loop_.bind(
          zmq::socket_type::pull, options_.kv_endpoint, [this](runtime::Frames& f) { on_transfer(f); }, kv_keys_,
          limits);
      if (!kv) return kv.status();
      kv_in_ = std::move(kv.value());
      spdlog::info("worker: receiving KV on {} (transfers of at most {} bytes)", kv_in_->endpoint(),
                   limits.max_multipart_bytes);
    }
    TANDEM_RETURN_IF_ERROR(connect_scheduler());
    heartbeat_ = loop_.every(std::chrono::milliseconds(options_.heartbeat_ms), [this] { send_heartbeat(); });
    engine_->set_between_layers([this] { heartbeat_if_due(); });
    if (draft_) draft_->set_between_layers([this] { heartbeat_if_due(); });
    loop_.on_signal({SIGINT, SIGTERM}, [this](int sig) {
      stop_signal_ = sig;
      loop_.stop();
    });
    send_register();
    idle_since_ = runtime::now_us();
    return Status::ok();
  }

  Status run() {
    loop_.run();
    return exit_status_;
  }
  int stop_signal() const { return stop_signal_; }

  // WorkerHarness: the handlers the sockets call, fed directly.
  void feed_scheduler(runtime::Frames& frames) { on_message(frames); }
  void feed_transfer(runtime::Frames& frames) { on_transfer(frames); }

 private:
  void send(const v1::WorkerMessage& m) {
    runtime::Frames frames;
    frames.push_back(runtime::to_frame(m));
    if (runtime::SendResult st = socket_->send(frames); !st)
      spdlog::warn("worker: send to the scheduler failed: {}", st.message());
  }

  void send_register() {
    out_.Clear();
    out_.set_version(kVersion);
    v1::Register* r = out_.mutable_register_();
    r->set_role(runtime::role_to_proto(options_.role));
    if (kv_in_) r->set_kv_endpoint(kv_in_->endpoint());
    if (kv_in_) r->set_kv_public_key(kv_keys_.server_public);
    if (curve_ && options_.role != runtime::Role::kDecode) r->set_kv_sender_public_key(own_keys_.client_public);
    r->set_model_fingerprint(fingerprint_);
    r->set_kv_blocks(pool_->n_blocks());
    r->set_block_tokens(pool_->block_tokens());
    r->set_block_bytes(pool_->block_bytes());
    r->set_kv_bits(pool_->format().bits);
    r->set_kv_group_size(pool_->format().group_size);
    r->set_kv_skip_last_layer(pool_->format().skip_last_layer);
    r->set_kv_quant_scheme(kv_scheme_to_proto(pool_->format()));
    if (pool_->format().rotated()) r->set_kv_rotation_seed(pool_->format().rotation_seed);
    r->set_kv_tail_blocks(pool_->tail_blocks());
    if (pool_->ring_blocks() > 0) {
      r->set_kv_ring_blocks(pool_->ring_blocks());
      r->set_kv_ring_block_bytes(pool_->ring_block_bytes());
      r->set_kv_ring_window(table_.limits().ring_window);
    }
    r->set_weight_bytes(engine_->weight_bytes_per_step() + (draft_ ? draft_->weight_bytes() : 0));
    if (draft_) r->set_draft_block_bytes(draft_->block_bytes(pool_->block_tokens()));
    if (options_.role != runtime::Role::kPrefill) r->set_spec_tokens(options_.spec_tokens);
    if (states_) {
      r->set_state_slots(options_.state_slots);
      r->set_state_checkpoints(options_.state_checkpoints);
      r->set_checkpoint_interval(options_.checkpoint_interval);
    }
    r->set_threads(options_.threads);
    r->set_pid(static_cast<uint32_t>(getpid()));
    r->set_name(options_.name);
    send(out_);
  }

  // A new DEALER to the scheduler (replacing the old one, if any).
  Status connect_scheduler() {
    auto socket = loop_.connect(zmq::socket_type::dealer, options_.scheduler_endpoint,
                                [this](runtime::Frames& f) { on_message(f); });
    if (!socket) return socket.status();
    socket_ = std::move(socket.value());
    return Status::ok();
  }

  void send_heartbeat() {
    if (worker_id_ == 0) {
      ++unanswered_registers_;
      // libzmq never retries a connection whose CURVE handshake the scheduler refused (a key not
      // on its --worker-keys list, yet): a new socket makes a new handshake, which succeeds once
      // the key is listed and the scheduler has re-read its list (SIGHUP).
      if (curve_ && unanswered_registers_ % 6 == 0) {
        spdlog::warn(
            "worker: no answer to registering for {} heartbeats; connecting again (is this worker's key on "
            "the scheduler's --worker-keys list?)",
            unanswered_registers_);
        if (Status st = connect_scheduler(); !st) spdlog::error("worker: {}", st.message());
        send_register();
      } else if (unanswered_registers_ % 3 == 0) {
        send_register();  // the scheduler may have started after us
      }
      return;
    }
    // Its own message: this may run in the middle of a step, while out_ holds a result.
    close_idle_peers();
    beat_.set_version(kVersion);
    beat_.set_worker_id(worker_id_);
    beat_.mutable_heartbeat()->set_epoch(epoch_);
    send(beat_);
    last_beat_us_ = runtime::now_us();
  }

  // Between two layers of a step (the engine's hook): a busy worker heartbeats on time. A
  // prompt chunk on a loaded machine can outlast the scheduler's liveness window (seen in a
  // soak: 1.8 s steps against 3 x 500 ms), and the loop's timer only fires between steps.
  void heartbeat_if_due() {
    if (worker_id_ != 0 && runtime::now_us() - last_beat_us_ >= int64_t{options_.heartbeat_ms} * 1000) send_heartbeat();
  }

  void on_message(runtime::Frames& frames) {
    if (frames.size() != 1 || !runtime::parse_frame(frames[0], in_).is_ok()) {
      spdlog::warn("worker: dropped a malformed message from the scheduler");
      return;
    }
    if (!runtime::protocol_version_served(in_.version())) {
      spdlog::error("worker: the scheduler speaks protocol version {}, we speak {}", in_.version(), kVersion);
      return;
    }
    switch (in_.body_case()) {
      case v1::SchedulerCommand::kRegisterReply: {
        const v1::RegisterReply& r = in_.register_reply();
        if (!r.accepted()) {
          // A refused registration is final unless the scheduler no longer knows us (we were
          // declared dead): then our state is gone and we start over.
          if (r.reason() == v1::REFUSAL_REASON_UNKNOWN_WORKER) {
            if (worker_id_ == 0) return;  // already registering again (one refusal per stale message)
            spdlog::warn("worker: the scheduler no longer knows us; registering again");
            forget_all();
            worker_id_ = 0;
            epoch_ = 0;  // plans of the old registration still queued here are dropped
            send_register();
            return;
          }
          exit_status_ = Status::error(Code::kUnavailable, "the scheduler refused this worker: " + r.error_message());
          spdlog::error("worker: {}", exit_status_.message());
          loop_.stop();
          return;
        }
        worker_id_ = r.worker_id();
        epoch_ = r.epoch();
        forget_all();
        // Heartbeat as often as this scheduler expects (it declares us dead after a few misses).
        if (r.heartbeat_ms() > 0 && r.heartbeat_ms() != options_.heartbeat_ms) {
          options_.heartbeat_ms = r.heartbeat_ms();
          heartbeat_ = loop_.every(std::chrono::milliseconds(options_.heartbeat_ms), [this] { send_heartbeat(); });
        }
        spdlog::info("worker: registered as worker {}", worker_id_);
        return;
      }
      case v1::SchedulerCommand::kPlan:
        if (in_.plan().epoch() != epoch_ || epoch_ == 0) return;  // of an earlier registration
        execute(in_.plan());
        return;
      case v1::SchedulerCommand::kKvExpect:
        if (in_.kv_expect().epoch() != epoch_ || epoch_ == 0) return;
        expect_kv(in_.kv_expect());
        return;
      case v1::SchedulerCommand::kKvSend:
        if (in_.kv_send().epoch() != epoch_ || epoch_ == 0) return;
        send_kv(in_.kv_send());
        return;
      case v1::SchedulerCommand::kShutdown:
        spdlog::info("worker: shutdown from the scheduler");
        loop_.stop();
        return;
      default: return;
    }
  }

  void fail_step(uint64_t step_id, const std::string& message) {
    v1::StepResult* res = out_.mutable_result();
    res->Clear();
    res->set_step_id(step_id);
    res->set_epoch(epoch_);
    res->set_error_code(v1::ERROR_CODE_INVALID_ARGUMENT);
    res->set_error_message(message);
    spdlog::error("worker: step {} failed: {}", step_id, message);
  }

  // A sequence's first line (debug, as request ids are: docs/SECURITY.md, Logs): the client's
  // request id and principal, so that one grep of the id joins gateway, scheduler and worker.
  static void log_request(uint64_t seq_id, const std::string& request_id, const std::string& principal,
                          const char* how) {
    if (request_id.empty()) return;  // an older scheduler
    spdlog::debug("worker: sequence {} {}: request {} principal {}", seq_id, how, request_id,
                  principal.empty() ? "-" : principal);
  }

  // Decode side: the scheduler announced a transfer (replacing any under its id). Its releases
  // first (sequences the scheduler let go of since its last plan here), so that the state slot
  // the handoff takes is one the scheduler counts free; with none free, refused at once.
  void expect_kv(const v1::KvExpect& e) {
    log_request(e.seq_id(), e.request_id(), e.principal(), "handed over");
    for (uint64_t id : e.release()) forget(id);
    const Status taken =
        table_.expect(e.transfer_id(), IncomingHandoff{.seq_id = e.seq_id(),
                                                       .nonce = e.nonce(),
                                                       .scheduler_epoch = e.scheduler_epoch(),
                                                       .positions = e.positions(),
                                                       .sender = e.sender_public_key(),
                                                       .blocks = {e.blocks().begin(), e.blocks().end()},
                                                       .tail = {e.tail_blocks().begin(), e.tail_blocks().end()},
                                                       .ring = {e.ring_blocks().begin(), e.ring_blocks().end()},
                                                       .ring_first = e.ring_first()});
    if (!taken) {
      spdlog::error("worker: refused KV transfer {}: {}", e.transfer_id(), taken.message());
      acknowledge(e.transfer_id(), e.seq_id(), taken, 0);
      return;
    }
    // Every transfer held under this id, until one is taken (a forged one may be among them).
    for (;;) {
      auto early =
          std::find_if(early_.begin(), early_.end(), [&](const auto& p) { return p.first == e.transfer_id(); });
      if (early == early_.end() || table_.expected(e.transfer_id()) == nullptr) break;
      runtime::Frames frames = std::move(early->second.frames);
      early_bytes_ -= early->second.bytes;
      early_.erase(early);
      on_transfer(frames);
    }
  }

  // Samples each sequence of the staged step that asks for it (on the compute threads), into
  // `res`, sampled_ and accepted_: one token, or for a speculating round its rows while each
  // row accepts the draft fed after it (the accepted drafts), then the first that does not or
  // the one after the last draft (StepSampler: plain decoding's tokens, or with a draft model's
  // q at temperature > 0 the rejection rule's, distributed as plain decoding's).
  Status sample_into(v1::StepResult* res, engine::LogitRows computed) {
    const std::span<const SampleRequest> requests = table_.to_sample();
    TANDEM_RETURN_IF_ERROR(step_sampler_.run(requests, *engine_, computed));
    sampled_.resize(requests.size());
    accepted_.resize(requests.size());
    uint32_t drafted = 0, accepted = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      const std::span<const RowSample> rows = step_sampler_.samples(i);
      v1::SeqResult* r = res->add_seqs();
      r->set_seq_id(requests[i].seq_id);
      r->set_token(rows[0].token);
      r->set_logprob(rows[0].logprob);
      for (const engine::TokenLogprob& t : step_sampler_.top(i)) {
        r->add_top_ids(t.token);
        r->add_top_logprobs(t.logprob);
      }
      for (const RowSample& more : rows.subspan(1)) {
        r->add_more_tokens(more.token);
        r->add_more_logprobs(more.logprob);
      }
      sampled_[i] = rows.back().token;
      accepted_[i] = static_cast<uint32_t>(rows.size() - 1);
      drafted += static_cast<uint32_t>(requests[i].drafts.size());
      accepted += accepted_[i];
    }
    res->set_drafted(drafted);
    res->set_accepted(accepted);
    return Status::ok();
  }

  // The plan through the table and the engine: apply, forward, sample, commit. An error fails
  // the step as a whole, the table as it was (the plan's releases are done either way).
  Status run_step(v1::StepResult* res) {
    TANDEM_RETURN_IF_ERROR(table_.apply(plan_));
    for (const runtime::SeqPlan& sp : plan_.seqs())
      if (sp.first) log_request(sp.seq_id, sp.request_id, sp.principal, "placed");
    if (table_.steps().empty()) return Status::ok();  // a plan that only releases sequences
    if (draft_ && !table_.to_draft().empty()) {
      engine_->rest();  // the target's threads leave the cores to the draft model's
      if (Status st = draft_->draft(table_.to_draft(), kPenaltyWindow); !st) {
        table_.abort();
        return Status::error(st.code(), "draft model: " + st.message());
      }
    }
    const engine::LogitRows computed = StepSampler::logit_rows(table_.to_sample(), engine_->threads(),
                                                               head_outweighs_layers_, engine_->screens_greedy());
    Status st = restore_checkpoints();
    if (st) st = engine_->forward(table_.steps(), *pool_, states_.get(), computed);
    if (st) st = sample_into(res, computed);
    if (st) save_checkpoints();
    if (!st) {
      table_.abort();
      return st;
    }
    table_.commit(sampled_, accepted_);
    return Status::ok();
  }

  // Hybrid prefix cache (docs/HYBRID.md "Prefix cache"): a sequence that starts from a cached
  // prefix takes its checkpoint's state, which must sit exactly where its plan starts.
  Status restore_checkpoints() {
    const std::span<const engine::SeqStep> steps = table_.steps();
    for (size_t i = 0; i < steps.size(); ++i) {
      const runtime::SeqPlan& sp = plan_.seqs()[i];
      if (sp.restore_checkpoint < 0) continue;
      TANDEM_RETURN_IF_ERROR(check_checkpoint(sp.seq_id, sp.restore_checkpoint));
      const uint32_t c = options_.state_slots + static_cast<uint32_t>(sp.restore_checkpoint);
      if (states_->position(c) != steps[i].start_pos)
        return Status::invalid("sequence " + std::to_string(sp.seq_id) + " restores state checkpoint " +
                               std::to_string(sp.restore_checkpoint) + " at position " +
                               std::to_string(states_->position(c)) + " but starts at " +
                               std::to_string(steps[i].start_pos));
      states_->copy(c, static_cast<uint32_t>(steps[i].state_slot));
    }
    for (const runtime::SeqPlan& sp : plan_.seqs())
      if (sp.save_checkpoint >= 0) TANDEM_RETURN_IF_ERROR(check_checkpoint(sp.seq_id, sp.save_checkpoint));
    return Status::ok();
  }
  Status check_checkpoint(uint64_t seq_id, int32_t c) const {
    if (states_ && static_cast<uint32_t>(c) < options_.state_checkpoints) return Status::ok();
    return Status::invalid("sequence " + std::to_string(seq_id) + " names state checkpoint " + std::to_string(c) +
                           ", outside this worker's " + std::to_string(states_ ? options_.state_checkpoints : 0) +
                           " (--state-checkpoints)");
  }
  // After the step: the sequences that reached a checkpoint position keep their state there.
  void save_checkpoints() {
    const std::span<const engine::SeqStep> steps = table_.steps();
    for (size_t i = 0; i < steps.size(); ++i)
      if (plan_.seqs()[i].save_checkpoint >= 0)
        states_->copy(static_cast<uint32_t>(steps[i].state_slot),
                      options_.state_slots + static_cast<uint32_t>(plan_.seqs()[i].save_checkpoint));
  }

  void execute(const v1::StepPlan& wire) {
    if (options_.test_step_delay_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.test_step_delay_ms));
    const int64_t start = runtime::now_us();
    const int64_t idle = start - idle_since_;
    out_.Clear();
    out_.set_version(kVersion);
    out_.set_worker_id(worker_id_);
    runtime::from_proto(wire, plan_);
    for (uint64_t id : plan_.release) forget(id);
    v1::StepResult* res = out_.mutable_result();
    res->set_step_id(plan_.step_id);
    res->set_epoch(epoch_);
    if (Status st = run_step(res); !st) fail_step(plan_.step_id, st.message());
    // Unless the next plan is already here, let the scheduler and ZeroMQ have the cores.
    if (!socket_->has_pending()) engine_->rest();
    const int64_t end = runtime::now_us();
    res->set_compute_us(static_cast<uint64_t>(end - start));
    res->set_idle_us(static_cast<uint64_t>(idle));
    send(out_);
    idle_since_ = runtime::now_us();
  }

  void forget(uint64_t seq_id) { table_.drop(seq_id); }

  void forget_all() {
    table_.drop_all();
    early_.clear();
    early_bytes_ = 0;
  }

  void close_idle_peers() {
    const int64_t now = runtime::now_us();
    for (auto it = peers_.begin(); it != peers_.end();) {
      if (now - it->second.last_used_us < int64_t{options_.kv_peer_idle_ms} * 1000) {
        ++it;
        continue;
      }
      spdlog::info("worker: closed the KV socket to {} (unused for {} ms)", it->first, options_.kv_peer_idle_ms);
      it = peers_.erase(it);
    }
  }

  // Prefill side: push the sequence's KV and its worker-side state to the decode worker.
  void send_kv(const v1::KvSend& cmd) {
    const Result<OutgoingHandoff> seq = table_.handoff_out(cmd.seq_id(), cmd.positions(), cmd.ring_first());
    if (!seq) {
      // The scheduler's handoff timeout recomputes the sequence elsewhere.
      spdlog::error("worker: cannot send KV of sequence {} ({} positions): {}", cmd.seq_id(), cmd.positions(),
                    seq.status().message());
      return;
    }
    auto peer = peers_.find(cmd.dest_endpoint());
    if (peer == peers_.end()) {
      if (curve_ && cmd.dest_public_key().empty()) {
        spdlog::error("worker: decode worker at {} gave no KV key: KV is not sent in the clear under CurveZMQ",
                      cmd.dest_endpoint());
        return;
      }
      runtime::CurveKeys keys;
      if (curve_) {  // this worker's own key, which the scheduler told the decode worker to expect
        keys = own_keys_;
        keys.server_public = cmd.dest_public_key();
      }
      auto s = loop_.connect(
          zmq::socket_type::push, cmd.dest_endpoint(), [](runtime::Frames&) {}, keys);
      if (!s) {
        spdlog::error("worker: cannot reach decode worker at {}: {}", cmd.dest_endpoint(), s.status().message());
        return;
      }
      peer = peers_.emplace(cmd.dest_endpoint(), KvPeer{std::move(s.value()), 0}).first;
    }
    peer->second.last_used_us = runtime::now_us();
    transfer_.Clear();
    transfer_.set_version(kVersion);
    transfer_.set_transfer_id(cmd.transfer_id());
    transfer_.set_nonce(cmd.nonce());
    transfer_.set_scheduler_epoch(cmd.scheduler_epoch());
    transfer_.set_dest_seq_id(cmd.dest_seq_id());
    transfer_.set_positions(cmd.positions());
    transfer_.mutable_tokens()->Add(seq->tokens.begin(), seq->tokens.end());
    transfer_.set_last(seq->last);
    model::to_proto(*seq->sampling, transfer_.mutable_sampling());
    transfer_.set_logprobs(seq->logprobs);
    transfer_.set_prompt_len(seq->prompt_len);
    transfer_.set_tail_end(seq->tail_end);
    std::optional<zmq::message_t> state;
    if (states_) {
      Result<zmq::message_t> packed = pack_state(*states_, static_cast<uint32_t>(seq->state_slot), transfer_);
      if (!packed) {
        spdlog::error("worker: cannot send the state of sequence {}: {}", cmd.seq_id(), packed.status().message());
        return;
      }
      state = std::move(*packed);
    }
    runtime::Frames frames;
    pack_transfer(*pool_, seq->blocks, seq->tail, transfer_, frames,
                  TransferRing{seq->ring, seq->ring_first, table_.limits().ring_window});
    if (state) frames.push_back(std::move(*state));  // after the KV frames, the ring's included
    // Non-blocking: ZeroMQ's I/O thread drains it while the next steps compute.
    const size_t n_frames = frames.size();
    if (runtime::SendResult st = peer->second.socket->send(frames); !st)
      spdlog::error("worker: KV send to {} failed: {}", cmd.dest_endpoint(), st.message());
    else
      spdlog::debug("worker: KV transfer {} ({} positions, {} frames) queued for {}", cmd.transfer_id(),
                    cmd.positions(), n_frames, cmd.dest_endpoint());
  }

  // The most early transfers may hold: the KV pool's bytes, ring pool included (and one state slot's).
  size_t pool_bytes() const {
    return size_t{pool_->n_blocks()} * pool_->block_bytes() + size_t{pool_->ring_blocks()} * pool_->ring_block_bytes() +
           (states_ ? states_->slot_floats() * sizeof(float) : 0);
  }

  // Decode side: a transfer from a prefill worker.
  void on_transfer(runtime::Frames& frames) {
    if (frames.empty() || !runtime::parse_frame(frames[0], transfer_in_).is_ok() ||
        !runtime::protocol_version_served(transfer_in_.version())) {
      spdlog::warn("worker: dropped a malformed KV transfer ({} frames)", frames.size());
      return;
    }
    const IncomingHandoff* x = table_.expected(transfer_in_.transfer_id());
    if (x == nullptr) {
      hold_early(frames);
      return;
    }
    // Another transfer under this id (a guess, a replay, a sender that never saw the KvExpect) is
    // dropped and leaves the expectation in place for the real one.
    // Under CurveZMQ the sender is known by its key (the ZAP handler names it): only the prefill
    // worker the scheduler chose may fill these blocks.
    if (!x->sender.empty() && runtime::sender_of(frames[0]) != x->sender) {
      if (foreign_transfers_++ == 0)
        spdlog::warn(
            "worker: dropped a KV transfer under id {} from a key other than its prefill worker's (logged "
            "once; the count is in debug logs)",
            transfer_in_.transfer_id());
      else
        spdlog::debug("worker: {} KV transfers from foreign keys dropped", foreign_transfers_);
      return;
    }
    if (transfer_in_.nonce() != x->nonce || transfer_in_.positions() != x->positions ||
        transfer_in_.scheduler_epoch() != x->scheduler_epoch) {
      spdlog::warn(
          "worker: dropped a KV transfer under id {} whose nonce, positions or scheduler epoch are not the announced "
          "ones",
          transfer_in_.transfer_id());
      return;
    }
    take_transfer(frames, *table_.take_expected(transfer_in_.transfer_id()));
  }

  // A transfer not announced yet (the scheduler's KvExpect is on another socket) or abandoned:
  // held for a while, in case its announcement comes.
  void hold_early(runtime::Frames& frames) {
    const int64_t now = runtime::now_us();
    size_t bytes = 0;
    for (const zmq::message_t& f : frames) bytes += f.size();
    // At most 64 held, for 10 s, holding no more bytes than the KV pool itself.
    while (!early_.empty() &&
           (early_.size() >= kEarlyTransfers || now - early_.front().second.arrived_us > kEarlyTransferUs ||
            early_bytes_ + bytes > pool_bytes())) {
      early_bytes_ -= early_.front().second.bytes;
      early_.erase(early_.begin());
    }
    if (bytes > pool_bytes()) return;
    early_bytes_ += bytes;
    early_.emplace_back(transfer_in_.transfer_id(), Early{std::move(frames), now, bytes});
    spdlog::debug("worker: KV transfer {} arrived before its announcement; held", transfer_in_.transfer_id());
  }

  // The announced transfer in transfer_in_ (its announcement taken): a hybrid's recurrent state
  // into the slot taken at KvExpect (checked before anything is written), its KV into the
  // reserved blocks and its sequence state into the table, or refused (the slot given back);
  // the scheduler is told either way.
  void take_transfer(const runtime::Frames& frames, const IncomingHandoff& expected) {
    Result<uint64_t> state = unpack_state(states_.get(), expected.state_slot, transfer_in_, frames);
    Result<uint64_t> copied = state;
    if (state)
      copied = unpack_transfer(*pool_, transfer_in_, expected.blocks, expected.tail, frames,
                               TransferRing{expected.ring, expected.ring_first, table_.limits().ring_window});
    Status taken = copied.status();
    if (copied)
      taken = table_.receive(expected, HandoffState{.tokens = {transfer_in_.tokens().data(),
                                                               static_cast<size_t>(transfer_in_.tokens_size())},
                                                    .last = transfer_in_.last(),
                                                    .sampling = model::from_proto(transfer_in_.sampling()),
                                                    .logprobs = transfer_in_.logprobs(),
                                                    .prompt_len = transfer_in_.prompt_len(),
                                                    .tail_end = transfer_in_.tail_end()});
    if (!taken) {
      table_.abandon(expected);
      spdlog::error("worker: refused KV transfer {}: {}", transfer_in_.transfer_id(), taken.message());
    } else {
      spdlog::debug("worker: KV transfer {} written ({} bytes)", transfer_in_.transfer_id(), *copied + *state);
    }
    acknowledge(transfer_in_.transfer_id(), expected.seq_id, taken, taken ? *copied + *state : 0);
  }

  // Tells the scheduler a handoff's KV is here (`bytes` of it), or why it was refused.
  void acknowledge(uint64_t transfer_id, uint64_t seq_id, const Status& taken, uint64_t bytes) {
    out_.Clear();
    out_.set_version(kVersion);
    out_.set_worker_id(worker_id_);
    v1::KvReceived* ack = out_.mutable_kv_received();
    ack->set_transfer_id(transfer_id);
    ack->set_seq_id(seq_id);
    ack->set_epoch(epoch_);
    if (taken) {
      ack->set_bytes(bytes);
    } else {
      ack->set_error_code(v1::ERROR_CODE_INVALID_ARGUMENT);
      ack->set_error_message(taken.message());
    }
    send(out_);
  }

  WorkerOptions options_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<engine::KvPool> pool_;
  std::unique_ptr<workers::DraftModel> draft_;  // --spec draft; null otherwise
  std::unique_ptr<engine::StatePool> states_;   // a hybrid model's recurrent states; null otherwise
  std::string fingerprint_;
  StepSampler step_sampler_;
  const bool head_outweighs_layers_;  // a speculating step's head goes per wave (StepSampler::logit_rows)
  SequenceTable table_;               // every live sequence and announced handoff
  runtime::EventLoop loop_;
  std::unique_ptr<runtime::Socket> socket_;
  std::unique_ptr<runtime::EventLoop::Timer> heartbeat_;
  v1::WorkerMessage beat_;  // heartbeats only (see send_heartbeat)
  int64_t last_beat_us_ = 0;
  uint32_t worker_id_ = 0, unanswered_registers_ = 0;
  uint64_t epoch_ = 0;
  int64_t idle_since_ = 0;
  Status exit_status_;
  int stop_signal_ = 0;  // the signal that stopped the loop; 0: the scheduler's shutdown
  // Disaggregation (the table holds the announced handoffs).
  struct Early {
    runtime::Frames frames;
    int64_t arrived_us = 0;
    size_t bytes = 0;
  };
  bool curve_ = false;                        // --curve-keys given: every link is CURVE, the KV link too
  runtime::CurveKeys own_keys_;               // with CurveZMQ: the scheduler's key and this worker's pair
  runtime::CurveKeys kv_keys_;                // decode with CurveZMQ: its KV socket's key pair
  std::unique_ptr<runtime::ZapHandler> zap_;  // decode with CurveZMQ: names each KV sender
  uint64_t foreign_transfers_ = 0;            // KV transfers dropped for their sender's key
  std::unique_ptr<runtime::Socket> kv_in_;    // decode: PULL
  struct KvPeer {
    std::unique_ptr<runtime::Socket> socket;
    int64_t last_used_us;
  };
  std::unordered_map<std::string, KvPeer> peers_;  // prefill: PUSH per decode worker, closed when idle
  std::deque<std::pair<uint64_t, Early>> early_;
  size_t early_bytes_ = 0;  // the frames early_ holds
  v1::KvTransfer transfer_, transfer_in_;
  runtime::StepPlan plan_;          // the plan being executed, mapped from the wire (entries reused)
  std::vector<int32_t> sampled_;    // its sampled tokens, for the table's commit
  std::vector<uint32_t> accepted_;  // and each entry's accepted drafts
  v1::SchedulerCommand in_;
  v1::WorkerMessage out_;
};

Result<runtime::Role> parse_role(const std::string& name) {
  if (std::optional<runtime::Role> role = runtime::role_from_name(name)) return *role;
  return Status::invalid("--role: '" + name + "' is not one of both, prefill, decode");
}

namespace {

// The most blocks a registration may claim (--kv-blocks' range): a larger host gets a pool that large.
constexpr uint32_t kMaxBlocks = 1u << 24;

// The KV blocks `options` ask for: a count, a byte budget, or (kv_memory 0) what the host had
// left before the engine loaded, less the weights of every worker on the host and a reserve.
// With a draft model, each block also holds its layers and the host its weights; a hybrid
// model's state slots come out of the worker's share.
Result<uint32_t> kv_blocks_for(const WorkerOptions& options, const engine::Engine& engine,
                               const workers::DraftModel* draft, const engine::StatePool* states,
                               const std::optional<HostMemory>& host) {
  if (options.kv_blocks != 0) return options.kv_blocks;
  uint64_t bytes = options.kv_memory;
  if (bytes == 0) {
    // The engine's weights are private copies today: each worker on the host holds its own.
    KvBudget budget{.usable = host->usable(),
                    .weights = uint64_t{engine.weight_bytes_per_step() + (draft ? draft->weight_bytes() : 0)} *
                               options.host_workers,
                    .reserve = options.memory_reserve,
                    .share = options.host_workers,
                    .states = states ? uint64_t{states->slots()} * states->slot_floats() * sizeof(float) : 0};
    spdlog::info("worker: {}; {}", host->to_string(), budget.to_string());
    bytes = budget.kv_bytes();
  }
  const size_t per_block = engine::KvPool::bytes_per_block(engine.config(), options.block_tokens, options.kv_format) +
                           (draft ? draft->block_bytes(options.block_tokens) : 0);
  const uint32_t blocks = static_cast<uint32_t>(std::min<uint64_t>(kMaxBlocks, per_block ? bytes / per_block : 0));
  if (blocks == 0)
    return Status::invalid("no memory left for the KV cache: " + human_bytes(bytes) + " holds no block of " +
                           std::to_string(options.block_tokens) +
                           " tokens (lower --memory-reserve or set --kv-memory)");
  return blocks;
}

struct PoolBlocks {
  uint32_t full = 0, ring = 0;  // the full layers' blocks (every layer's without rings), the ring pool's
};

// With --kv-rings, the memory of `blocks` blocks of every layer split between the full layers'
// blocks F (with the draft model's layers) and the ring pool's R = F / 4: a sequence holds
// ceil(positions / B) full blocks but at most its ring cap (about (W + chunk) / B) ring blocks,
// so once contexts pass a few windows the full layers' pool is the one that binds. Without
// rings, every layer's blocks.
PoolBlocks split_for_rings(const WorkerOptions& options, const model::ModelConfig& config, uint32_t blocks,
                           size_t draft_bytes) {
  if (!options.kv_rings) return {blocks, 0};
  const uint64_t ring = engine::KvPool::bytes_per_block(config, options.block_tokens, options.kv_format, true);
  const uint64_t full =
      engine::KvPool::bytes_per_block(config, options.block_tokens, options.kv_format) - ring + draft_bytes;
  const uint64_t f = std::min<uint64_t>(kMaxBlocks, uint64_t{blocks} * (full + ring) * 4 / (4 * full + ring));
  return {static_cast<uint32_t>(f), std::max(1u, static_cast<uint32_t>(f / 4))};
}

// Rings are refused where they are not built, naming --kv-rings (the role is checked with the flags).
Status check_ring_options(const WorkerOptions& options, const model::ModelConfig& config) {
  if (!options.kv_rings) return Status::ok();
  bool windowed = false;
  for (uint32_t l = 0; l < config.n_layers; ++l) windowed |= config.window(l) > 0 && !config.is_recurrent(l);
  if (!windowed)
    return Status::invalid("--kv-rings: " + std::string(config.arch->name) + " has no sliding-window layers");
  if (engine::KvPool::tail_blocks_for(config, options.block_tokens, options.kv_format) != 0)
    return Status::invalid("--kv-rings: KV rings cannot keep the F32 window tail of " + options.kv_format.to_string() +
                           " KV; add --kv-f32-window 0 or use F32 KV");
  return Status::ok();
}

// The draft model of --spec draft (null without one, and on a prefill worker, which never
// speculates); refused when its vocabulary is not the target's.
Result<std::unique_ptr<workers::DraftModel>> load_draft(const WorkerOptions& options, const engine::Engine& target) {
  if (options.draft_model_path.empty() || options.spec_tokens == 0 || options.role == runtime::Role::kPrefill)
    return std::unique_ptr<workers::DraftModel>();
  auto draft = workers::DraftModel::load(options.draft_model_path, {options.threads, options.gemm}, target);
  if (!draft) return draft.status();
  spdlog::info("worker: draft model {} loaded, weights {}, {} bytes of KV per block beside the target's",
               options.draft_model_path, human_bytes((*draft)->weight_bytes()),
               (*draft)->block_bytes(options.block_tokens));
  return draft;
}

// A hybrid's --checkpoint-interval must put checkpoints on the grid at block ends.
Status check_hybrid_options(const WorkerOptions& options, const model::ModelConfig& config) {
  if (!config.arch->hybrid()) return Status::ok();
  const uint32_t interval = options.checkpoint_interval, bt = options.block_tokens;
  if (interval > 0 && (interval % engine::hybrid::kGrid != 0 || interval % bt != 0))
    return Status::invalid("--checkpoint-interval " + std::to_string(interval) + ": a state checkpoint sits on the " +
                           std::to_string(engine::hybrid::kGrid) +
                           "-token grid at a block end: it must be a multiple of " +
                           std::to_string(engine::hybrid::kGrid) + " and of --block-tokens " + std::to_string(bt));
  return Status::ok();
}

// --checkpoint-interval, 0 resolved: the least multiple of the grid and the block size >= 256.
uint32_t checkpoint_interval(const WorkerOptions& options) {
  if (options.checkpoint_interval > 0) return options.checkpoint_interval;
  const uint32_t unit = std::lcm(engine::hybrid::kGrid, options.block_tokens);
  return (std::max(256u, unit) + unit - 1) / unit * unit;
}

// A hybrid model's state pool (null for the others): its sequences' slots, then its prefix
// cache's checkpoints. Split roles hand a slot over with the KV (kv_transfer's pack_state);
// speculating, a round's rejected drafts are rolled out of it (StatePool::roll_back); a hybrid
// draft model is refused by DraftModel::load.
Result<std::unique_ptr<engine::StatePool>> hybrid_states(const WorkerOptions& options,
                                                         const model::ModelConfig& config) {
  if (!config.arch->hybrid()) return std::unique_ptr<engine::StatePool>();
  TANDEM_RETURN_IF_ERROR(check_hybrid_options(options, config));
  // Speculating, each slot keeps the conv inputs a round's rollback needs (--spec-tokens).
  auto states = engine::StatePool::create(config, options.state_slots + options.state_checkpoints, options.spec_tokens);
  if (!states) return states.status();
  spdlog::info("worker: {} recurrent state slots and {} checkpoints every {} tokens, {} each", options.state_slots,
               options.state_checkpoints, checkpoint_interval(options),
               human_bytes((*states)->slot_floats() * sizeof(float)));
  return std::move(*states);
}

// The actor for `options` (model loaded, KV pool made), started (registering), not running.
Result<std::unique_ptr<Actor>> start_actor(const WorkerOptions& options) {
  auto file = model::GgufFile::open(options.model_path);
  if (!file) return file.status();
  auto config = model::read_model_config(**file);
  if (!config) return config.status();
  const std::string fingerprint = model::model_fingerprint(**file, *config);
  file.value().reset();
  std::optional<HostMemory> host;
  if (options.kv_blocks == 0 && options.kv_memory == 0) {
    auto measured = read_host_memory();
    if (!measured) return measured.status();
    host = *measured;
  }
  auto eng = engine::Engine::load(options.model_path, {options.threads, options.gemm});
  if (!eng) return eng.status();
  TANDEM_RETURN_IF_ERROR(options.kv_format.validate((*eng)->config()));
  TANDEM_RETURN_IF_ERROR(check_ring_options(options, (*eng)->config()));
  auto draft = load_draft(options, **eng);
  if (!draft) return draft.status();
  auto states = hybrid_states(options, (*eng)->config());
  if (!states) return states.status();
  auto all = kv_blocks_for(options, **eng, draft->get(), states->get(), host);
  if (!all) return all.status();
  const PoolBlocks blocks =
      split_for_rings(options, (*eng)->config(), *all, *draft ? (*draft)->block_bytes(options.block_tokens) : 0);
  auto pool =
      engine::KvPool::create((*eng)->config(), blocks.full, options.block_tokens, options.kv_format, blocks.ring);
  if (!pool) return pool.status();
  if (*draft) TANDEM_RETURN_IF_ERROR((*draft)->make_pool(blocks.full, options.block_tokens));
  spdlog::info("worker: {} loaded, weights {}, {} KV blocks of {} tokens, {} bytes each, KV {} ({}), {} threads",
               options.model_path, human_bytes((*eng)->weight_bytes_per_step()), blocks.full, options.block_tokens,
               (*pool)->block_bytes(), options.kv_format.to_string(),
               human_bytes(uint64_t{(*pool)->block_bytes()} * blocks.full), options.threads);
  if (blocks.ring > 0)
    spdlog::info("worker: KV rings: {} ring blocks of {} bytes for the windowed layers (window {})", blocks.ring,
                 (*pool)->ring_block_bytes(), (*eng)->config().sliding_window);
  WorkerOptions opts = options;
  if (opts.name.empty()) opts.name = "worker-" + std::to_string(getpid());
  opts.checkpoint_interval = checkpoint_interval(options);
  if (!*states) opts.state_checkpoints = 0;
  auto actor = std::make_unique<Actor>(opts, std::move(eng.value()), std::move(pool.value()), std::move(draft.value()),
                                       std::move(*states), fingerprint);
  TANDEM_RETURN_IF_ERROR(actor->start());
  return actor;
}

}  // namespace

Status check_model_options(const WorkerOptions& options) {
  auto file = model::GgufFile::open(options.model_path);
  if (!file) return Status::ok();  // the worker reports it, as it would without this check
  auto config = model::read_model_config(**file);
  if (!config) return Status::ok();
  TANDEM_RETURN_IF_ERROR(check_ring_options(options, *config));
  return check_hybrid_options(options, *config);
}

Result<WorkerStop> run_worker(const WorkerOptions& options) {
  auto actor = start_actor(options);
  if (!actor) return actor.status();
  TANDEM_RETURN_IF_ERROR((*actor)->run());
  return WorkerStop{(*actor)->stop_signal()};
}

Result<std::unique_ptr<WorkerHarness>> WorkerHarness::create(const WorkerOptions& options) {
  return around<WorkerHarness>(start_actor(options));
}

WorkerHarness::WorkerHarness(std::unique_ptr<Actor> actor) : Harness(std::move(actor)) {}
WorkerHarness::~WorkerHarness() = default;
void WorkerHarness::scheduler(runtime::Frames& frames) { actor().feed_scheduler(frames); }
void WorkerHarness::transfer(runtime::Frames& frames) { actor().feed_transfer(frames); }

}  // namespace tandem::worker
