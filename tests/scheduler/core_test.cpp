// The scheduler's pure core, driven by scripted workers: plans, interleaving, stops,
// cancellation at every stage, preemption, and block accounting that never leaks.
#include "scheduler/core.h"
#include "tests/scheduler/wire_harness.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <set>
#include <random>

#include "model/gguf.h"
#include "tests/test_util.h"

namespace tandem::scheduler {
namespace {

struct Recorder : Sink {
  std::map<uint32_t, std::deque<v1::StepPlan>> plans;         // per worker, not yet answered
  std::map<std::string, std::vector<v1::TokenEvent>> tokens;  // by request id
  std::map<std::string, v1::FinalEvent> finals;
  std::map<std::string, int> final_count;
  std::vector<v1::StepPlan> history;
  std::map<uint32_t, std::vector<v1::SchedulerCommand>> commands;  // KvExpect / KvSend per worker
  void send_command(uint32_t worker, const Command& c) override { commands[worker].push_back(test_wire::wire(c)); }
  void send_plan(uint32_t worker, const StepPlan& p) override {
    const v1::StepPlan plan = test_wire::wire(p);
    plans[worker].push_back(plan);
    history.push_back(plan);
  }
  void send_events(const std::string&, const RequestEvents& plain) override {
    const v1::RequestEvents ev = test_wire::wire(plain);
    for (const auto& t : ev.tokens()) tokens[ev.request_id()].push_back(t);
    if (ev.has_final()) {
      finals[ev.request_id()] = ev.final();
      ++final_count[ev.request_id()];
    }
  }
};

// A scripted worker: answers plans in order; the sampled token is a function of the
// sequence's position so tests can predict it. Token 2 is EOS in the tiny vocabulary.
int32_t fake_token(uint32_t position) { return 3 + static_cast<int32_t>((position * 37) % 250); }

struct Harness {
  model::Tokenizer tokenizer;
  model::ModelConfig config;
  Recorder rec;
  std::unique_ptr<Core> core;
  int64_t now = 1'000'000;

  explicit Harness(SchedulerConfig sc = {}) {
    auto f = model::GgufFile::open(test::model_file("tiny", 1));
    config = model::read_model_config(**f).value();
    tokenizer = model::Tokenizer::from_gguf(**f).value();
    core = std::make_unique<Core>(sc, config, tokenizer, rec);
  }

  v1::Submit request(const std::string& id, uint32_t prompt_len, uint32_t max_tokens) {
    return test_wire::submit(id, prompt_len, max_tokens);
  }

  // Answers the oldest plan of `worker`. Returns false if none is pending.
  bool answer(uint32_t worker, std::function<int32_t(const v1::SeqPlan&)> token = {}) {
    auto& q = rec.plans[worker];
    if (q.empty()) return false;
    v1::StepPlan plan = q.front();
    q.pop_front();
    v1::StepResult res;
    res.set_step_id(plan.step_id());
    for (const auto& sp : plan.seqs()) {
      if (!sp.sample()) continue;
      const uint32_t n = sp.tokens_size() ? sp.tokens_size() : 1;
      auto* r = res.add_seqs();
      r->set_seq_id(sp.seq_id());
      r->set_token(token ? token(sp) : fake_token(sp.start_pos() + n));
    }
    now += 1000;
    core->on_result(worker, test_wire::plain(res), now);
    core->tick(now);
    return true;
  }

  // Runs every worker until nothing is pending (bounded).
  void drain(int max_rounds = 100000) {
    for (int i = 0; i < max_rounds; ++i) {
      bool any = false;
      for (auto& [w, q] : rec.plans) any |= answer(w);
      if (!any) return;
    }
    FAIL() << "did not drain: queued " << core->queued() << ", running " << core->running() << ", steps "
           << core->stats().steps << ", preemptions " << core->stats().preemptions;
  }

  // Acknowledges every KvExpect sent to decode worker `worker` (its KV "arrived").
  int deliver(uint32_t worker, bool ok = true) {
    int n = 0;
    auto cmds = std::move(rec.commands[worker]);
    rec.commands[worker].clear();
    for (const auto& c : cmds) {
      if (!c.has_kv_expect()) continue;
      v1::KvReceived ack;
      ack.set_transfer_id(c.kv_expect().transfer_id());
      ack.set_seq_id(c.kv_expect().seq_id());
      ack.set_bytes(1000);
      if (!ok) {
        ack.set_error_code(v1::ERROR_CODE_INVALID_ARGUMENT);
        ack.set_error_message("format differs");
      }
      now += 100;
      core->on_kv_received(worker, test_wire::plain(ack), now);
      ++n;
    }
    core->tick(now);
    return n;
  }

  // Like drain(), delivering handoffs to the decode workers as they are ordered.
  void drain_split(const std::vector<uint32_t>& decode, int max_rounds = 100000) {
    for (int i = 0; i < max_rounds; ++i) {
      bool any = false;
      for (uint32_t d : decode) any |= deliver(d) > 0;
      for (auto& [w, q] : rec.plans) any |= answer(w);
      if (!any) return;
    }
    FAIL() << "did not drain";
  }

  uint32_t free_blocks() const {
    uint32_t f = 0;
    for (auto& w : core->workers()) f += w.blocks_free + w.blocks_cached;
    return f;
  }
};

TEST(Core, OneRequestStreamsEveryTokenThenOneFinal) {
  Harness h;
  h.core->add_worker(1, 64, 16, h.now);
  h.core->submit("c", h.request("a", 40, 10), h.now);
  h.core->tick(h.now);
  h.drain();
  ASSERT_EQ(h.rec.final_count["a"], 1);
  EXPECT_EQ(h.rec.finals["a"].finish_reason(), v1::FINISH_REASON_LENGTH);
  ASSERT_EQ(h.rec.tokens["a"].size(), 10u);
  for (uint32_t i = 0; i < 10; ++i) EXPECT_EQ(h.rec.tokens["a"][i].id(), fake_token(40 + i)) << i;
  EXPECT_EQ(h.rec.finals["a"].usage().prompt_tokens(), 40u);
  EXPECT_EQ(h.rec.finals["a"].usage().completion_tokens(), 10u);
  EXPECT_EQ(h.free_blocks(), 64u);
  EXPECT_TRUE(h.core->idle());
  // The worker was told to forget the sequence.
  bool released = false;
  for (const auto& p : h.rec.history) released |= p.release_size() > 0;
  EXPECT_TRUE(released);
}

TEST(Core, PlansArePipelinedAndDecodeFromTheWorkersLastToken) {
  Harness h;
  h.core->add_worker(1, 64, 16, h.now);
  h.core->submit("c", h.request("a", 8, 5), h.now);
  h.core->tick(h.now);
  // Two plans in flight before any result: the prefill and the first decode.
  ASSERT_EQ(h.rec.plans[1].size(), 2u);
  const auto& decode = h.rec.plans[1][1].seqs(0);
  EXPECT_EQ(decode.tokens_size(), 0);  // "continue from your last sampled token"
  EXPECT_EQ(decode.start_pos(), 8u);
  h.drain();
  EXPECT_EQ(h.rec.tokens["a"].size(), 5u);
}

TEST(Core, DecodesRideEveryStepWhileALongPromptIsChunked) {
  SchedulerConfig sc;
  sc.prefill_chunk = 32;
  sc.max_batch_tokens = 64;
  Harness h(sc);
  h.core->add_worker(1, 256, 16, h.now);
  for (int i = 0; i < 4; ++i) h.core->submit("c", h.request("s" + std::to_string(i), 10, 200), h.now);
  h.core->tick(h.now);
  for (int i = 0; i < 12; ++i) h.answer(1);  // the four streams are decoding now
  h.core->submit("c", h.request("long", 8 * 32, 4), h.now);
  h.rec.history.clear();
  for (int i = 0; i < 40; ++i) h.answer(1);
  int steps_with_prefill = 0;
  for (const auto& plan : h.rec.history) {
    uint32_t decodes = 0, prefill = 0;
    for (const auto& s : plan.seqs()) (s.tokens_size() ? prefill += s.tokens_size() : ++decodes);
    if (prefill) ++steps_with_prefill;
    EXPECT_LE(prefill, 32u);
    EXPECT_LE(prefill + decodes, 64u);
    if (plan.seqs_size()) {
      EXPECT_GE(decodes, 4u) << "a running stream was left out of step " << plan.step_id();
    }
  }
  EXPECT_GE(steps_with_prefill, 8);
  EXPECT_EQ(h.core->stats().decode_stalls, 0u);
}

TEST(Core, CancelAtEveryStageFreesBlocksAndSendsOneFinal) {
  SchedulerConfig sc;
  sc.prefill_chunk = 16;
  sc.max_batch_tokens = 16;
  sc.max_running = 2;
  Harness h(sc);
  h.core->add_worker(1, 32, 16, h.now);
  h.core->submit("c", h.request("decoding", 8, 100), h.now);
  h.core->submit("c", h.request("prefilling", 100, 10), h.now);
  h.core->submit("c", h.request("queued", 8, 10), h.now);
  h.core->tick(h.now);
  for (int i = 0; i < 4; ++i) h.answer(1);
  EXPECT_GT(h.rec.tokens["decoding"].size(), 0u);
  EXPECT_EQ(h.rec.tokens["prefilling"].size(), 0u);
  for (const char* id : {"queued", "prefilling", "decoding"}) h.core->cancel("c", id, h.now);
  h.drain();
  for (const char* id : {"queued", "prefilling", "decoding"}) {
    EXPECT_EQ(h.rec.final_count[id], 1) << id;
    EXPECT_EQ(h.rec.finals[id].finish_reason(), v1::FINISH_REASON_CANCELLED) << id;
  }
  EXPECT_EQ(h.free_blocks(), 32u);
  // The same id runs again at once, at full speed.
  h.core->submit("c", h.request("decoding", 8, 3), h.now);
  h.core->tick(h.now);
  h.drain();
  EXPECT_EQ(h.rec.final_count["decoding"], 2);
  EXPECT_EQ(h.rec.finals["decoding"].finish_reason(), v1::FINISH_REASON_LENGTH);
}

TEST(Core, StopsOnEosAndOnATokenSequenceSpanningSteps) {
  Harness h;
  h.core->add_worker(1, 64, 16, h.now);
  v1::Submit eos = h.request("eos", 5, 50);
  eos.set_ignore_eos(false);
  h.core->submit("c", eos, h.now);
  v1::Submit seq = h.request("seq", 5, 50);
  auto* stop = seq.add_stop_token_sequences();
  stop->add_ids(fake_token(8));
  stop->add_ids(fake_token(9));
  h.core->submit("c", seq, h.now);
  h.core->tick(h.now);
  // EOS (id 2) as the 4th token of "eos"; "seq" gets the fake tokens.
  for (int i = 0; i < 100 && h.answer(1, [&](const v1::SeqPlan& sp) {
         const uint32_t pos = sp.start_pos() + (sp.tokens_size() ? sp.tokens_size() : 1);
         return pos == 8 && sp.seq_id() == 1 ? 2 : fake_token(pos);
       });) {
  }
  EXPECT_EQ(h.rec.finals["eos"].finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(h.rec.tokens["eos"].size(), 4u);
  EXPECT_EQ(h.rec.finals["seq"].finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(h.rec.tokens["seq"].size(), 5u);  // positions 5..9: the stop pair ends at 9
  EXPECT_EQ(h.free_blocks(), 64u);
}

TEST(Core, InvalidRequestsAndAFullQueueGetErrors) {
  SchedulerConfig sc;
  sc.max_queue = 2;
  Harness h(sc);
  h.core->submit("c", h.request("early", 5, 5), h.now);
  EXPECT_EQ(h.rec.finals["early"].error_code(), v1::ERROR_CODE_UNAVAILABLE);
  h.core->add_worker(1, 64, 16, h.now);
  h.core->submit("c", h.request("empty", 0, 5), h.now);
  EXPECT_EQ(h.rec.finals["empty"].error_code(), v1::ERROR_CODE_INVALID_ARGUMENT);
  h.core->submit("c", h.request("big", 5, 100000), h.now);
  EXPECT_EQ(h.rec.finals["big"].error_code(), v1::ERROR_CODE_INVALID_ARGUMENT);
  h.core->submit("c", h.request("q1", 5, 5), h.now);
  h.core->submit("c", h.request("q1", 5, 5), h.now);  // duplicate live id
  EXPECT_EQ(h.rec.final_count["q1"], 1);
  h.core->submit("c", h.request("q2", 5, 5), h.now);
  h.core->submit("c", h.request("q3", 5, 5), h.now);
  EXPECT_EQ(h.rec.finals["q3"].error_code(), v1::ERROR_CODE_OVERLOADED);
  h.core->tick(h.now);
  h.drain();
  EXPECT_EQ(h.rec.finals["q1"].finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(h.rec.finals["q2"].finish_reason(), v1::FINISH_REASON_LENGTH);
}

TEST(Core, PreemptionByRecomputeKeepsEveryStreamExact) {
  SchedulerConfig sc;
  sc.max_batch_tokens = 256;
  sc.prefill_chunk = 64;
  Harness h(sc);
  h.core->add_worker(1, 12, 16, h.now);  // 192 tokens of KV for four sequences that want 4 x 80
  for (int i = 0; i < 4; ++i) h.core->submit("c", h.request("p" + std::to_string(i), 20, 60), h.now);
  h.core->tick(h.now);
  h.drain();
  EXPECT_GT(h.core->stats().preemptions, 0u);
  for (int i = 0; i < 4; ++i) {
    const std::string id = "p" + std::to_string(i);
    ASSERT_EQ(h.rec.final_count[id], 1) << id;
    ASSERT_EQ(h.rec.tokens[id].size(), 60u) << id;
    for (uint32_t t = 0; t < 60; ++t) ASSERT_EQ(h.rec.tokens[id][t].id(), fake_token(20 + t)) << id << " token " << t;
  }
  EXPECT_EQ(h.free_blocks(), 12u);
}

TEST(Core, NoLeakAfterAnyMixOfFinishCancelPreemptAndWorkerLoss) {
  std::mt19937 rng(5);
  for (int round = 0; round < 20; ++round) {
    SchedulerConfig sc;
    sc.max_batch_tokens = 64 + rng() % 64;
    sc.prefill_chunk = 8 + rng() % 40;
    sc.pipeline_depth = 1 + rng() % 3;
    Harness h(sc);
    h.core->add_worker(1, 10 + rng() % 20, 16, h.now);
    h.core->add_worker(2, 10 + rng() % 20, 16, h.now);
    int submitted = 0;
    for (int op = 0; op < 400; ++op) {
      const int what = rng() % 10;
      if (what < 3) {
        h.core->submit("c" + std::to_string(rng() % 3),
                       h.request("r" + std::to_string(submitted++), 1 + rng() % 90, 1 + rng() % 60), h.now);
      } else if (what < 4 && submitted) {
        h.core->cancel("c" + std::to_string(rng() % 3), "r" + std::to_string(rng() % submitted), h.now);
      } else if (what == 4 && round % 4 == 0 && op == 200) {
        h.core->remove_worker(2, h.now);
        h.rec.plans.erase(2);
      } else {
        h.answer(1 + rng() % 2);
      }
      h.core->tick(h.now);
    }
    h.core->client_gone("c0", h.now);
    h.drain();
    for (int i = 0; i < submitted; ++i) EXPECT_EQ(h.rec.final_count["r" + std::to_string(i)], 1) << "r" << i;
    EXPECT_TRUE(h.core->idle()) << "round " << round;
    for (const auto& w : h.core->workers())
      EXPECT_EQ(w.blocks_free + w.blocks_cached, w.blocks_total) << "round " << round;
  }
}

// ---- Disaggregation: prefill workers hand sequences to decode workers.

WorkerInfo role(Role r, uint32_t blocks) { return WorkerInfo{r, blocks, 16, r == Role::kDecode ? "ipc://kv" : ""}; }

// Tokens a request gets with one worker of role both: the reference for the split.
std::vector<int32_t> reference_tokens(uint32_t prompt, uint32_t max_tokens) {
  Harness h;
  h.core->add_worker(1, 64, 16, h.now);
  h.core->submit("c", h.request("a", prompt, max_tokens), h.now);
  h.core->tick(h.now);
  h.drain();
  std::vector<int32_t> out;
  for (const auto& t : h.rec.tokens["a"]) out.push_back(t.id());
  return out;
}

// Worker 1 prefill, worker 2 decode; request "a" (40 prompt tokens, 10 to generate) has
// its prompt done and its handoff ordered.
std::unique_ptr<Harness> prefilled_split(SchedulerConfig sc = {}) {
  auto h = std::make_unique<Harness>(sc);
  h->core->add_worker(1, role(Role::kPrefill, 64), h->now);
  h->core->add_worker(2, role(Role::kDecode, 64), h->now);
  h->core->submit("c", h->request("a", 40, 10), h->now);
  h->core->tick(h->now);
  while (h->answer(1)) {
  }
  return h;
}

std::vector<int32_t> ids(const std::vector<v1::TokenEvent>& events) {
  std::vector<int32_t> out;
  for (const auto& t : events) out.push_back(t.id());
  return out;
}

TEST(CoreSplit, PrefillStreamsTheFirstTokenThenHandsTheKvToTheDecodeWorker) {
  Harness h;
  h.core->add_worker(1, role(Role::kPrefill, 64), h.now);
  h.core->add_worker(2, role(Role::kDecode, 64), h.now);
  ASSERT_TRUE(h.core->ready());
  h.core->submit("c", h.request("a", 40, 10), h.now);
  h.core->tick(h.now);
  while (h.answer(1)) {
  }
  // The first token went to the client before any KV moved.
  ASSERT_EQ(h.rec.tokens["a"].size(), 1u);
  ASSERT_EQ(h.rec.commands[1].size(), 1u);
  ASSERT_EQ(h.rec.commands[2].size(), 1u);
  const v1::KvSend send = h.rec.commands[1][0].kv_send();
  const v1::KvExpect expect = h.rec.commands[2][0].kv_expect();
  EXPECT_EQ(send.transfer_id(), expect.transfer_id());
  EXPECT_EQ(send.dest_seq_id(), expect.seq_id());
  EXPECT_EQ(send.dest_endpoint(), "ipc://kv");
  EXPECT_EQ(send.positions(), 40u);
  EXPECT_EQ(expect.blocks_size(), 3);  // 40 positions in blocks of 16
  EXPECT_TRUE(h.rec.plans[2].empty()) << "the decode worker must wait for the KV";
  EXPECT_EQ(h.core->workers()[0].blocks_free, 64u - 3u) << "the source blocks stay until the ack";
  h.rec.commands[1].clear();
  ASSERT_EQ(h.deliver(2), 1);
  // The prefill worker's blocks are free again, and it is told to forget the sequence.
  EXPECT_EQ(h.core->workers()[0].blocks_free + h.core->workers()[0].blocks_cached, 64u);
  EXPECT_EQ(h.core->workers()[0].blocks_cached, 2u) << "the two full prompt blocks stay cached";
  ASSERT_FALSE(h.rec.plans[1].empty());
  EXPECT_EQ(h.rec.plans[1].back().release_size(), 1);
  ASSERT_FALSE(h.rec.plans[2].empty());
  const v1::SeqPlan& first = h.rec.plans[2].front().seqs(0);
  EXPECT_EQ(first.seq_id(), expect.seq_id());
  EXPECT_EQ(first.start_pos(), 40u);
  EXPECT_EQ(first.tokens_size(), 0) << "continues from the token the prefill worker sampled";
  EXPECT_FALSE(first.has_sampling()) << "the transfer carried the sampling state";
  h.drain_split({2});
  EXPECT_EQ(h.rec.final_count["a"], 1);
  EXPECT_EQ(ids(h.rec.tokens["a"]), reference_tokens(40, 10));
  EXPECT_EQ(h.core->stats().handoffs, 1u);
  EXPECT_EQ(h.core->stats().handoff_bytes, 1000u);
  for (const auto& w : h.core->workers()) EXPECT_EQ(w.blocks_free + w.blocks_cached, w.blocks_total);
}

// #18 item 3: two runs of the scheduler (a restart) order transfers under ids that do not meet
// and under epochs that differ, so a decode worker never takes a transfer of the other run.
TEST(CoreSplit, TwoSchedulerRunsGiveDisjointTransferIdsAndTheirOwnEpochs) {
  auto a = prefilled_split(), b = prefilled_split();
  const v1::KvExpect ea = a->rec.commands[2][0].kv_expect(), eb = b->rec.commands[2][0].kv_expect();
  EXPECT_EQ(a->rec.commands[1][0].kv_send().scheduler_epoch(), ea.scheduler_epoch()) << "KvSend carries KvExpect's";
  EXPECT_NE(ea.scheduler_epoch(), 0u);
  EXPECT_NE(ea.scheduler_epoch(), eb.scheduler_epoch());
  // Ids count up from a random 63-bit base: the first 2^32 of each run do not meet.
  const uint64_t gap =
      ea.transfer_id() > eb.transfer_id() ? ea.transfer_id() - eb.transfer_id() : eb.transfer_id() - ea.transfer_id();
  EXPECT_GT(gap, uint64_t{1} << 32) << ea.transfer_id() << " " << eb.transfer_id();
}

TEST(CoreSplit, PicksTheLeastLoadedDecodeWorkerTiesToFewestRunning) {
  Harness h;
  h.core->add_worker(1, role(Role::kPrefill, 256), h.now);
  h.core->add_worker(2, role(Role::kDecode, 64), h.now);
  h.core->add_worker(3, role(Role::kDecode, 64), h.now);
  h.core->submit("c", h.request("big", 200, 50), h.now);  // 13 blocks on whichever decode worker
  h.core->tick(h.now);
  while (h.answer(1)) {
  }
  const uint32_t first = h.rec.commands[2].empty() ? 3 : 2;
  ASSERT_EQ(h.rec.commands[first].size(), 1u);
  h.deliver(first);
  // The next two go to the other worker (less loaded), then ties break by running count.
  h.core->submit("c", h.request("s1", 20, 50), h.now);
  h.core->tick(h.now);
  for (int i = 0; i < 20 && h.rec.commands[5 - first].empty(); ++i) h.answer(1);
  EXPECT_EQ(h.rec.commands[5 - first].size(), 1u) << "the emptier decode worker takes it";
  EXPECT_TRUE(h.rec.commands[first].empty());
}

TEST(CoreSplit, CancelMidTransferFreesBothSidesAndIgnoresTheLateAck) {
  auto hp = prefilled_split();
  Harness& h = *hp;
  ASSERT_EQ(h.rec.commands[2].size(), 1u);
  h.core->cancel("c", "a", h.now);
  h.core->tick(h.now);
  EXPECT_EQ(h.rec.final_count["a"], 1);
  EXPECT_EQ(h.rec.finals["a"].finish_reason(), v1::FINISH_REASON_CANCELLED);
  for (const auto& w : h.core->workers()) EXPECT_EQ(w.blocks_free + w.blocks_cached, w.blocks_total);
  // Both workers are told to forget their side.
  ASSERT_FALSE(h.rec.plans[2].empty());
  EXPECT_EQ(h.rec.plans[2].back().release(0), h.rec.commands[2][0].kv_expect().seq_id());
  EXPECT_EQ(h.deliver(2), 1);  // the ack arrives late: ignored
  EXPECT_EQ(h.rec.final_count["a"], 1);
  h.drain_split({2});
  EXPECT_TRUE(h.core->idle());
  for (const auto& w : h.core->workers()) EXPECT_EQ(w.blocks_free + w.blocks_cached, w.blocks_total);
}

TEST(CoreSplit, AHandoffThatTimesOutIsRecomputedWithoutDuplicatesOrGaps) {
  SchedulerConfig sc;
  sc.handoff_timeout_ms = 50;
  auto hp = prefilled_split(sc);
  Harness& h = *hp;
  ASSERT_EQ(h.rec.commands[2].size(), 1u);
  h.rec.commands[2].clear();  // the transfer is lost
  h.now += 60'000;
  h.core->tick(h.now);
  EXPECT_EQ(h.core->stats().handoff_failures, 1u);
  h.drain_split({2});
  EXPECT_EQ(h.rec.final_count["a"], 1);
  EXPECT_EQ(h.rec.finals["a"].finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(ids(h.rec.tokens["a"]), reference_tokens(40, 10));
  for (const auto& w : h.core->workers()) EXPECT_EQ(w.blocks_free + w.blocks_cached, w.blocks_total);
}

TEST(CoreSplit, LosingADecodeWorkerFailsOverOrEndsWithAnError) {
  Harness h;
  h.core->add_worker(1, role(Role::kPrefill, 256), h.now);
  h.core->add_worker(2, role(Role::kDecode, 128), h.now);
  h.core->add_worker(3, role(Role::kDecode, 128), h.now);
  for (int i = 0; i < 6; ++i) h.core->submit("c", h.request("r" + std::to_string(i), 30 + 7 * i, 20), h.now);
  h.core->tick(h.now);
  for (int i = 0; i < 12; ++i) {  // some decode, some mid-transfer
    h.answer(1);
    h.deliver(2);
    h.deliver(3);
    h.answer(2);
    h.answer(3);
  }
  h.core->remove_worker(3, h.now);
  h.rec.plans.erase(3);
  h.rec.commands.erase(3);
  h.core->tick(h.now);
  h.drain_split({2});
  for (int i = 0; i < 6; ++i) {
    const std::string id = "r" + std::to_string(i);
    ASSERT_EQ(h.rec.final_count[id], 1) << id;
    EXPECT_EQ(h.rec.finals[id].finish_reason(), v1::FINISH_REASON_LENGTH) << id;
    EXPECT_EQ(ids(h.rec.tokens[id]), reference_tokens(30 + 7 * i, 20)) << id;
  }
  for (const auto& w : h.core->workers()) EXPECT_EQ(w.blocks_free + w.blocks_cached, w.blocks_total);

  // The last decode worker goes: what runs ends with an error, new requests are refused.
  h.core->submit("c", h.request("x", 30, 20), h.now);
  h.core->tick(h.now);
  h.answer(1);
  h.core->remove_worker(2, h.now);
  h.core->tick(h.now);
  EXPECT_EQ(h.rec.final_count["x"], 1);
  EXPECT_EQ(h.rec.finals["x"].error_code(), v1::ERROR_CODE_UNAVAILABLE);
  EXPECT_FALSE(h.core->ready());
  h.core->submit("c", h.request("y", 30, 20), h.now);
  EXPECT_EQ(h.rec.finals["y"].error_code(), v1::ERROR_CODE_UNAVAILABLE);
  EXPECT_NE(h.rec.finals["y"].error_message().find("decode"), std::string::npos);
  EXPECT_EQ(h.core->workers()[0].blocks_free + h.core->workers()[0].blocks_cached, h.core->workers()[0].blocks_total);
}

TEST(CoreSplit, LosingThePrefillWorkerMidTransferRecomputesOnAnother) {
  auto hp = prefilled_split();
  Harness& h = *hp;
  ASSERT_EQ(h.rec.commands[2].size(), 1u);
  h.rec.commands[2].clear();
  h.core->add_worker(4, role(Role::kPrefill, 64), h.now);
  h.core->remove_worker(1, h.now);
  h.rec.plans.erase(1);
  h.core->tick(h.now);
  h.drain_split({2});
  EXPECT_EQ(h.rec.final_count["a"], 1);
  EXPECT_EQ(ids(h.rec.tokens["a"]), reference_tokens(40, 10));
  for (const auto& w : h.core->workers()) EXPECT_EQ(w.blocks_free + w.blocks_cached, w.blocks_total);
}

// A hybrid decode worker (state slots): it holds at most its slots, handed-off sequences
// included, so a second handoff waits for the first sequence to finish; the release of the
// finished one goes first in the next KvExpect (a worker takes a state slot at KvExpect, so the
// slot the scheduler counts free must be free there), and every slot comes back.
TEST(CoreSplit, AHybridDecodeWorkerHoldsAtMostItsSlotsAndReleasesGoFirstInTheNextKvExpect) {
  Harness h;
  WorkerInfo prefill = role(Role::kPrefill, 64), decode = role(Role::kDecode, 64);
  prefill.state_slots = 4;
  decode.state_slots = 1;
  h.core->add_worker(1, prefill, h.now);
  h.core->add_worker(2, decode, h.now);
  h.core->submit("c", h.request("a", 40, 3), h.now);
  h.core->submit("c", h.request("b", 40, 3), h.now);
  h.core->tick(h.now);
  while (h.answer(1)) {
  }
  ASSERT_EQ(h.rec.commands[2].size(), 1u) << "one slot: one handoff at a time";
  const v1::KvExpect first = h.rec.commands[2][0].kv_expect();
  EXPECT_EQ(first.release_size(), 0);
  auto view = [&](uint32_t id) {
    for (const auto& w : h.core->workers())
      if (w.id == id) return w;
    return Core::WorkerView{};
  };
  EXPECT_EQ(view(2).state_slots_free, 0u);
  ASSERT_EQ(h.deliver(2), 1);
  while (h.rec.commands[2].empty() && h.answer(2)) {
  }
  ASSERT_EQ(h.rec.commands[2].size(), 1u) << "the second handoff once the first sequence finished";
  const v1::KvExpect second = h.rec.commands[2][0].kv_expect();
  ASSERT_EQ(second.release_size(), 1);
  EXPECT_EQ(second.release(0), first.seq_id());
  for (const v1::StepPlan& p : h.rec.history)
    for (uint64_t id : p.release()) EXPECT_NE(id, first.seq_id()) << "released once, with the KvExpect";
  h.drain_split({2});
  EXPECT_EQ(h.rec.final_count["a"], 1);
  EXPECT_EQ(h.rec.final_count["b"], 1);
  EXPECT_EQ(ids(h.rec.tokens["b"]), reference_tokens(40, 3));
  for (uint32_t id : {1u, 2u}) EXPECT_EQ(view(id).state_slots_free, view(id).state_slots_total) << "worker " << id;
}

TEST(CoreSplit, ARefusedTransferEndsTheRequestWithAnError) {
  auto hp = prefilled_split();
  Harness& h = *hp;
  h.deliver(2, /*ok=*/false);
  EXPECT_EQ(h.rec.final_count["a"], 1);
  EXPECT_EQ(h.rec.finals["a"].error_code(), v1::ERROR_CODE_INTERNAL);
  EXPECT_NE(h.rec.finals["a"].error_message().find("format differs"), std::string::npos);
  h.drain_split({2});
  for (const auto& w : h.core->workers()) EXPECT_EQ(w.blocks_free + w.blocks_cached, w.blocks_total);
}

TEST(CoreSplit, NoLeakAfterAnyMixOfHandoffsCancelsTimeoutsAndWorkerLoss) {
  for (int round = 0; round < 20; ++round) {
    std::mt19937 rng(round);
    SchedulerConfig sc;
    sc.max_batch_tokens = 16 + rng() % 64;
    sc.prefill_chunk = 8 + rng() % 40;
    sc.pipeline_depth = 1 + rng() % 3;
    sc.handoff_timeout_ms = 20;
    Harness h(sc);
    h.core->add_worker(1, role(Role::kPrefill, 10 + rng() % 20), h.now);
    h.core->add_worker(2, role(Role::kDecode, 10 + rng() % 20), h.now);
    h.core->add_worker(3, role(Role::kDecode, 10 + rng() % 20), h.now);
    int submitted = 0;
    for (int op = 0; op < 400; ++op) {
      const int what = rng() % 12;
      if (what < 3) {
        h.core->submit("c" + std::to_string(rng() % 3),
                       h.request("r" + std::to_string(submitted++), 1 + rng() % 90, 1 + rng() % 60), h.now);
      } else if (what < 4 && submitted) {
        h.core->cancel("c" + std::to_string(rng() % 3), "r" + std::to_string(rng() % submitted), h.now);
      } else if (what == 4 && op == 200) {
        h.core->remove_worker(3, h.now);
        h.rec.plans.erase(3);
        h.rec.commands.erase(3);
      } else if (what == 5) {
        if (rng() % 4 == 0) h.rec.commands[2 + rng() % 2].clear();  // transfers lost: timeouts
        h.now += 30'000;
      } else if (what < 8) {
        h.deliver(2 + rng() % 2);
      } else {
        h.answer(1 + rng() % 3);
      }
      h.core->tick(h.now);
    }
    h.core->client_gone("c0", h.now);
    for (int i = 0; i < 50 && !h.core->idle(); ++i) {
      h.drain_split({2, 3}, 10000);
      h.now += 30'000;
      h.core->tick(h.now);
    }
    for (int i = 0; i < submitted; ++i) EXPECT_EQ(h.rec.final_count["r" + std::to_string(i)], 1) << "r" << i;
    EXPECT_TRUE(h.core->idle()) << "round " << round;
    for (const auto& w : h.core->workers())
      EXPECT_EQ(w.blocks_free + w.blocks_cached, w.blocks_total) << "round " << round;
  }
}

// ---- Prefix cache.

v1::Submit with_prompt(const std::string& id, std::vector<int32_t> prompt, uint32_t max_tokens) {
  v1::Submit s;
  s.set_request_id(id);
  for (int32_t t : prompt) s.mutable_tokens()->add_ids(t);
  s.set_max_tokens(max_tokens);
  s.set_ignore_eos(true);
  s.set_stream(true);
  return s;
}

std::vector<int32_t> prefixed(uint32_t prefix, uint32_t suffix, int32_t salt) {
  std::vector<int32_t> p;
  for (uint32_t i = 0; i < prefix; ++i) p.push_back(3 + static_cast<int32_t>(i % 200));
  for (uint32_t i = 0; i < suffix; ++i) p.push_back(210 + (salt * 7 + static_cast<int32_t>(i)) % 40);
  return p;
}

TEST(CorePrefixCache, ASharedPrefixIsNotPrefilledAgain) {
  Harness h;
  h.core->add_worker(1, 64, 16, h.now);
  h.core->submit("c", with_prompt("a", prefixed(64, 10, 1), 5), h.now);
  h.core->tick(h.now);
  h.drain();
  EXPECT_EQ(h.rec.finals["a"].usage().cached_prompt_tokens(), 0u);
  const size_t plans_before = h.rec.history.size();
  h.core->submit("c", with_prompt("b", prefixed(64, 10, 2), 5), h.now);
  h.core->tick(h.now);
  h.drain();
  // b's first plan starts after the 64 cached positions and carries them as history.
  const v1::SeqPlan* first = nullptr;
  for (size_t i = plans_before; i < h.rec.history.size() && !first; ++i)
    for (const auto& sp : h.rec.history[i].seqs())
      if (sp.tokens_size() > 0) first = &sp;
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->start_pos(), 64u);
  EXPECT_EQ(first->tokens_size(), 10);
  ASSERT_EQ(first->history_size(), 64);
  EXPECT_EQ(first->history(63), prefixed(64, 0, 0)[63]);
  EXPECT_EQ(first->new_blocks(0), h.rec.history[0].seqs(0).new_blocks(0)) << "a's first block, shared";
  EXPECT_EQ(h.rec.finals["b"].usage().cached_prompt_tokens(), 64u);
  EXPECT_EQ(ids(h.rec.tokens["b"]).size(), 5u);
  EXPECT_EQ(h.core->stats().prompt_tokens, 148u);
  EXPECT_EQ(h.core->stats().cached_prompt_tokens, 64u);
  const auto w = h.core->workers()[0];
  EXPECT_EQ(w.blocks_free + w.blocks_cached, w.blocks_total);
  EXPECT_GT(w.blocks_cached, 0u);
}

TEST(CorePrefixCache, AWholePromptInTheCacheStillComputesItsLastPosition) {
  Harness h;
  h.core->add_worker(1, 64, 16, h.now);
  h.core->submit("c", with_prompt("a", prefixed(64, 0, 0), 3), h.now);
  h.core->tick(h.now);
  h.drain();
  h.core->submit("c", with_prompt("b", prefixed(64, 0, 0), 3), h.now);
  h.core->tick(h.now);
  h.drain();
  EXPECT_EQ(h.rec.finals["b"].usage().cached_prompt_tokens(), 48u) << "the last block is recomputed for its logits";
  EXPECT_EQ(ids(h.rec.tokens["b"]), ids(h.rec.tokens["a"]));
}

TEST(CorePrefixCache, RequestsGoWhereTheirPrefixIsUnlessThatWorkerIsBusy) {
  SchedulerConfig sc;
  sc.cache_balance_slack = 2;
  Harness h(sc);
  h.core->add_worker(1, 256, 16, h.now);
  h.core->add_worker(2, 256, 16, h.now);
  h.core->submit("c", with_prompt("a", prefixed(64, 4, 1), 4), h.now);
  h.core->tick(h.now);
  h.drain();
  const uint32_t home = h.core->workers()[0].blocks_cached > 0 ? 1 : 2;  // where a ran
  // The worker with the prefix takes each request while it runs at most `slack` (2) more
  // sequences than the other: b0, b1, b2 (0, 1, 2 beyond), then b3 goes to the other
  // (3 > 0 + 2), then b4 home again (3 <= 1 + 2).
  for (int i = 0; i < 5; ++i)
    h.core->submit("c", with_prompt("b" + std::to_string(i), prefixed(64, 4, 10 + i), 50), h.now);
  h.core->tick(h.now);
  uint32_t on_home = 0, elsewhere = 0;
  for (const auto& w : h.core->workers()) (w.id == home ? on_home : elsewhere) = w.running;
  EXPECT_EQ(on_home, 4u);
  EXPECT_EQ(elsewhere, 1u);
  h.drain();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(h.rec.final_count["b" + std::to_string(i)], 1);
}

// Rings: b shares a's first 96 positions. Its first plan starts at 96 with them as history, the
// full blocks a computed, and a ring from block 4 ((96 + 1 - 32) / 16) whose first two blocks are
// the ring blocks a wrote for logical blocks 4 and 5, then fresh ones (b writes only those; a's
// ring block of its last, partial block 6 was never published: freed, it may be b's again).
TEST(CorePrefixCache, WithRingsAHitSendsTheSharedWindowThenFreshRingBlocks) {
  SchedulerConfig sc;
  sc.prefill_chunk = 16;
  Harness h(sc);
  WorkerInfo info{Role::kBoth, 128, 16, {}};
  info.ring_blocks = 32;
  info.ring_window = 32;
  h.core->add_worker(1, info, h.now);
  h.core->submit("c", with_prompt("a", prefixed(96, 10, 1), 5), h.now);
  h.core->tick(h.now);
  h.drain();
  std::map<uint32_t, int32_t> a_ring;  // a's ring block per logical block
  for (const auto& plan : h.rec.history)
    for (const auto& sp : plan.seqs())
      for (int i = 0; i < sp.ring_blocks_size(); ++i) a_ring[sp.ring_first() + i] = sp.ring_blocks(i);
  const size_t plans_before = h.rec.history.size();
  h.core->submit("c", with_prompt("b", prefixed(96, 10, 2), 5), h.now);
  h.core->tick(h.now);
  const v1::SeqPlan first = h.rec.history.at(plans_before).seqs(0);
  h.drain();
  EXPECT_EQ(first.start_pos(), 96u);
  EXPECT_EQ(first.history_size(), 96);
  EXPECT_EQ(first.new_blocks(5), h.rec.history[0].seqs(0).new_blocks(5)) << "a's full blocks, shared";
  EXPECT_EQ(first.ring_first(), 4u);
  ASSERT_GE(first.ring_blocks_size(), 3);
  EXPECT_EQ(first.ring_blocks(0), a_ring.at(4));
  EXPECT_EQ(first.ring_blocks(1), a_ring.at(5));
  for (int i = 2; i < first.ring_blocks_size(); ++i)  // fresh: none of the windows a published (blocks 0..5)
    for (uint32_t l = 0; l < 6; ++l) EXPECT_NE(first.ring_blocks(i), a_ring.at(l)) << i << " " << l;
  EXPECT_EQ(h.rec.finals["b"].usage().cached_prompt_tokens(), 96u);
  const auto w = h.core->workers()[0];
  EXPECT_EQ(w.ring_free + w.ring_cached, w.ring_total);
  EXPECT_GT(w.ring_cached, 0u);
}

TEST(CorePrefixCache, OffMeansNothingIsCached) {
  SchedulerConfig sc;
  sc.prefix_cache = false;
  Harness h(sc);
  h.core->add_worker(1, 64, 16, h.now);
  for (const char* id : {"a", "b"}) {
    h.core->submit("c", with_prompt(id, prefixed(64, 10, 1), 5), h.now);
    h.core->tick(h.now);
    h.drain();
    EXPECT_EQ(h.rec.finals[id].usage().cached_prompt_tokens(), 0u);
  }
  EXPECT_EQ(h.core->workers()[0].blocks_cached, 0u);
  EXPECT_EQ(h.core->workers()[0].blocks_free, 64u);
  EXPECT_EQ(ids(h.rec.tokens["a"]), ids(h.rec.tokens["b"]));
}

// With prefill/decode split, the decode worker's copy of a finished conversation (prompt
// and answer) serves as cache too: the next turn, whose prompt is that history plus a few
// new tokens, continues on that decode worker instead of computing it all again.
TEST(CorePrefixCache, ANextTurnContinuesOnTheDecodeWorkerThatHoldsItsHistory) {
  Harness h;
  h.core->add_worker(1, role(Role::kPrefill, 64), h.now);
  h.core->add_worker(2, role(Role::kDecode, 64), h.now);
  const std::vector<int32_t> first = prefixed(40, 0, 0);
  h.core->submit("c", with_prompt("turn1", first, 30), h.now);
  h.core->tick(h.now);
  h.drain_split({2});
  ASSERT_EQ(h.rec.final_count["turn1"], 1);
  std::vector<int32_t> second = first;
  for (const auto& t : h.rec.tokens["turn1"]) second.push_back(t.id());
  for (int i = 0; i < 10; ++i) second.push_back(250 + i);  // 80 tokens: 64 cached on the decode worker
  h.rec.commands.clear();
  h.core->submit("c", with_prompt("turn2", second, 5), h.now);
  h.core->tick(h.now);
  ASSERT_FALSE(h.rec.plans[2].empty()) << "placed on the decode worker";
  const v1::SeqPlan& sp = h.rec.plans[2].front().seqs(0);
  EXPECT_EQ(sp.start_pos(), 64u);
  EXPECT_EQ(sp.tokens_size(), 16);
  EXPECT_EQ(sp.history_size(), 64);
  EXPECT_TRUE(h.rec.plans[1].empty()) << "nothing for the prefill worker";
  h.drain_split({2});
  EXPECT_TRUE(h.rec.commands[1].empty() && h.rec.commands[2].empty()) << "no handoff: it stays where it is";
  EXPECT_EQ(h.rec.finals["turn2"].usage().cached_prompt_tokens(), 64u);
  EXPECT_EQ(ids(h.rec.tokens["turn2"]).size(), 5u);
  // A prompt the decode worker holds less of than the prefill worker goes to the prefill worker.
  h.core->submit("c", with_prompt("other", prefixed(40, 20, 3), 5), h.now);
  h.core->tick(h.now);
  EXPECT_FALSE(h.rec.plans[1].empty());
  h.drain_split({2});
  EXPECT_EQ(h.rec.final_count["other"], 1);
  for (const auto& w : h.core->workers()) EXPECT_EQ(w.blocks_free + w.blocks_cached, w.blocks_total);
}

}  // namespace
}  // namespace tandem::scheduler

namespace tandem::scheduler {
namespace {

// A worker whose KV keeps an F32 window: every sequence also takes its tail blocks, named
// to the worker in its first plan (or its KvExpect), and they come back with the sequence.
TEST(CoreSplit, TailBlocksAreAllocatedSentAndFreedWithTheSequence) {
  Harness h;
  WorkerInfo prefill{Role::kPrefill, 64, 16, {}, 6}, decode{Role::kDecode, 64, 16, "ipc://kv", 6};
  h.core->add_worker(1, prefill, h.now);
  h.core->add_worker(2, decode, h.now);
  h.core->submit("c", h.request("a", 40, 10), h.now);
  h.core->tick(h.now);
  ASSERT_FALSE(h.rec.plans[1].empty());
  const v1::SeqPlan& first = h.rec.plans[1].front().seqs(0);
  EXPECT_EQ(first.new_blocks_size(), 3);
  ASSERT_EQ(first.tail_blocks_size(), 6);
  std::set<int32_t> prefill_ids(first.new_blocks().begin(), first.new_blocks().end());
  for (int32_t b : first.tail_blocks())
    EXPECT_TRUE(prefill_ids.insert(b).second) << "tail block " << b << " is taken twice";
  EXPECT_EQ(h.core->workers()[0].blocks_free, 64u - 3u - 6u);
  while (h.answer(1)) {
  }
  ASSERT_EQ(h.rec.commands[2].size(), 1u);
  const v1::KvExpect expect = h.rec.commands[2][0].kv_expect();
  EXPECT_EQ(expect.blocks_size(), 3);
  EXPECT_EQ(expect.tail_blocks_size(), 6);
  EXPECT_EQ(h.core->workers()[1].blocks_free, 64u - 3u - 6u);
  h.drain_split({2});
  EXPECT_EQ(h.rec.final_count["a"], 1);
  for (const auto& w : h.core->workers()) EXPECT_EQ(w.blocks_free + w.blocks_cached, w.blocks_total);
  // Later plans do not repeat the tail.
  for (const auto& plan : h.rec.history)
    for (const auto& s : plan.seqs())
      if (s.start_pos() > 0) EXPECT_EQ(s.tail_blocks_size(), 0);
}

// Rings across a handoff (docs/WINDOWS.md): a prompt of 90 tokens in chunks of 32 on a prefill
// worker whose ring moves on chunk by chunk; the decode worker's ring is reserved for the window
// of its first query only (position 90 sees 59 .. 90: logical blocks 3 .. 5), the prefill worker
// is told to send from block 3 (its own ring starts before: its last chunk's queries came first), the decode worker's
// first plan carries that ring, and every block of both pools of both workers comes back.
TEST(CoreSplit, WithRingsTheDecodeWorkerReservesTheWindowOfItsFirstQueryOnly) {
  SchedulerConfig sc;
  sc.prefill_chunk = 32;
  Harness h(sc);
  WorkerInfo prefill = role(Role::kPrefill, 64), decode = role(Role::kDecode, 64);
  prefill.ring_blocks = decode.ring_blocks = 16;
  prefill.ring_window = decode.ring_window = 32;
  h.core->add_worker(1, prefill, h.now);
  h.core->add_worker(2, decode, h.now);
  h.core->submit("c", h.request("a", 90, 10), h.now);
  h.core->tick(h.now);
  uint32_t sender_first = 0;
  while (!h.rec.plans[1].empty()) {
    if (h.rec.plans[1].front().seqs_size() > 0) sender_first = h.rec.plans[1].front().seqs(0).ring_first();
    h.answer(1);
  }
  ASSERT_EQ(h.rec.commands[1].size(), 1u);
  ASSERT_EQ(h.rec.commands[2].size(), 1u);
  const v1::KvSend send = h.rec.commands[1][0].kv_send();
  const v1::KvExpect expect = h.rec.commands[2][0].kv_expect();
  EXPECT_EQ(expect.blocks_size(), 6);
  EXPECT_EQ(expect.ring_first(), 3u);
  EXPECT_EQ(expect.ring_blocks_size(), 3);
  EXPECT_EQ(send.ring_first(), 3u);
  EXPECT_LE(sender_first, 3u) << "the prefill worker's ring holds the blocks to send";
  EXPECT_EQ(h.core->workers()[1].ring_free, 16u - 3u);
  h.rec.commands[1].clear();
  ASSERT_EQ(h.deliver(2), 1);
  ASSERT_FALSE(h.rec.plans[2].empty());
  const v1::SeqPlan& first = h.rec.plans[2].front().seqs(0);
  EXPECT_EQ(first.start_pos(), 90u);
  EXPECT_EQ(first.ring_first(), 3u);
  EXPECT_EQ(std::vector<int32_t>(first.ring_blocks().begin(), first.ring_blocks().end()),
            std::vector<int32_t>(expect.ring_blocks().begin(), expect.ring_blocks().end()));
  h.drain_split({2});
  EXPECT_EQ(h.rec.final_count["a"], 1);
  for (const auto& w : h.core->workers()) {
    EXPECT_EQ(w.blocks_free + w.blocks_cached, w.blocks_total);
    EXPECT_EQ(w.ring_free + w.ring_cached, w.ring_total);
  }
}

// A Sink with prompt threads: prompts handed over wait in `jobs` until the test answers them.
struct AsyncRecorder : Recorder {
  std::vector<std::pair<uint64_t, PromptInput>> jobs;
  bool renders_async() const override { return true; }
  void render_async(uint64_t job, PromptInput input) override { jobs.emplace_back(job, std::move(input)); }
  std::set<uint64_t> cancelled;
  void cancel_render(uint64_t job) override { cancelled.insert(job); }
};

struct AsyncHarness {
  Harness tiny;  // the tiny model's config and vocabulary (its own core is not used)
  AsyncRecorder rec;
  std::unique_ptr<Core> core;
  int64_t now = 1'000'000;
  AsyncHarness() {
    SchedulerConfig sc;
    sc.inline_prompt_bytes = 200;
    core = std::make_unique<Core>(sc, tiny.config, renderer(), rec);
    core->add_worker(1, 64, 16, now);
  }
  PromptRenderer renderer() const { return PromptRenderer(tiny.tokenizer, "{{ messages[0]['content'] }}"); }
  v1::Submit text(const std::string& id, size_t bytes) {
    v1::Submit s;
    s.set_request_id(id);
    s.set_text(std::string(bytes, 'x'));
    s.set_max_tokens(4);
    s.set_ignore_eos(true);
    s.set_stream(true);
    return s;
  }
  // Answers prompt job i as the pool would: rendered with the same renderer.
  void render(size_t i) {
    core->on_prompt(rec.jobs[i].first, renderer().render(rec.jobs[i].second), now);
    core->tick(now);
  }
};

TEST(CorePrompts, LongTextIsTokenizedOffThePlanningThreadThenRuns) {
  AsyncHarness h;
  h.core->submit("c", h.text("short", 100), h.now);  // short text: tokenized inline, planned at once
  h.core->submit("c", h.text("long", 400), h.now);
  h.core->tick(h.now);
  ASSERT_EQ(h.rec.jobs.size(), 1u);
  EXPECT_EQ(h.rec.jobs[0].second.text.size(), 400u);
  EXPECT_EQ(h.core->queued(), 1u);  // "long" waits for its ids, counted as waiting
  EXPECT_EQ(h.core->live_requests("c"), 2u);
  EXPECT_FALSE(h.core->idle());
  h.render(0);
  for (int i = 0; i < 1000 && !h.rec.plans[1].empty(); ++i) {
    v1::StepPlan plan = h.rec.plans[1].front();
    h.rec.plans[1].pop_front();
    v1::StepResult res;
    res.set_step_id(plan.step_id());
    for (const auto& sp : plan.seqs()) {
      if (!sp.sample()) continue;
      v1::SeqResult* r = res.add_seqs();
      r->set_seq_id(sp.seq_id());
      r->set_token(5);
    }
    h.now += 1000;
    h.core->on_result(1, test_wire::plain(res), h.now);
    h.core->tick(h.now);
  }
  EXPECT_EQ(h.rec.finals["long"].finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(h.rec.finals["long"].usage().prompt_tokens(), 401u);  // BOS + one token per byte
  EXPECT_EQ(h.rec.finals["short"].finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_TRUE(h.core->idle());
}

TEST(CorePrompts, EveryRequestWaitingForItsIdsEndsWithExactlyOneFinalEvent) {
  AsyncHarness h;
  h.core->submit("c", h.text("cancelled", 1000), h.now);
  h.core->submit("c", h.text("too-long", 600), h.now);  // 601 tokens: beyond the context of 512
  v1::Submit chat;
  chat.set_request_id("bad-role");
  chat.set_max_tokens(2);
  chat.mutable_chat()->add_messages()->set_role("asistant");
  h.core->submit("c", chat, h.now);
  h.core->submit("gone", h.text("client-gone", 1000), h.now);
  h.core->submit("c", h.text("deadline", 1000), h.now);
  ASSERT_EQ(h.rec.jobs.size(), 5u);
  // A duplicate id is refused while the first waits for its ids.
  h.core->submit("c", h.text("cancelled", 1000), h.now);
  EXPECT_EQ(h.rec.final_count["cancelled"], 1);
  EXPECT_TRUE(h.rec.finals["cancelled"].error_message().find("already in use") != std::string::npos);
  h.rec.final_count.clear();
  h.rec.finals.clear();

  h.core->cancel("c", "cancelled", h.now);
  h.core->client_gone("gone", h.now);
  EXPECT_EQ(h.rec.finals["cancelled"].finish_reason(), v1::FINISH_REASON_CANCELLED);
  EXPECT_EQ(h.rec.finals["client-gone"].finish_reason(), v1::FINISH_REASON_CANCELLED);
  EXPECT_EQ(h.rec.cancelled, (std::set<uint64_t>{h.rec.jobs[0].first, h.rec.jobs[3].first}));  // their work dropped
  for (size_t i = 0; i < h.rec.jobs.size(); ++i) h.render(i);  // late ids of ended requests are ignored
  EXPECT_EQ(h.rec.finals["too-long"].finish_reason(), v1::FINISH_REASON_ERROR);
  EXPECT_TRUE(h.rec.finals["too-long"].error_message().find("does not fit the context length 512") != std::string::npos)
      << h.rec.finals["too-long"].error_message();
  EXPECT_EQ(h.rec.finals["bad-role"].error_message(),
            "messages[0]: unknown role 'asistant' (system, user, assistant, tool, developer or ipython)");
  h.core->cancel_all("drained", h.now);
  for (const char* id : {"cancelled", "too-long", "bad-role", "client-gone", "deadline"})
    EXPECT_EQ(h.rec.final_count[id], 1) << id;
  EXPECT_TRUE(h.core->idle());
}

TEST(CorePrompts, ADeadlinePassingWhileTokenizingCancels) {
  AsyncHarness h;
  v1::Submit s = h.text("r", 1000);
  s.set_timeout_ms(5);
  h.core->submit("c", s, h.now);
  h.now += 10'000;
  h.core->tick(h.now);
  EXPECT_EQ(h.rec.finals["r"].finish_reason(), v1::FINISH_REASON_CANCELLED);
  h.render(0);
  EXPECT_EQ(h.rec.final_count["r"], 1);
  EXPECT_TRUE(h.core->idle());
}

}  // namespace
}  // namespace tandem::scheduler

namespace tandem::scheduler {
namespace {

// #18 item 1: a worker's result counts only for the sequences of the plan it answers, once
// each, with a token of the vocabulary. A result for another worker's sequence used to be
// taken (a fake worker could write into any tenant's stream), as was a token id past the
// vocabulary, which failed the next batch that embedded it.
TEST(CoreResults, AResultCountsOnlyForItsPlansSequencesOnceWithAVocabularyToken) {
  Harness h;
  h.core->add_worker(1, 64, 16, h.now);
  h.core->submit("c", h.request("a", 8, 4), h.now);
  h.core->tick(h.now);
  h.core->add_worker(2, 64, 16, h.now);
  h.core->submit("c", h.request("b", 8, 4), h.now);
  h.core->tick(h.now);
  ASSERT_FALSE(h.rec.plans[1].empty());
  ASSERT_FALSE(h.rec.plans[2].empty()) << "b was not placed on the idle worker 2";
  const uint64_t seq_on_1 = h.rec.plans[1].front().seqs(0).seq_id();
  const uint64_t seq_on_2 = h.rec.plans[2].front().seqs(0).seq_id();

  // Worker 1 answers its plan, adds a token for worker 2's sequence and its own twice.
  v1::StepResult res;
  res.set_step_id(h.rec.plans[1].front().step_id());
  h.rec.plans[1].pop_front();
  for (uint64_t id : {seq_on_1, seq_on_2, seq_on_1}) {
    auto* s = res.add_seqs();
    s->set_seq_id(id);
    s->set_token(7);
  }
  h.core->on_result(1, test_wire::plain(res), h.now += 1000);
  EXPECT_EQ(h.rec.tokens["a"].size() + h.rec.tokens["b"].size(), 1u)
      << "worker 1 wrote into worker 2's sequence, or its own twice";
  const std::string on_1 = h.rec.tokens["a"].empty() ? "b" : "a";
  const std::string on_2 = on_1 == "a" ? "b" : "a";

  // Worker 2 answers with a token id past the vocabulary: that request ends with an error
  // naming it, and nothing else is disturbed.
  v1::StepResult bad;
  bad.set_step_id(h.rec.plans[2].front().step_id());
  h.rec.plans[2].pop_front();
  auto* s = bad.add_seqs();
  s->set_seq_id(seq_on_2);
  s->set_token(static_cast<int32_t>(h.config.vocab_size));
  h.core->on_result(2, test_wire::plain(bad), h.now += 1000);
  ASSERT_EQ(h.rec.final_count[on_2], 1);
  EXPECT_EQ(h.rec.finals[on_2].finish_reason(), v1::FINISH_REASON_ERROR);
  EXPECT_NE(h.rec.finals[on_2].error_message().find("outside the vocabulary"), std::string::npos)
      << h.rec.finals[on_2].error_message();
  EXPECT_EQ(h.rec.tokens[on_2].size(), 0u);
  h.core->tick(h.now);
  h.drain();
  EXPECT_EQ(h.rec.final_count[on_1], 1);
  EXPECT_EQ(h.rec.finals[on_1].finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(h.rec.tokens[on_1].size(), 4u);
}

}  // namespace
}  // namespace tandem::scheduler

namespace tandem::scheduler {
namespace {

// #18 item 5: a refused request's id is echoed at most max_request_id_bytes long (a 60 MiB id
// was echoed whole, once per submit, into the client's queue).
TEST(CoreResults, ARefusalEchoesAnOverlongIdCutToTheLimit) {
  Harness h;
  h.core->add_worker(1, 64, 16, h.now);
  v1::Submit s = h.request("x", 4, 2);
  s.set_request_id(std::string(1 << 20, 'x'));
  h.core->submit("c", s, h.now);
  ASSERT_EQ(h.rec.finals.size(), 1u);
  const auto& [id, fin] = *h.rec.finals.begin();
  EXPECT_EQ(id.size(), AdmissionLimits{}.max_request_id_bytes);
  EXPECT_EQ(fin.finish_reason(), v1::FINISH_REASON_ERROR);
  EXPECT_NE(fin.error_message().find("request_id: 1048576 bytes, at most 256"), std::string::npos)
      << fin.error_message();
}

}  // namespace
}  // namespace tandem::scheduler

namespace tandem::scheduler {
namespace {

// #18 item 7: one client cannot fill the queue. Past max_client_requests live requests its
// submits are refused (OVERLOADED) while another client's are admitted; as its requests end it
// may submit again.
TEST(CoreFairness, OneClientsLiveRequestsAreBounded) {
  SchedulerConfig sc;
  sc.max_client_requests = 3;
  Harness h(sc);
  h.core->add_worker(1, 64, 16, h.now);
  for (int i = 0; i < 5; ++i) h.core->submit("greedy", h.request("g" + std::to_string(i), 4, 2), h.now);
  h.core->submit("other", h.request("o", 4, 2), h.now);
  ASSERT_EQ(h.rec.final_count["g3"], 1);
  ASSERT_EQ(h.rec.final_count["g4"], 1);
  EXPECT_EQ(h.rec.finals["g3"].error_code(), v1::ERROR_CODE_OVERLOADED);
  EXPECT_NE(h.rec.finals["g3"].error_message().find("this client has 3 live requests"), std::string::npos)
      << h.rec.finals["g3"].error_message();
  EXPECT_EQ(h.rec.final_count["o"], 0) << "another client was refused too";
  h.core->tick(h.now);
  h.drain();
  for (const char* id : {"g0", "g1", "g2", "o"}) EXPECT_EQ(h.rec.finals[id].finish_reason(), v1::FINISH_REASON_LENGTH);
  h.core->submit("greedy", h.request("g5", 4, 2), h.now);  // its earlier ones ended: admitted
  h.core->tick(h.now);
  h.drain();
  EXPECT_EQ(h.rec.finals["g5"].finish_reason(), v1::FINISH_REASON_LENGTH);
}

// Issue #17: a proxy (a gateway) names whom each request is for; max_client_requests counts per
// principal, and the proxy's own requests (no principal) count as its own.
TEST(CoreFairness, APrincipalsLiveRequestsAreBoundedApartFromItsProxys) {
  SchedulerConfig sc;
  sc.max_client_requests = 2;
  Harness h(sc);
  h.core->add_worker(1, 64, 16, h.now);
  auto as = [&](const std::string& id, const std::string& principal) {
    v1::Submit s = h.request(id, 4, 2);
    s.set_principal(principal);
    h.core->submit("gateway", s, h.now);
  };
  for (const char* id : {"a0", "a1", "a2"}) as(id, "alice");
  for (const char* id : {"b0", "b1"}) as(id, "bob");
  for (const char* id : {"g0", "g1", "g2"}) as(id, "");
  for (const char* id : {"a2", "g2"}) {
    ASSERT_EQ(h.rec.final_count[id], 1) << id;
    EXPECT_EQ(h.rec.finals[id].error_code(), v1::ERROR_CODE_OVERLOADED);
  }
  EXPECT_NE(h.rec.finals["a2"].error_message().find("principal 'alice' has 2 live requests"), std::string::npos)
      << h.rec.finals["a2"].error_message();
  EXPECT_NE(h.rec.finals["g2"].error_message().find("this client has 2 live requests"), std::string::npos);
  for (const char* id : {"a0", "a1", "b0", "b1", "g0", "g1"}) EXPECT_EQ(h.rec.final_count[id], 0) << id;
  EXPECT_EQ(h.core->live_requests("gateway"), 6u);
  h.core->tick(h.now);
  h.drain();
  for (const char* id : {"a0", "a1", "b0", "b1", "g0", "g1"})
    EXPECT_EQ(h.rec.finals[id].finish_reason(), v1::FINISH_REASON_LENGTH) << id;
  as("a3", "alice");  // her earlier ones ended: admitted
  h.core->tick(h.now);
  h.drain();
  EXPECT_EQ(h.rec.finals["a3"].finish_reason(), v1::FINISH_REASON_LENGTH);
}

}  // namespace
}  // namespace tandem::scheduler

namespace tandem::scheduler {
namespace {

// #18 item 8: a plan unanswered past its deadline names its worker; fenced (removed), the
// worker's sequences continue on another with no token lost or repeated and one final event.
TEST(CoreStepDeadline, AnUnansweredPlanIsOverdueAfterTheFloorAndItsSequencesFailOver) {
  SchedulerConfig sc;
  sc.step_deadline_floor_ms = 3000;
  Harness h(sc);
  h.core->add_worker(1, 64, 16, h.now);
  h.core->submit("c", h.request("a", 20, 6), h.now);
  h.core->tick(h.now);
  ASSERT_FALSE(h.rec.plans[1].empty());
  const int64_t sent = h.now;
  h.core->add_worker(2, 64, 16, h.now);
  EXPECT_FALSE(h.core->overdue_worker(sent + 3'000'000)) << "no history: the floor alone";
  const auto late = h.core->overdue_worker(sent + 3'000'001);
  ASSERT_TRUE(late);
  EXPECT_EQ(late->worker_id, 1u);
  EXPECT_EQ(late->tokens, 20u);
  EXPECT_EQ(late->deadline_us, 3'000'000);
  h.now = sent + 3'000'001;
  h.core->remove_worker(1, h.now);  // what the actor does with it: the dead-worker path
  h.rec.plans.erase(1);
  EXPECT_FALSE(h.core->overdue_worker(h.now));
  h.core->tick(h.now);
  h.drain();
  EXPECT_EQ(h.rec.final_count["a"], 1);
  EXPECT_EQ(h.rec.finals["a"].finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(h.rec.tokens["a"].size(), 6u);
}

TEST(CoreStepDeadline, EightTimesTheWorkersP99OnceItHasAHistory) {
  SchedulerConfig sc;
  sc.step_deadline_floor_ms = 5;  // below 8 x the 1 ms steps the harness answers in
  sc.pipeline_depth = 1;
  Harness h(sc);
  h.core->add_worker(1, 64, 16, h.now);
  h.core->submit("c", h.request("a", 4, 40), h.now);
  h.core->tick(h.now);
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(h.answer(1));  // 1 ms decode steps
  ASSERT_EQ(h.rec.plans[1].size(), 1u);
  const int64_t sent = h.now;
  EXPECT_FALSE(h.core->overdue_worker(sent + 8'000));
  const auto late = h.core->overdue_worker(sent + 8'001);
  ASSERT_TRUE(late);
  EXPECT_EQ(late->deadline_us, 8'000);
  h.core->postpone_step_deadlines(1'000);  // the scheduler itself was held up 1 ms
  EXPECT_FALSE(h.core->overdue_worker(sent + 8'001)) << "time the scheduler was held up counts against no plan";
  h.drain();
  EXPECT_EQ(h.rec.final_count["a"], 1);
}

TEST(CoreStepDeadline, APipelinedPlansClockStartsWhenThePlanBeforeItIsAnswered) {
  SchedulerConfig sc;
  sc.step_deadline_floor_ms = 1000;
  sc.pipeline_depth = 2;
  Harness h(sc);
  h.core->add_worker(1, 64, 16, h.now);
  h.core->submit("c", h.request("a", 4, 40), h.now);
  h.core->tick(h.now);
  ASSERT_TRUE(h.answer(1));
  ASSERT_EQ(h.rec.plans[1].size(), 2u) << "two plans in flight";
  const int64_t first_sent = h.now;
  // The first plan is answered 900 ms later; the second, sent long before, has its full second.
  h.now += 900'000;
  ASSERT_TRUE(h.answer(1));
  EXPECT_FALSE(h.core->overdue_worker(h.now + 999'000)) << "waited from " << first_sent;
  EXPECT_TRUE(h.core->overdue_worker(h.now + 1'000'001));
}

// A hybrid model's prefix cache (docs/HYBRID.md "Prefix cache"): the planner cuts a prompt's
// chunks at the checkpoint positions (every 64 here) and has the worker save its state there;
// a later prompt sharing the prefix starts at the last checkpoint it reaches and restores it.
// Without checkpoints (0) nothing is matched.
TEST(Core, AHybridPromptSavesCheckpointsAndAHitRestoresTheLast) {
  for (const uint32_t checkpoints : {3u, 0u}) {
    SchedulerConfig sc;
    sc.prefill_chunk = 50;
    Harness h(sc);
    h.config.arch = model::find_architecture("qwen35");
    ASSERT_NE(h.config.arch, nullptr);
    h.core = std::make_unique<Core>(sc, h.config, h.tokenizer, h.rec);
    WorkerInfo info{Role::kBoth, 64, 16, {}};
    info.state_slots = 4;
    info.state_checkpoints = checkpoints;
    info.checkpoint_interval = 64;
    h.core->add_worker(1, info, h.now);
    h.core->submit("c", h.request("a", 150, 2), h.now);
    h.core->tick(h.now);
    h.drain();
    std::map<uint32_t, uint32_t> saved;  // chunk end -> checkpoint + 1
    for (const auto& p : h.rec.history)
      for (const auto& sp : p.seqs())
        if (sp.save_checkpoint() > 0) saved[sp.start_pos() + sp.tokens_size()] = sp.save_checkpoint();
    const size_t seen = h.rec.history.size();
    h.core->submit("c", h.request("b", 150, 2), h.now);
    h.core->tick(h.now);
    h.drain();
    const v1::SeqPlan* first = nullptr;
    for (size_t i = seen; i < h.rec.history.size() && !first; ++i)
      for (const auto& sp : h.rec.history[i].seqs())
        if (sp.has_sampling()) first = &sp;
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(h.rec.finals["b"].usage().cached_prompt_tokens(), checkpoints ? 128u : 0u);
    if (checkpoints == 0) {
      EXPECT_TRUE(saved.empty());
      EXPECT_EQ(first->start_pos(), 0u);
      EXPECT_EQ(first->restore_checkpoint(), 0u);
      continue;
    }
    ASSERT_EQ(saved.size(), 2u) << "chunks cut at 64 and 128";
    EXPECT_TRUE(saved.count(64) && saved.count(128));
    EXPECT_EQ(first->start_pos(), 128u);
    EXPECT_EQ(first->restore_checkpoint(), saved[128]);
    EXPECT_EQ(h.core->workers()[0].checkpoints_total, 3u);
    EXPECT_EQ(h.core->workers()[0].checkpoints_free, 1u);
  }
}

}  // namespace
}  // namespace tandem::scheduler
