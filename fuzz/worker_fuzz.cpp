// libFuzzer target: arbitrary bytes as a worker's inbound traffic, through the actor's own
// handlers: the scheduler's commands (registration replies, step plans, KV expectations and
// send orders, shutdown) and raw multipart KV transfers from other workers (a header, then
// block frames of any count and size). Three workers (role decode, the tiny model, 64 KV
// blocks), one per KV format: F32; 8-bit with an F32 window of 2 tail blocks; 4-bit in groups
// of 32 with the last layer F32 and a window of 1. A record's kind picks the handler (kind % 2)
// and the worker ((kind / 2) % 3). They live across inputs and are made anew every 256, so
// state carried between inputs is exercised too. Must never crash, hang or trip ASan/UBSan.
#include <cstdlib>

#include "fuzz/fuzz_input.h"
#include "tandem/v1/worker.pb.h"
#include "workers/actor.h"

using namespace tandem;

namespace {

constexpr int kFormats = 4;

engine::KvFormat kv_format(int i) {
  engine::KvFormat f;  // F32
  if (i == 1) {
    f.bits = 8;
    f.f32_window = 2;
  } else if (i == 2) {
    f.bits = 4;
    f.group_size = 32;
    f.skip_last_layer = true;
    f.f32_window = 1;
  } else if (i == 3) {  // rotated 3-bit codes (bit planes), the F32 window of 2 blocks
    f.bits = 3;
    f.scheme = engine::KvScheme::kRotated;
  }
  return f;
}

worker::WorkerOptions options(int format) {
  worker::WorkerOptions o;
  o.model_path = fuzz::tiny_model();
  o.scheduler_endpoint = "inproc://fuzz-scheduler";
  o.kv_endpoint = "inproc://fuzz-kv";
  o.role = runtime::Role::kDecode;
  o.threads = 1;
  o.kv_blocks = 64;
  o.name = "fuzz";
  o.kv_format = kv_format(format);
  return o;
}

// Plans for the quantized workers (kinds 2 and 4): a 40-token prefill over three blocks with
// the sequence's tail blocks, decodes that cross into the next block, a release.
void write_quantized_seeds(const std::string& dir, const v1::SchedulerCommand& reply) {
  std::vector<v1::SchedulerCommand> plans(6);
  for (uint32_t i = 0; i < plans.size(); ++i) {
    plans[i].set_version(1);
    v1::StepPlan* p = plans[i].mutable_plan();
    p->set_step_id(i + 1);
    p->set_epoch(1);
    v1::SeqPlan* sp = p->add_seqs();
    sp->set_seq_id(1);
    sp->set_sample(true);
    if (i == 0) {
      for (int t = 0; t < 40; ++t) sp->add_tokens(3 + t);
      for (int b = 0; b < 3; ++b) sp->add_new_blocks(b);
      sp->add_tail_blocks(62);
      sp->add_tail_blocks(63);
      sp->mutable_sampling()->set_top_p(1.0f);
    } else {
      sp->set_start_pos(39 + i);
      if (i == 5) sp->add_new_blocks(3);
    }
  }
  plans.back().mutable_plan()->add_release(1);
  for (uint8_t kind : {2, 4}) {
    fuzz::SeedWriter w;
    w.add(kind, 0, {&reply});
    for (const auto& p : plans) w.add(kind, 0, {&p});
    w.write(dir, kind == 2 ? "q8-tail-plans" : "q4-tail-plans");
  }
}

void write_seeds(const std::string& dir) {
  v1::SchedulerCommand reply;
  reply.set_version(1);
  v1::RegisterReply* rr = reply.mutable_register_reply();
  rr->set_accepted(true);
  rr->set_worker_id(1);
  rr->set_epoch(1);
  rr->set_heartbeat_ms(1000);
  v1::SchedulerCommand prefill;
  prefill.set_version(1);
  v1::StepPlan* p = prefill.mutable_plan();
  p->set_step_id(1);
  p->set_epoch(1);
  v1::SeqPlan* sp = p->add_seqs();
  sp->set_seq_id(1);
  for (int i = 0; i < 10; ++i) sp->add_tokens(3 + i);
  sp->set_start_pos(0);
  sp->add_new_blocks(0);
  sp->set_sample(true);
  sp->mutable_sampling()->set_top_p(1.0f);
  v1::SchedulerCommand decode;
  decode.set_version(1);
  v1::StepPlan* d = decode.mutable_plan();
  d->set_step_id(2);
  d->set_epoch(1);
  v1::SeqPlan* ds = d->add_seqs();
  ds->set_seq_id(1);
  ds->set_start_pos(10);
  ds->set_sample(true);
  d->add_release(7);
  v1::SchedulerCommand send;
  send.set_version(1);
  v1::KvSend* ks = send.mutable_kv_send();
  ks->set_transfer_id(9);
  ks->set_seq_id(1);
  ks->set_dest_seq_id(4);
  ks->set_dest_endpoint("inproc://fuzz-kv-out");
  ks->set_positions(11);
  ks->set_epoch(1);
  v1::SchedulerCommand expect;
  expect.set_version(1);
  v1::KvExpect* ke = expect.mutable_kv_expect();
  ke->set_transfer_id(3);
  ke->set_seq_id(5);
  ke->add_blocks(3);
  ke->add_blocks(4);
  ke->set_epoch(1);
  // A transfer of 20 positions into 2 blocks: tiny has 2 layers x 2 KV heads x K,V regions
  // of 16 x 16 floats per block.
  v1::KvTransfer header;
  header.set_version(1);
  header.set_transfer_id(3);
  header.set_dest_seq_id(5);
  header.set_positions(20);
  header.add_run_blocks(2);
  header.add_region_block_bytes(1024);
  header.add_region_block_bytes(1024);
  for (int i = 0; i < 20; ++i) header.add_tokens(3 + i);
  header.set_last(9);
  std::vector<std::string> transfer = {header.SerializeAsString()};
  for (int r = 0; r < 8; ++r) transfer.emplace_back(2048, '\0');
  v1::SchedulerCommand cont;
  cont.set_version(1);
  v1::StepPlan* c = cont.mutable_plan();
  c->set_step_id(3);
  c->set_epoch(1);
  c->add_seqs()->set_seq_id(5);
  c->mutable_seqs(0)->set_start_pos(20);
  c->mutable_seqs(0)->set_sample(true);
  fuzz::SeedWriter w;
  w.add(0, 0, {&reply}).add(0, 0, {&prefill}).add(0, 0, {&decode}).add(0, 0, {&send}).write(dir, "plans-and-send");
  w.add(0, 0, {&reply})
      .add(0, 0, {&expect})
      .add_raw(1, 0, transfer)
      .add(0, 0, {&cont})
      .write(dir, "expect-then-transfer");
  w.add(0, 0, {&reply})
      .add_raw(1, 0, transfer)
      .add(0, 0, {&expect})
      .add(0, 0, {&cont})
      .write(dir, "transfer-then-expect");
  write_quantized_seeds(dir, reply);
}

std::unique_ptr<worker::WorkerHarness> g_workers[kFormats];
uint64_t g_inputs = 0;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) { return fuzz::initialize(write_seeds); }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!g_workers[0] || ++g_inputs % 256 == 0) {
    for (int i = 0; i < kFormats; ++i) {
      g_workers[i].reset();
      auto w = worker::WorkerHarness::create(options(i));
      if (!w) std::abort();
      g_workers[i] = std::move(w.value());
    }
  }
  for (const fuzz::Record& r : fuzz::parse(data, size)) {
    runtime::Frames frames = fuzz::frames_of(r, "");
    worker::WorkerHarness& w = *g_workers[(r.kind / 2) % kFormats];
    if (r.kind % 2 == 0)
      w.scheduler(frames);
    else
      w.transfer(frames);
  }
  return 0;
}
