// libFuzzer target: arbitrary bytes as the scheduler's inbound traffic, through the actor's
// own handlers (the ones its client and worker ROUTER sockets call): client messages
// (submit, cancel, heartbeat, status, drain), worker messages (register, heartbeat, step
// results, KV acknowledgements), wrong frame counts, garbage, ticks, and time passing with the
// liveness check (silent workers and clients, per-step deadlines) in between. A fresh scheduler
// per input, with small limits (queue, per-client requests, send queue) so that a few records
// reach them. Each peer identity is a real DEALER connected over inproc://, so what the
// scheduler sends is delivered, and queues up until the input has that peer read: a client that
// does not read stalls as a real one would. Must never crash, hang or trip ASan/UBSan.
#include <chrono>
#include <cstdlib>
#include <memory>
#include <vector>
#include <zmq.hpp>

#include "fuzz/fuzz_input.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "scheduler/actor.h"
#include "tandem/v1/client.pb.h"
#include "tandem/v1/worker.pb.h"

using namespace tandem;

namespace {

scheduler::ActorOptions options() {
  scheduler::ActorOptions o;
  o.model_path = fuzz::tiny_model();
  o.client_endpoint = "inproc://fuzz-clients";
  o.worker_endpoint = "inproc://fuzz-workers";
  o.heartbeat_ms = 100;
  o.worker_liveness = 3;
  o.client_timeout_ms = 1000;
  o.client_send_queue = 8;  // with the peer's receive queue, 12 messages until a client stalls
  o.core.max_queue = 6;
  o.core.max_client_requests = 4;
  return o;
}

constexpr int kPeers = 4;  // fuzz::Record::peer is taken modulo 4
constexpr int kPeerReceiveQueue = 4;

// The peers: per identity "peer-N", a DEALER on the client endpoint and one on the worker
// endpoint, in the actor's context (inproc:// needs it). Closed before the actor.
struct Peers {
  std::vector<std::unique_ptr<zmq::socket_t>> sockets;  // [client 0..3, worker 0..3]
  explicit Peers(zmq::context_t& ctx) {
    for (const char* endpoint : {"inproc://fuzz-clients", "inproc://fuzz-workers"}) {
      for (int i = 0; i < kPeers; ++i) {
        auto s = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
        s->set(zmq::sockopt::linger, 0);
        s->set(zmq::sockopt::rcvhwm, kPeerReceiveQueue);
        s->set(zmq::sockopt::routing_id, "peer-" + std::to_string(i));
        s->connect(endpoint);
        sockets.push_back(std::move(s));
      }
    }
  }
  // Peer `i` reads what was sent to it (a stalled client catching up); bounded.
  void read(int i) {
    for (zmq::socket_t* s : {sockets[i].get(), sockets[kPeers + i].get()}) {
      zmq::message_t m;
      for (int n = 0; n < 64 && s->recv(m, zmq::recv_flags::dontwait); ++n) {
      }
    }
  }
};

// Seeds that reach the limits and the liveness paths: a client that does not read its
// events, a full queue, a worker that heartbeats but never answers its plan.
void write_limit_seeds(const std::string& dir, const v1::WorkerMessage& both, const v1::ClientMessage& submit) {
  auto submit_as = [&](const std::string& id, uint32_t max_tokens) {
    v1::ClientMessage m = submit;
    m.mutable_submit()->set_request_id(id);
    m.mutable_submit()->set_max_tokens(max_tokens);
    m.mutable_submit()->clear_stop_strings();
    return m;
  };
  fuzz::SeedWriter w;
  // Stalled client: worker peer 0 answers 16 decode steps of one stream; client peer 1 never
  // reads its events until the end.
  const v1::ClientMessage long_stream = submit_as("long", 30);
  w.add(1, 0, {&both}).add(0, 1, {&long_stream}).add(2, 0, {});
  std::vector<v1::WorkerMessage> results(16);
  for (uint32_t i = 0; i < results.size(); ++i) {
    results[i].set_version(1);
    v1::StepResult* r = results[i].mutable_result();
    r->set_step_id(i + 1);
    r->set_epoch(1);
    v1::SeqResult* sr = r->add_seqs();
    sr->set_seq_id(1);
    sr->set_token(5 + static_cast<int32_t>(i));
    w.add(1, 0, {&results[i]});
  }
  w.add(4, 1, {}).add(2, 0, {}).write(dir, "stalled-client");
  // Full queue: a worker with room for one sequence, submits from three clients past their
  // per-client limit and the queue's.
  v1::WorkerMessage small = both;
  small.mutable_register_()->set_kv_blocks(2);
  w.add(1, 0, {&small});
  std::vector<v1::ClientMessage> many;
  for (int i = 0; i < 10; ++i) many.push_back(submit_as("q" + std::to_string(i), 4));
  for (int i = 0; i < 10; ++i) w.add(0, static_cast<uint8_t>(1 + i % 3), {&many[i]});
  w.add(2, 0, {}).write(dir, "full-queue");
  // Step deadline: worker peer 0 takes a plan, heartbeats on time and never answers: fenced
  // after the liveness timeout, refused as unknown, registers again.
  v1::WorkerMessage beat;
  beat.set_version(1);
  beat.mutable_heartbeat()->set_epoch(1);
  w.add(1, 0, {&both}).add(0, 1, {&long_stream}).add(2, 0, {});
  for (int i = 0; i < 6; ++i) w.add(1, 0, {&beat}).add(3, 0, {});
  w.add(1, 0, {&beat}).add(1, 0, {&both}).add(2, 0, {}).write(dir, "step-deadline");
  // A silent worker and a silent client: time passes in steps of 3 periods (held up) and 1.5.
  w.add(1, 0, {&both}).add(0, 2, {&long_stream}).add(2, 0, {}).add(3, 3, {}).add(3, 1, {}).add(3, 1, {});
  w.add(3, 1, {}).add(3, 1, {}).add(3, 1, {}).add(3, 1, {}).add(3, 1, {}).write(dir, "silent-peers");
}

void write_seeds(const std::string& dir) {
  auto file = model::GgufFile::open(fuzz::tiny_model()).value();
  const auto config = model::read_model_config(*file).value();
  const std::string fingerprint = model::model_fingerprint(*file, config);
  auto reg = [&](v1::WorkerRole role, const std::string& kv) {
    v1::WorkerMessage m;
    m.set_version(1);
    v1::Register* r = m.mutable_register_();
    r->set_role(role);
    r->set_model_fingerprint(fingerprint);
    r->set_kv_blocks(64);
    r->set_block_tokens(16);
    r->set_block_bytes(8192);
    r->set_threads(1);
    r->set_pid(1);
    r->set_name("w");
    r->set_kv_endpoint(kv);
    return m;
  };
  v1::ClientMessage submit;
  submit.set_version(1);
  v1::Submit* s = submit.mutable_submit();
  s->set_request_id("a");
  for (int i = 0; i < 20; ++i) s->mutable_tokens()->add_ids(3 + i);
  s->set_max_tokens(4);
  s->set_stream(true);
  s->add_stop_strings("ab");
  v1::ClientMessage text = submit;
  text.mutable_submit()->set_request_id("b");
  text.mutable_submit()->set_text("hello world");
  v1::WorkerMessage result;
  result.set_version(1);
  result.set_worker_id(1);
  v1::StepResult* res = result.mutable_result();
  res->set_step_id(1);
  res->set_epoch(1);
  v1::SeqResult* sr = res->add_seqs();
  sr->set_seq_id(1);
  sr->set_token(5);
  v1::ClientMessage cancel, status, heartbeat, drain;
  cancel.set_version(1);
  cancel.mutable_cancel()->set_request_id("a");
  status.set_version(1);
  status.mutable_status();
  heartbeat.set_version(1);
  heartbeat.mutable_heartbeat();
  drain.set_version(1);
  drain.mutable_drain();
  const v1::WorkerMessage both = reg(v1::WORKER_ROLE_BOTH, "");
  fuzz::SeedWriter w;
  w.add(1, 0, {&both})
      .add(0, 1, {&submit})
      .add(0, 1, {&text})
      .add(2, 0, {})
      .add(1, 0, {&result})
      .add(2, 0, {})
      .add(0, 1, {&cancel})
      .add(0, 2, {&status})
      .add(0, 2, {&heartbeat})
      .write(dir, "both-worker");
  // A split deployment and a handoff acknowledged.
  const v1::WorkerMessage prefill = reg(v1::WORKER_ROLE_PREFILL, ""),
                          decode = reg(v1::WORKER_ROLE_DECODE, "inproc://kv");
  v1::WorkerMessage ack;
  ack.set_version(1);
  ack.set_worker_id(2);
  v1::KvReceived* k = ack.mutable_kv_received();
  k->set_transfer_id(1);
  k->set_seq_id(2);
  k->set_bytes(1000);
  k->set_epoch(2);
  w.add(1, 0, {&prefill})
      .add(1, 1, {&decode})
      .add(0, 2, {&submit})
      .add(2, 0, {})
      .add(1, 0, {&result})
      .add(1, 1, {&ack})
      .add(2, 0, {})
      .write(dir, "split-handoff");
  w.add(1, 0, {&both}).add(0, 1, {&submit}).add(0, 3, {&drain}).add(0, 1, {&text}).add(2, 0, {}).write(dir, "drain");
  write_limit_seeds(dir, both, submit);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) { return fuzz::initialize(write_seeds); }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto actor = scheduler::ActorHarness::create(options());
  if (!actor) std::abort();
  {
    Peers peers((*actor)->context());
    for (const fuzz::Record& r : fuzz::parse(data, size)) {
      runtime::Frames frames = fuzz::frames_of(r, "peer-" + std::to_string(r.peer));
      switch (r.kind % 5) {
        case 0: (*actor)->client(frames); break;
        case 1: (*actor)->worker(frames); break;
        case 2: (*actor)->tick(); break;
        case 3:
          // 0.75 to 3 heartbeat periods: deaths, fences and silent clients; past 2 periods the
          // scheduler counts itself held up.
          (*actor)->pass_time(std::chrono::microseconds(75'000 * (r.peer + 1)));
          (*actor)->check_liveness();
          break;
        default: peers.read(r.peer); break;
      }
    }
    (*actor)->tick();
  }
  return 0;
}
