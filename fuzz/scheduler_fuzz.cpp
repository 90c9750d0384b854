// libFuzzer target: arbitrary bytes as the scheduler's inbound traffic, through the actor's
// own handlers (the ones its client and worker ROUTER sockets call): client messages
// (submit, cancel, heartbeat, status, drain), worker messages (register, heartbeat, step
// results, KV acknowledgements), wrong frame counts, garbage, and ticks in between. A fresh
// scheduler per input. Must never crash, hang or trip ASan/UBSan.
#include <cstdlib>

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
  return o;
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
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) { return fuzz::initialize(write_seeds); }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto actor = scheduler::ActorHarness::create(options());
  if (!actor) std::abort();
  for (const fuzz::Record& r : fuzz::parse(data, size)) {
    runtime::Frames frames = fuzz::frames_of(r, "peer-" + std::to_string(r.peer));
    switch (r.kind % 3) {
      case 0: (*actor)->client(frames); break;
      case 1: (*actor)->worker(frames); break;
      default: (*actor)->tick(); break;
    }
  }
  (*actor)->tick();
  return 0;
}
