#include "workers/actor.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <csignal>
#include <unordered_map>

#include "runtime/event_loop.h"
#include "runtime/wire.h"
#include "tandem/v1/worker.pb.h"
#include "workers/engine/sampler.h"

namespace tandem::worker {

namespace {

constexpr uint32_t kVersion = tandem::v1::PROTOCOL_VERSION_CURRENT;
constexpr uint32_t kPenaltyWindow = 64;  // tokens the repetition penalty looks back on, as tandem run

namespace v1 = tandem::v1;

// What the worker keeps per live sequence: the scheduler owns everything else.
struct Sequence {
  std::vector<int32_t> blocks;
  std::vector<int32_t> tokens;  // every token fed so far (the repetition penalty's history)
  int32_t last = -1;            // the token sampled last: fed when a plan says "continue"
  model::SamplingParams sampling;
  bool logprobs = false;
};

class Actor {
 public:
  Actor(const WorkerOptions& options, std::unique_ptr<engine::Engine> engine, std::unique_ptr<engine::KvPool> pool,
        std::string fingerprint)
      : options_(options),
        engine_(std::move(engine)),
        pool_(std::move(pool)),
        fingerprint_(std::move(fingerprint)),
        sampler_(engine_->config().vocab_size) {}

  Status start() {
    auto socket = loop_.connect(zmq::socket_type::dealer, options_.scheduler_endpoint,
                                [this](runtime::Frames& f) { on_message(f); });
    if (!socket) return socket.status();
    socket_ = std::move(socket.value());
    heartbeat_ = loop_.every(std::chrono::milliseconds(options_.heartbeat_ms), [this] { send_heartbeat(); });
    loop_.on_signal({SIGINT, SIGTERM}, [this](int) { loop_.stop(); });
    send_register();
    idle_since_ = runtime::now_us();
    return Status::ok();
  }

  Status run() {
    loop_.run();
    return exit_status_;
  }

 private:
  void send(const v1::WorkerMessage& m) {
    runtime::Frames frames;
    frames.push_back(runtime::to_frame(m));
    if (Status st = socket_->send(frames); !st) spdlog::warn("worker: send to the scheduler failed: {}", st.message());
  }

  void send_register() {
    out_.Clear();
    out_.set_version(kVersion);
    v1::Register* r = out_.mutable_register_();
    r->set_role(v1::WORKER_ROLE_BOTH);
    r->set_model_fingerprint(fingerprint_);
    r->set_kv_blocks(pool_->n_blocks());
    r->set_block_tokens(pool_->block_tokens());
    r->set_block_bytes(pool_->block_bytes());
    r->set_kv_bits(pool_->format().bits);
    r->set_kv_group_size(pool_->format().group_size);
    r->set_kv_skip_last_layer(pool_->format().skip_last_layer);
    r->set_threads(options_.threads);
    r->set_pid(static_cast<uint32_t>(getpid()));
    r->set_name(options_.name);
    send(out_);
  }

  void send_heartbeat() {
    if (worker_id_ == 0) {
      if (++unanswered_registers_ % 3 == 0) send_register();  // the scheduler may have started after us
      return;
    }
    out_.Clear();
    out_.set_version(kVersion);
    out_.set_worker_id(worker_id_);
    out_.mutable_heartbeat()->set_epoch(epoch_);
    send(out_);
  }

  void on_message(runtime::Frames& frames) {
    if (frames.size() != 1 || !runtime::parse_frame(frames[0], in_).is_ok()) {
      spdlog::warn("worker: dropped a malformed message from the scheduler");
      return;
    }
    if (in_.version() != kVersion) {
      spdlog::error("worker: the scheduler speaks protocol version {}, we speak {}", in_.version(), kVersion);
      return;
    }
    switch (in_.body_case()) {
      case v1::SchedulerCommand::kRegisterReply: {
        const v1::RegisterReply& r = in_.register_reply();
        if (!r.accepted()) {
          // A refused registration is final unless it was "register first" after we were
          // declared dead: then our state is gone and we start over.
          if (r.error_message().rfind("unknown worker", 0) == 0) {
            spdlog::warn("worker: the scheduler no longer knows us; registering again");
            sequences_.clear();
            worker_id_ = 0;
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
        sequences_.clear();
        // Heartbeat as often as this scheduler expects (it declares us dead after a few misses).
        if (r.heartbeat_ms() > 0 && r.heartbeat_ms() != options_.heartbeat_ms) {
          options_.heartbeat_ms = r.heartbeat_ms();
          heartbeat_ = loop_.every(std::chrono::milliseconds(options_.heartbeat_ms), [this] { send_heartbeat(); });
        }
        spdlog::info("worker: registered as worker {}", worker_id_);
        return;
      }
      case v1::SchedulerCommand::kPlan:
        execute(in_.plan());
        return;
      case v1::SchedulerCommand::kShutdown:
        spdlog::info("worker: shutdown from the scheduler");
        loop_.stop();
        return;
      default:
        return;
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

  void execute(const v1::StepPlan& plan) {
    const int64_t start = runtime::now_us();
    const int64_t idle = start - idle_since_;
    out_.Clear();
    out_.set_version(kVersion);
    out_.set_worker_id(worker_id_);
    for (uint64_t id : plan.release()) sequences_.erase(id);

    steps_.clear();
    feeds_.resize(plan.seqs_size());
    seq_of_.clear();
    bool ok = true;
    for (int i = 0; i < plan.seqs_size() && ok; ++i) {
      const v1::SeqPlan& sp = plan.seqs(i);
      auto [it, fresh] = sequences_.try_emplace(sp.seq_id());
      Sequence& seq = it->second;
      if (sp.has_sampling()) {
        const v1::SamplingParams& s = sp.sampling();
        seq.sampling = {s.temperature(), s.top_k(), s.top_p(), s.min_p(), s.repetition_penalty(), s.seed(), s.top_logprobs()};
        seq.logprobs = sp.logprobs();
      }
      seq.blocks.insert(seq.blocks.end(), sp.new_blocks().begin(), sp.new_blocks().end());
      std::vector<int32_t>& feed = feeds_[i];
      feed.assign(sp.tokens().begin(), sp.tokens().end());
      if (feed.empty()) {
        if (seq.last < 0) {
          fail_step(plan.step_id(), "sequence " + std::to_string(sp.seq_id()) + " has no sampled token to continue from");
          ok = false;
          break;
        }
        feed.push_back(seq.last);
      }
      if (sp.start_pos() != seq.tokens.size()) {
        // A shorter start trims the sequence (speculative rollback); a gap is a bug.
        if (sp.start_pos() > seq.tokens.size()) {
          fail_step(plan.step_id(), "sequence " + std::to_string(sp.seq_id()) + " plan starts at " +
                                        std::to_string(sp.start_pos()) + " but " + std::to_string(seq.tokens.size()) +
                                        " positions are cached");
          ok = false;
          break;
        }
        seq.tokens.resize(sp.start_pos());
      }
      seq.tokens.insert(seq.tokens.end(), feed.begin(), feed.end());
      steps_.push_back(engine::SeqStep{feed, sp.start_pos(), seq.blocks, sp.sample() ? 1u : 0u});
      seq_of_.push_back(&seq);
    }
    if (ok) {
      Status st = engine_->forward(steps_, *pool_);
      if (!st) {
        fail_step(plan.step_id(), st.message());
      } else {
        v1::StepResult* res = out_.mutable_result();
        res->set_step_id(plan.step_id());
        res->set_epoch(epoch_);
        uint32_t row = 0;
        for (int i = 0; i < plan.seqs_size(); ++i) {
          const v1::SeqPlan& sp = plan.seqs(i);
          if (!sp.sample()) continue;
          Sequence& seq = *seq_of_[i];
          const size_t from = seq.tokens.size() > kPenaltyWindow ? seq.tokens.size() - kPenaltyWindow : 0;
          const engine::Sample smp = sampler_.sample(engine_->logits(row++), seq.sampling, seq.tokens.size(),
                                                     std::span<const int32_t>(seq.tokens).subspan(from));
          seq.last = smp.token;
          v1::SeqResult* r = res->add_seqs();
          r->set_seq_id(sp.seq_id());
          r->set_token(smp.token);
          r->set_logprob(smp.logprob);
          for (const engine::TokenLogprob& t : smp.top) {
            r->add_top_ids(t.token);
            r->add_top_logprobs(t.logprob);
          }
        }
      }
    }
    // Unless the next plan is already here, let the scheduler and ZeroMQ have the cores.
    if (!socket_->has_pending()) engine_->rest();
    const int64_t end = runtime::now_us();
    v1::StepResult* res = out_.mutable_result();
    res->set_compute_us(static_cast<uint64_t>(end - start));
    res->set_idle_us(static_cast<uint64_t>(idle));
    send(out_);
    idle_since_ = runtime::now_us();
  }

  WorkerOptions options_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<engine::KvPool> pool_;
  std::string fingerprint_;
  engine::Sampler sampler_;
  runtime::EventLoop loop_;
  std::unique_ptr<runtime::Socket> socket_;
  std::unique_ptr<runtime::EventLoop::Timer> heartbeat_;
  uint32_t worker_id_ = 0, unanswered_registers_ = 0;
  uint64_t epoch_ = 0;
  int64_t idle_since_ = 0;
  Status exit_status_;
  std::unordered_map<uint64_t, Sequence> sequences_;
  std::vector<engine::SeqStep> steps_;
  std::vector<std::vector<int32_t>> feeds_;
  std::vector<Sequence*> seq_of_;
  v1::SchedulerCommand in_;
  v1::WorkerMessage out_;
};

}  // namespace

Status run_worker(const WorkerOptions& options) {
  auto file = model::GgufFile::open(options.model_path);
  if (!file) return file.status();
  auto config = model::read_model_config(**file);
  if (!config) return config.status();
  const std::string fingerprint = model::model_fingerprint(**file, *config);
  file.value().reset();
  auto eng = engine::Engine::load(options.model_path, {options.threads, options.gemm});
  if (!eng) return eng.status();
  uint32_t blocks = options.kv_blocks;
  TANDEM_RETURN_IF_ERROR(options.kv_format.validate((*eng)->config()));
  if (blocks == 0)
    blocks = engine::KvPool::blocks_for_bytes((*eng)->config(), options.kv_memory, options.block_tokens,
                                              options.kv_format);
  auto pool = engine::KvPool::create((*eng)->config(), blocks, options.block_tokens, options.kv_format);
  if (!pool) return pool.status();
  spdlog::info("worker: {} loaded, {} KV blocks of {} tokens, {} bytes each, KV {} ({} MiB), {} threads",
               options.model_path, blocks, options.block_tokens, (*pool)->block_bytes(),
               options.kv_format.to_string(), (*pool)->block_bytes() * blocks >> 20, options.threads);
  WorkerOptions opts = options;
  if (opts.name.empty()) opts.name = "worker-" + std::to_string(getpid());
  Actor actor(opts, std::move(eng.value()), std::move(pool.value()), fingerprint);
  TANDEM_RETURN_IF_ERROR(actor.start());
  return actor.run();
}

}  // namespace tandem::worker
