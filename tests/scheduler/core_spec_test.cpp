// The scheduler's core with speculating workers (#19 Part B), driven by a scripted worker that
// speculates: each round accepts a random number of its drafts. Every stream equals the same
// requests on a worker that does not speculate (stops, max_tokens and stop strings inside a
// round's tokens included); a round never writes past the blocks reserved for it nor into a
// block another sequence holds; after any mix of accepts, rejects and cancels every block is
// back (as BlockPool.RandomizedAgainstModel checks the pool).
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <random>

#include "model/gguf.h"
#include "scheduler/core.h"
#include "tests/scheduler/wire_harness.h"
#include "tests/test_util.h"

namespace tandem::scheduler {
namespace {

constexpr uint32_t kBlockTokens = 16;

int32_t fake_token(uint32_t position) { return 3 + static_cast<int32_t>((position * 37) % 250); }

struct Recorder : Sink {
  std::map<uint32_t, std::deque<v1::StepPlan>> plans;
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, std::string> text;
  std::map<std::string, v1::FinalEvent> finals;
  std::map<std::string, int> final_count;
  std::map<uint32_t, std::vector<v1::SchedulerCommand>> commands;
  void send_command(uint32_t worker, const Command& c) override { commands[worker].push_back(test_wire::wire(c)); }
  void send_plan(uint32_t worker, const StepPlan& p) override { plans[worker].push_back(test_wire::wire(p)); }
  void send_events(const std::string&, const RequestEvents& plain) override {
    const v1::RequestEvents ev = test_wire::wire(plain);
    for (const auto& t : ev.tokens()) {
      tokens[ev.request_id()].push_back(t.id());
      text[ev.request_id()] += t.text();
    }
    if (ev.has_final()) {
      finals[ev.request_id()] = ev.final();
      text[ev.request_id()] += ev.final().text();
      ++final_count[ev.request_id()];
    }
  }
};

// A worker as the scheduler sees it, speculating: what each sequence holds, its block table as
// the plans built it, and who wrote each KV row last. Token at position p is fake_token(p),
// whatever was drafted; a round accepts a random number of its drafts.
struct FakeWorker {
  struct Seq {
    uint32_t held = 0;
    std::vector<int32_t> table;
  };
  std::map<uint64_t, Seq> seqs;
  std::map<int64_t, uint64_t> writer;  // block * kBlockTokens + row -> sequence
  std::mt19937 rng{7};
  uint32_t context = 0;
  bool accept_all = false;

  // Runs one plan and fills `res`. Failures are test failures.
  void run(const v1::StepPlan& plan, v1::StepResult& res) {
    res.set_step_id(plan.step_id());
    for (uint64_t id : plan.release()) seqs.erase(id);
    std::map<int32_t, uint64_t> step_writer;  // blocks this step writes, by sequence
    for (const auto& sp : plan.seqs()) {
      Seq& q = seqs[sp.seq_id()];
      if (sp.has_sampling()) q.held = static_cast<uint32_t>(sp.history_size());
      if (sp.keep_blocks() > 0) {
        ASSERT_LE(sp.keep_blocks(), q.table.size());
        q.table.resize(sp.keep_blocks());
      }
      q.table.insert(q.table.end(), sp.new_blocks().begin(), sp.new_blocks().end());
      const uint32_t start = sp.speculate() ? q.held : sp.start_pos();
      uint32_t k = 0;
      if (sp.speculate()) {
        ASSERT_TRUE(sp.sample());
        const uint32_t want = accept_all ? sp.max_drafts() : rng() % (sp.max_drafts() + 1);
        const uint32_t remaining = sp.max_len() > start + 1 ? sp.max_len() - (start + 1) : 0;
        const uint32_t room = std::min(remaining, context - start);  // as workers::draft_budget
        k = room == 0 ? 0 : std::min(want, room - 1);
      }
      const uint32_t fed = sp.speculate() ? 1 + k : std::max(1, sp.tokens_size());
      ASSERT_LE(start + fed, q.table.size() * kBlockTokens) << "a round writes past its reserved blocks";
      // Every row it reads is its own (no prefix cache in these tests), every row it writes is
      // no other sequence's in this step.
      for (uint32_t p = 0; p < start; ++p) {
        const int64_t row = int64_t{q.table[p / kBlockTokens]} * kBlockTokens + p % kBlockTokens;
        ASSERT_EQ(writer[row], sp.seq_id()) << "sequence " << sp.seq_id() << " position " << p << " was overwritten";
      }
      for (uint32_t p = start; p < start + fed; ++p) {
        const int32_t block = q.table[p / kBlockTokens];
        auto [it, fresh] = step_writer.emplace(block, sp.seq_id());
        ASSERT_EQ(it->second, sp.seq_id()) << "two sequences write block " << block << " in one step";
        writer[int64_t{block} * kBlockTokens + p % kBlockTokens] = sp.seq_id();
      }
      const uint32_t accepted = sp.speculate() ? (accept_all ? k : rng() % (k + 1)) : 0;
      q.held = start + (sp.speculate() ? 1 + accepted : fed);
      if (!sp.sample()) continue;
      auto* r = res.add_seqs();
      r->set_seq_id(sp.seq_id());
      r->set_token(fake_token(start + fed - (sp.speculate() ? k : 0)));
      for (uint32_t i = 1; i <= accepted; ++i) {
        r->add_more_tokens(fake_token(start + 1 + i));
        r->add_more_logprobs(-0.5f);
      }
      res.set_drafted(res.drafted() + k);
      res.set_accepted(res.accepted() + accepted);
    }
  }
};

struct Harness {
  model::Tokenizer tokenizer;
  model::ModelConfig config;
  Recorder rec;
  std::unique_ptr<Core> core;
  std::map<uint32_t, FakeWorker> workers;
  int64_t now = 1'000'000;

  explicit Harness(SchedulerConfig sc = {}) {
    auto f = model::GgufFile::open(test::model_file("tiny", 1));
    config = model::read_model_config(**f).value();
    tokenizer = model::Tokenizer::from_gguf(**f).value();
    sc.prefix_cache = false;
    core = std::make_unique<Core>(sc, config, tokenizer, rec);
  }

  void add(uint32_t id, uint32_t blocks, uint32_t spec_tokens, Role role = Role::kBoth) {
    WorkerInfo info;
    info.role = role;
    info.kv_blocks = blocks;
    info.block_tokens = kBlockTokens;
    info.spec_tokens = spec_tokens;
    if (role == Role::kDecode) info.kv_endpoint = "ipc:///nowhere";
    core->add_worker(id, info, now);
    workers[id].context = config.context_length;
  }

  v1::Submit request(const std::string& id, uint32_t prompt_len, uint32_t max_tokens) {
    return test_wire::submit(id, prompt_len, max_tokens);
  }

  bool answer(uint32_t worker) {
    auto& q = rec.plans[worker];
    if (q.empty()) return false;
    const v1::StepPlan plan = q.front();
    q.pop_front();
    v1::StepResult res;
    workers[worker].run(plan, res);
    now += 1000;
    core->on_result(worker, test_wire::plain(res), now);
    core->tick(now);
    return true;
  }

  // Acknowledges every KvExpect to `worker`: the sequence then lives there with the positions
  // the transfer carried.
  bool deliver(uint32_t worker) {
    auto cmds = std::move(rec.commands[worker]);
    rec.commands[worker].clear();
    for (const auto& c : cmds) {
      if (!c.has_kv_expect()) continue;
      FakeWorker::Seq& q = workers[worker].seqs[c.kv_expect().seq_id()];
      q.held = c.kv_expect().positions();
      q.table.assign(c.kv_expect().blocks().begin(), c.kv_expect().blocks().end());
      for (uint32_t p = 0; p < q.held; ++p)
        workers[worker].writer[int64_t{q.table[p / kBlockTokens]} * kBlockTokens + p % kBlockTokens] =
            c.kv_expect().seq_id();
      v1::KvReceived ack;
      ack.set_transfer_id(c.kv_expect().transfer_id());
      ack.set_seq_id(c.kv_expect().seq_id());
      ack.set_bytes(1000);
      now += 100;
      core->on_kv_received(worker, test_wire::plain(ack), now);
    }
    core->tick(now);
    return !cmds.empty();
  }

  void drain() {
    for (int i = 0; i < 100000; ++i) {
      bool any = false;
      for (auto& [w, fake] : workers) any |= deliver(w);
      for (auto& [w, fake] : workers) any |= answer(w);
      if (::testing::Test::HasFatalFailure()) return;
      if (!any) return;
    }
    FAIL() << "did not drain";
  }

  uint32_t in_use() const {
    uint32_t used = 0;
    for (auto& w : core->workers()) used += w.blocks_total - w.blocks_free - w.blocks_cached;
    return used;
  }
};

// The streams `submit` gives on one worker of `spec_tokens` (0: plain decoding).
std::map<std::string, std::vector<int32_t>> streams(uint32_t spec_tokens, const std::function<void(Harness&)>& submit,
                                                    bool accept_all = false) {
  Harness h;
  h.add(1, 512, spec_tokens);
  h.workers[1].accept_all = accept_all;
  submit(h);
  h.core->tick(h.now);
  h.drain();
  EXPECT_EQ(h.in_use(), 0u);
  for (auto& [id, n] : h.rec.final_count) EXPECT_EQ(n, 1) << id;
  return h.rec.tokens;
}

TEST(CoreSpec, EveryStreamEqualsPlainDecodingWhateverEachRoundAccepts) {
  auto submit = [](Harness& h) {
    for (uint32_t i = 0; i < 40; ++i)
      h.core->submit("c", h.request("r" + std::to_string(i), 1 + (i * 13) % 70, 1 + (i * 7) % 45), h.now);
  };
  const auto plain = streams(0, submit);
  EXPECT_EQ(streams(4, submit), plain);
  EXPECT_EQ(streams(4, submit, /*accept_all=*/true), plain);
  EXPECT_EQ(streams(1, submit), plain);
  ASSERT_EQ(plain.size(), 40u);
  EXPECT_EQ(plain.at("r3").size(), 1 + (3 * 7) % 45u);
}

TEST(CoreSpec, AStopAndMaxTokensInsideARoundEndTheStreamAtTheirToken) {
  auto submit = [](Harness& h) {
    // max_tokens 6 with rounds of 5: the second round may carry more than the budget.
    h.core->submit("c", h.request("len", 20, 6), h.now);
    // A stop sequence of two tokens the fake worker samples at positions 27 and 28.
    v1::Submit s = h.request("stop", 20, 30);
    auto* seq = s.add_stop_token_sequences();
    seq->add_ids(fake_token(27));
    seq->add_ids(fake_token(28));
    h.core->submit("c", s, h.now);
    // A stop string: the text of the token at position 26 (and nothing after it is streamed).
    v1::Submit t = h.request("text", 20, 30);
    const std::vector<int32_t> at26 = {fake_token(26)};
    t.add_stop_strings(h.tokenizer.decode(at26));
    h.core->submit("c", t, h.now);
  };
  const auto plain = streams(0, submit);
  ASSERT_EQ(plain.at("len").size(), 6u);
  ASSERT_LT(plain.at("stop").size(), 30u);
  ASSERT_LT(plain.at("text").size(), 30u);
  for (bool all : {true, false}) {
    const auto spec = streams(4, submit, all);
    EXPECT_EQ(spec, plain);
  }
}

// Submit.spec_tokens per request on a worker of --spec-tokens 4: 0 plans it as plain decodes
// (never speculate), 2 caps every round at 2 drafts, absent takes the worker's 4; the streams
// are plain decoding's either way.
TEST(CoreSpec, ARequestTurnsSpeculationOffOrCapsItsDrafts) {
  std::map<std::string, uint32_t> most_drafts, speculating;
  auto submit = [&](Harness& h) {
    for (int k : {-1, 0, 2}) {
      v1::Submit s = h.request("k" + std::to_string(k), 20, 40);
      if (k >= 0) s.set_spec_tokens(static_cast<uint32_t>(k));
      h.core->submit("c", s, h.now);
    }
  };
  Harness h;
  h.add(1, 512, 4);
  h.workers[1].accept_all = true;
  submit(h);
  h.core->tick(h.now);
  for (int i = 0; i < 100000 && !h.rec.plans[1].empty(); ++i) {
    for (const auto& sp : h.rec.plans[1].front().seqs()) {
      const std::string id = sp.seq_id() == 1 ? "k-1" : sp.seq_id() == 2 ? "k0" : "k2";
      if (sp.speculate()) ++speculating[id], most_drafts[id] = std::max(most_drafts[id], sp.max_drafts());
    }
    h.answer(1);
  }
  EXPECT_EQ(most_drafts["k-1"], 4u) << "absent: the worker's";
  EXPECT_EQ(speculating["k0"], 0u) << "0: no speculating round";
  EXPECT_EQ(most_drafts["k2"], 2u) << "2: at most 2 drafts";
  EXPECT_EQ(h.rec.tokens, streams(0, submit));
  EXPECT_EQ(h.in_use(), 0u);
}

// Random accepts, rejects and cancels on two speculating workers and a plain one, against a
// model of the pool: at every point every block is free, cached, or held by a live sequence
// whose positions need it, and at the end all are back.
TEST(CoreSpec, RandomizedAcceptRejectCancelGivesEveryBlockBack) {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    SchedulerConfig sc;
    sc.max_batch_tokens = 64;
    Harness h(sc);
    h.add(1, 40, 4);
    h.add(2, 24, 2);
    h.add(3, 40, 0);
    std::mt19937 rng(seed);
    for (auto& [id, w] : h.workers) w.rng.seed(seed * 10 + id);
    uint32_t submitted = 0;
    std::vector<std::string> live;
    std::map<std::string, uint32_t> prompt_len;
    for (int round = 0; round < 3000 && !::testing::Test::HasFatalFailure(); ++round) {
      const uint32_t r = rng() % 10;
      if (r < 2 && submitted < 120) {
        const std::string id = "q" + std::to_string(submitted++);
        prompt_len[id] = 1 + rng() % 60;
        h.core->submit("c", h.request(id, prompt_len[id], 1 + rng() % 80), h.now);
        live.push_back(id);
        h.core->tick(h.now);
      } else if (r == 2 && !live.empty()) {
        const size_t i = rng() % live.size();
        h.core->cancel("c", live[i], h.now);
        h.core->tick(h.now);
      } else {
        h.answer(1 + rng() % 3);
      }
    }
    h.drain();
    EXPECT_EQ(h.in_use(), 0u) << "seed " << seed;
    EXPECT_TRUE(h.core->idle());
    for (uint32_t i = 0; i < submitted; ++i) {
      const std::string id = "q" + std::to_string(i);
      EXPECT_EQ(h.rec.final_count[id], 1) << id;
      const auto& got = h.rec.tokens[id];  // cancelled or not: what came is plain decoding's
      for (size_t j = 0; j < got.size(); ++j)
        ASSERT_EQ(got[j], fake_token(prompt_len[id] + static_cast<uint32_t>(j))) << id << " token " << j;
    }
    uint64_t rounds = 0;
    for (const auto& w : h.core->workers()) rounds += w.stats->spec_rounds;
    EXPECT_GT(rounds, 0u);
  }
}

// Split: the prefill worker does not speculate, the decode worker does; every stream equals
// plain decoding on a `both` worker.
TEST(CoreSpec, ADecodeWorkerSpeculatesAfterTheHandoff) {
  auto submit = [](Harness& h) {
    for (uint32_t i = 0; i < 24; ++i)
      h.core->submit("c", h.request("r" + std::to_string(i), 5 + (i * 11) % 60, 2 + (i * 5) % 40), h.now);
  };
  const auto plain = streams(0, submit);
  Harness h;
  h.add(1, 256, 4, Role::kPrefill);
  h.add(2, 256, 4, Role::kDecode);
  submit(h);
  h.core->tick(h.now);
  h.drain();
  EXPECT_EQ(h.rec.tokens, plain);
  EXPECT_EQ(h.in_use(), 0u);
  EXPECT_GT(h.core->stats().handoffs, 0u);
}

}  // namespace
}  // namespace tandem::scheduler
