// The worker's sequence table without sockets or an engine: plans are checked whole (a bad
// entry anywhere leaves the table as it was), staged steps carry what the engine and the
// sampler need, commit/abort/trim/drop and the handoffs keep positions and histories exact.
#include "workers/sequence_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <string>

#include "model/gguf.h"
#include "model/model_config.h"
#include "tests/counted_allocations.h"
#include "tests/test_util.h"

namespace tandem::worker {
namespace {

constexpr uint32_t kVocab = 100, kContext = 256, kBlocks = 64, kBt = 16;

TableLimits limits(uint32_t tail_blocks = 0) {
  return TableLimits{.vocab_size = kVocab,
                     .context_length = kContext,
                     .n_blocks = kBlocks,
                     .block_tokens = kBt,
                     .tail_blocks = tail_blocks,
                     .kv_format = tail_blocks ? "8-bit, F32 window" : "F32"};
}

std::vector<int32_t> iota_tokens(uint32_t n, int32_t from = 1) {
  std::vector<int32_t> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = from + static_cast<int32_t>(i % 90);
  return t;
}

// A first appearance: `tokens` at [0, n), its blocks, sampling.
runtime::SeqPlan& add_first(runtime::StepPlan& plan, uint64_t id, std::vector<int32_t> tokens,
                            std::vector<int32_t> blocks, bool sample) {
  runtime::SeqPlan& s = plan.add_seq();
  s.seq_id = id;
  s.tokens = std::move(tokens);
  s.new_blocks = std::move(blocks);
  s.sample = sample;
  s.first = true;
  s.sampling.seed = id;
  return s;
}

runtime::SeqPlan& add_next(runtime::StepPlan& plan, uint64_t id, uint32_t start, std::vector<int32_t> tokens = {},
                           std::vector<int32_t> blocks = {}, bool sample = true) {
  runtime::SeqPlan& s = plan.add_seq();
  s.seq_id = id;
  s.start_pos = start;
  s.tokens = std::move(tokens);
  s.new_blocks = std::move(blocks);
  s.sample = sample;
  return s;
}

// Applies and commits, sampling `token` for every entry that asks.
// A speculating round of a held sequence (its start is the positions held).
runtime::SeqPlan& add_round(runtime::StepPlan& plan, uint64_t id, uint32_t max_drafts, uint32_t max_len) {
  runtime::SeqPlan& s = add_next(plan, id, 0);
  s.speculate = true;
  s.max_drafts = max_drafts;
  s.max_len = max_len;
  return s;
}

void run(SequenceTable& table, const runtime::StepPlan& plan, int32_t token = 7) {
  const Status st = table.apply(plan);
  ASSERT_TRUE(st.is_ok()) << st.message();
  std::vector<int32_t> sampled(table.to_sample().size(), token);
  table.commit(sampled);
}

// Everything observable about the table's sequences, to compare before and after.
std::string snapshot(const SequenceTable& table, std::initializer_list<uint64_t> ids) {
  std::string out = "size " + std::to_string(table.size()) + ";";
  for (uint64_t id : ids) {
    const Sequence* s = table.find(id);
    out += " " + std::to_string(id) + ":";
    if (s == nullptr) {
      out += "none";
      continue;
    }
    for (int32_t t : s->tokens) out += std::to_string(t) + ",";
    out += "|b";
    for (int32_t b : s->blocks) out += std::to_string(b) + ",";
    out += "|t";
    for (int32_t b : s->tail) out += std::to_string(b) + ",";
    out += "|last " + std::to_string(s->last) + " end " + std::to_string(s->tail_end) + " seed " +
           std::to_string(s->sampling.seed) + " lp " + std::to_string(s->logprobs);
  }
  return out;
}

// Sequence 1: 20 positions, 2 blocks, a sampled token. Sequence 2: a prompt chunk of 16
// positions, nothing sampled yet.
SequenceTable two_sequences() {
  SequenceTable table(limits());
  runtime::StepPlan plan;
  add_first(plan, 1, iota_tokens(20), {0, 1}, true);
  add_first(plan, 2, iota_tokens(16), {2}, false);
  run(table, plan, 9);
  return table;
}

TEST(SequenceTable, EachKindOfBadEntryRefusesThePlanWholeAndChangesNothing) {
  struct Case {
    const char* name;
    std::function<void(runtime::StepPlan&)> bad;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"unknown",
       [](auto& p) {
         add_next(p, 5, 0, {1, 2}, {3});
       },
       "sequence 5 is not held here"},
      {"tail", [](auto& p) { add_first(p, 5, {1}, {3}, true).tail_blocks = {4}; }, "comes with 1 tail blocks"},
      {"twice", [](auto& p) { add_next(p, 1, 20); }, "sequence 1 appears twice"},
      {"gap", [](auto& p) { add_next(p, 2, 17, {1}); }, "sequence 2 plan starts at 17 but 16 positions"},
      {"no last", [](auto& p) { add_next(p, 2, 16); }, "sequence 2 has no sampled token"},
      {"vocab",
       [](auto& p) {
         add_next(p, 2, 16, {5, 100});
       },
       "feeds token id 100, outside the vocabulary"},
      {"negative", [](auto& p) { add_next(p, 2, 16, {-1}); }, "feeds token id -1"},
      {"block id", [](auto& p) { add_next(p, 2, 16, {1}, {64}); }, "names block 64, outside the pool of 64"},
      {"short table", [](auto& p) { add_next(p, 2, 16, iota_tokens(17)); }, "has blocks for 16 positions, needs 33"},
      {"context", [](auto& p) { add_next(p, 2, 16, iota_tokens(250), std::vector<int32_t>(16, 5)); },
       "reaches position 266, past the context length 256"},
  };
  for (const Case& c : cases) {
    SequenceTable table = two_sequences();
    const std::string before = snapshot(table, {1, 2, 3, 5});
    runtime::StepPlan plan;
    add_next(plan, 1, 20);                           // valid: a decode
    add_first(plan, 3, iota_tokens(4), {10}, true);  // valid: a new sequence
    c.bad(plan);                                     // last: the valid entries were checked first
    const Status st = table.apply(plan);
    ASSERT_FALSE(st.is_ok()) << c.name;
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << c.name;
    EXPECT_NE(st.message().find(c.says), std::string::npos) << c.name << ": " << st.message();
    EXPECT_FALSE(table.staged()) << c.name;
    EXPECT_EQ(snapshot(table, {1, 2, 3, 5}), before) << c.name;
    // The table still takes a good plan.
    runtime::StepPlan good;
    add_next(good, 1, 20);
    run(table, good);
    EXPECT_EQ(table.find(1)->tokens.size(), 21u) << c.name;
  }
}

TEST(SequenceTable, TailsAndStepSizeAreChecked) {
  SequenceTable table(limits(2));
  runtime::StepPlan plan;
  add_first(plan, 1, {1, 2}, {0}, true).tail_blocks = {62};
  Status st = table.apply(plan);
  EXPECT_NE(
      st.message().find("sequence 1 comes with 1 tail blocks; this worker's KV format (8-bit, F32 window) needs 2"),
      std::string::npos)
      << st.message();
  plan.clear();
  add_first(plan, 1, {1, 2}, {0}, true).tail_blocks = {62, 64};
  st = table.apply(plan);
  EXPECT_NE(st.message().find("names block 64"), std::string::npos) << st.message();
  plan.clear();
  add_first(plan, 1, {1, 2}, {0}, true).tail_blocks = {62, 63};
  ASSERT_TRUE(table.apply(plan).is_ok());
  ASSERT_EQ(table.steps().size(), 1u);
  EXPECT_EQ(table.steps()[0].tail.size(), 2u);
  EXPECT_EQ(table.steps()[0].tail_end, -1);
  table.commit(std::vector<int32_t>{4});
  EXPECT_EQ(table.find(1)->tail_end, 2);

  TableLimits small = limits();
  small.max_step_tokens = 40;
  SequenceTable bounded(small);
  plan.clear();
  add_first(plan, 1, iota_tokens(30), {0, 1}, false);
  add_first(plan, 2, iota_tokens(30), {2, 3}, false);
  st = bounded.apply(plan);
  EXPECT_NE(st.message().find("step of 60 tokens is larger than the engine takes (40)"), std::string::npos)
      << st.message();
  EXPECT_EQ(bounded.size(), 0u);
}

// Rings: each plan's whole ring is checked (in the ring pool, reaching the step's last block),
// kept, and passed to the engine with ring_first; a pool without rings refuses a ring.
TEST(SequenceTable, RingsAreCheckedKeptAndPassedOn) {
  runtime::StepPlan plan;
  SequenceTable plain(limits());
  add_first(plan, 1, iota_tokens(20), {0, 1}, true).ring = {0, 1};
  Status st = plain.apply(plan);
  EXPECT_NE(st.message().find("sequence 1 comes with a ring, but this worker's KV pool has no rings"),
            std::string::npos)
      << st.message();
  TableLimits with_rings = limits();
  with_rings.ring_blocks = 4;
  SequenceTable table(with_rings);
  plan.clear();
  add_first(plan, 1, iota_tokens(20), {0, 1}, true).ring = {3};
  st = table.apply(plan);
  EXPECT_NE(st.message().find("has a ring of blocks 0 .. 1, needs up to block 2"), std::string::npos) << st.message();
  plan.clear();
  add_first(plan, 1, iota_tokens(20), {0, 1}, true).ring = {3, 4};
  st = table.apply(plan);
  EXPECT_NE(st.message().find("names ring block 4, outside the ring pool of 4"), std::string::npos) << st.message();
  EXPECT_EQ(table.size(), 0u);
  plan.clear();
  add_first(plan, 1, iota_tokens(20), {0, 1}, true).ring = {3, 2};
  ASSERT_TRUE(table.apply(plan).is_ok());
  EXPECT_EQ(std::vector<int32_t>(table.steps()[0].ring.begin(), table.steps()[0].ring.end()),
            (std::vector<int32_t>{3, 2}));
  table.commit(std::vector<int32_t>{4});
  plan.clear();
  runtime::SeqPlan& next = add_next(plan, 1, 20, {}, {});
  next.ring = {2};
  next.ring_first = 1;
  ASSERT_TRUE(table.apply(plan).is_ok());
  EXPECT_EQ(table.steps()[0].ring_first, 1u);
  ASSERT_EQ(table.steps()[0].ring.size(), 1u);
  EXPECT_EQ(table.steps()[0].ring[0], 2);
  table.commit(std::vector<int32_t>{5});
}

TEST(SequenceTable, PrefillChunksThenDecodesAdvancePositions) {
  SequenceTable table(limits());
  runtime::StepPlan plan;
  add_first(plan, 1, iota_tokens(16), {4}, false).sampling.temperature = 0.5f;
  ASSERT_TRUE(table.apply(plan).is_ok());
  ASSERT_EQ(table.steps().size(), 1u);
  EXPECT_EQ(table.steps()[0].start_pos, 0u);
  EXPECT_EQ(table.steps()[0].tokens.size(), 16u);
  EXPECT_EQ(table.steps()[0].n_logits, 0u);
  EXPECT_EQ(table.steps()[0].blocks.size(), 1u);
  EXPECT_TRUE(table.to_sample().empty());
  table.commit({});
  EXPECT_EQ(table.find(1)->tokens.size(), 16u);
  EXPECT_EQ(table.find(1)->tail_end, 16);
  EXPECT_EQ(table.find(1)->last, -1);

  // The prompt's last chunk, and a second sequence joining in the same step.
  plan.clear();
  add_next(plan, 1, 16, iota_tokens(4, 50), {5}, true);
  add_first(plan, 2, iota_tokens(3), {6}, true);
  ASSERT_TRUE(table.apply(plan).is_ok());
  ASSERT_EQ(table.to_sample().size(), 2u);
  EXPECT_EQ(table.to_sample()[0].seq_id, 1u);
  EXPECT_EQ(table.to_sample()[0].logits_row, 0u);
  EXPECT_EQ(table.to_sample()[0].history.size(), 20u);  // the position sampled
  EXPECT_EQ(table.to_sample()[0].history.back(), 53);
  EXPECT_EQ(table.to_sample()[0].sampling->temperature, 0.5f);
  EXPECT_EQ(table.to_sample()[1].logits_row, 1u);
  EXPECT_EQ(table.to_sample()[1].history.size(), 3u);
  EXPECT_EQ(table.steps()[0].blocks.size(), 2u);
  table.commit(std::vector<int32_t>{42, 43});
  EXPECT_EQ(table.find(1)->last, 42);
  EXPECT_EQ(table.find(2)->last, 43);

  // Decodes feed the last sample at the next position.
  for (uint32_t pos = 20; pos < 40; ++pos) {
    plan.clear();
    add_next(plan, 1, pos, {}, pos == 32 ? std::vector<int32_t>{7} : std::vector<int32_t>{});
    ASSERT_TRUE(table.apply(plan).is_ok()) << pos;
    ASSERT_EQ(table.steps()[0].tokens.size(), 1u);
    EXPECT_EQ(table.steps()[0].tokens[0], table.find(1)->tokens[pos]);
    EXPECT_EQ(table.to_sample()[0].history.size(), pos + 1);
    table.commit(std::vector<int32_t>{static_cast<int32_t>(pos % 90)});
  }
  const Sequence* s = table.find(1);
  EXPECT_EQ(s->tokens.size(), 40u);
  EXPECT_EQ(s->tokens[20], 42);
  EXPECT_EQ(s->tokens[39], 38);
  EXPECT_EQ(s->last, 39);
  EXPECT_EQ(s->tail_end, 40);
  EXPECT_EQ(s->blocks, (std::vector<int32_t>{4, 5, 7}));
}

TEST(SequenceTable, HistoryFromThePrefixCacheAndRollbackByStart) {
  SequenceTable table(limits());
  runtime::StepPlan plan;
  runtime::SeqPlan& s = add_first(plan, 1, {70, 71}, {0, 1}, true);
  s.history = iota_tokens(16);  // positions [0, 16) are in shared block 0
  s.start_pos = 16;
  run(table, plan, 5);
  ASSERT_EQ(table.find(1)->tokens.size(), 18u);
  EXPECT_EQ(table.find(1)->tokens[16], 70);
  // A start before the positions held rolls back to it.
  plan.clear();
  add_next(plan, 1, 10, {80, 81});
  run(table, plan, 6);
  EXPECT_EQ(table.find(1)->tokens.size(), 12u);
  EXPECT_EQ(table.find(1)->tokens[11], 81);
  EXPECT_EQ(table.find(1)->last, 6);
}

TEST(SequenceTable, AbortLeavesTheTableAsBefore) {
  SequenceTable table = two_sequences();
  const std::string before = snapshot(table, {1, 2, 3});
  runtime::StepPlan plan;
  add_next(plan, 1, 12, {3, 4}, {5}).first = true;  // a rollback, a new block, new sampling
  add_next(plan, 2, 16, iota_tokens(4), {11});
  add_first(plan, 3, iota_tokens(4), {10}, true);
  ASSERT_TRUE(table.apply(plan).is_ok());
  EXPECT_TRUE(table.staged());
  const Status again = table.apply(plan);
  EXPECT_FALSE(again.is_ok());
  EXPECT_NE(again.message().find("already staged"), std::string::npos);
  EXPECT_FALSE(table.trim(1, 1).is_ok());
  table.abort();
  EXPECT_FALSE(table.staged());
  EXPECT_EQ(snapshot(table, {1, 2, 3}), before);
  run(table, plan);
  EXPECT_EQ(table.find(1)->tokens.size(), 14u);
  EXPECT_EQ(table.find(3)->tokens.size(), 4u);
}

TEST(SequenceTable, TrimShortensPositionsHistoryAndBlocks) {
  SequenceTable table(limits());
  runtime::StepPlan plan;
  add_first(plan, 1, iota_tokens(40), {0, 1, 2}, true);
  run(table, plan, 8);
  EXPECT_FALSE(table.trim(1, 41).is_ok());
  EXPECT_NE(table.trim(2, 1).message().find("sequence 2 is not held here"), std::string::npos);
  ASSERT_TRUE(table.trim(1, 40).is_ok());  // nothing to drop: the last sample stays
  EXPECT_EQ(table.find(1)->last, 8);
  ASSERT_TRUE(table.trim(1, 20).is_ok());
  const Sequence* s = table.find(1);
  EXPECT_EQ(s->tokens, iota_tokens(20));
  EXPECT_EQ(s->blocks, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(s->last, -1);
  EXPECT_EQ(s->tail_end, 40);  // the engine reads back what the rollback leaves
  // The sample after the trimmed positions is gone: the next plan feeds tokens.
  plan.clear();
  add_next(plan, 1, 20);
  EXPECT_NE(table.apply(plan).message().find("no sampled token"), std::string::npos);
  plan.clear();
  add_next(plan, 1, 20, {33, 34, 35}, {9});
  run(table, plan, 12);
  EXPECT_EQ(table.find(1)->tokens.size(), 23u);
  EXPECT_EQ(table.find(1)->blocks, (std::vector<int32_t>{0, 1, 9}));
  ASSERT_TRUE(table.trim(1, 0).is_ok());
  EXPECT_TRUE(table.find(1)->blocks.empty());
}

TEST(SequenceTable, DropForgetsTheSequenceAndItsHandoff) {
  SequenceTable table = two_sequences();
  ASSERT_TRUE(table.expect(70, IncomingHandoff{.seq_id = 2, .positions = 16, .blocks = {20}}).is_ok());
  ASSERT_TRUE(table.expect(71, IncomingHandoff{.seq_id = 6, .positions = 16, .blocks = {21}}).is_ok());
  table.drop(2);
  table.drop(99);  // unknown: nothing to do
  EXPECT_EQ(table.find(2), nullptr);
  EXPECT_NE(table.find(1), nullptr);
  EXPECT_EQ(table.expected(70), nullptr);
  EXPECT_NE(table.expected(71), nullptr);
  runtime::StepPlan plan;
  add_next(plan, 2, 16);
  EXPECT_NE(table.apply(plan).message().find("sequence 2 is not held here"), std::string::npos);
  table.drop_all();
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.expected_handoffs(), 0u);
}

TEST(SequenceTable, HandoffOutAndIn) {
  SequenceTable prefill(limits());
  runtime::StepPlan plan;
  add_first(plan, 1, iota_tokens(20), {3, 4}, true).logprobs = true;
  run(prefill, plan, 11);
  EXPECT_NE(prefill.handoff_out(2, 20).status().message().find("not held here"), std::string::npos);
  EXPECT_NE(prefill.handoff_out(1, 21).status().message().find("holds 20 positions, not 21"), std::string::npos);
  auto out = prefill.handoff_out(1, 20);
  ASSERT_TRUE(out.is_ok());
  EXPECT_EQ(out->tokens.size(), 20u);
  EXPECT_EQ(out->blocks.size(), 2u);
  EXPECT_EQ(out->last, 11);
  EXPECT_EQ(out->sampling->seed, 1u);
  EXPECT_TRUE(out->logprobs);
  EXPECT_EQ(out->tail_end, 20);

  SequenceTable decode(limits());
  ASSERT_TRUE(decode.expect(7, IncomingHandoff{.seq_id = 5, .nonce = 99, .positions = 20, .blocks = {30, 31}}).is_ok());
  ASSERT_NE(decode.expected(7), nullptr);
  EXPECT_EQ(decode.expected(7)->nonce, 99u);
  auto taken = decode.take_expected(7);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(decode.expected(7), nullptr);
  EXPECT_FALSE(decode.take_expected(7).has_value());
  HandoffState state{.tokens = out->tokens.first(19),
                     .last = out->last,
                     .sampling = *out->sampling,
                     .logprobs = true,
                     .tail_end = out->tail_end};
  Status st = decode.receive(*taken, state);
  EXPECT_NE(st.message().find("carries 19 tokens for 20 positions"), std::string::npos) << st.message();
  state.tokens = out->tokens;
  state.tail_end = 21;
  st = decode.receive(*taken, state);
  EXPECT_NE(st.message().find("tail_end 21"), std::string::npos) << st.message();
  EXPECT_EQ(decode.size(), 0u);
  state.tail_end = out->tail_end;
  ASSERT_TRUE(decode.receive(*taken, state).is_ok());
  // The decode worker continues from the handed-off state: its first decode feeds `last`.
  plan.clear();
  add_next(plan, 5, 20, {}, {32});
  ASSERT_TRUE(decode.apply(plan).is_ok());
  EXPECT_EQ(decode.steps()[0].tokens[0], 11);
  EXPECT_EQ(decode.steps()[0].blocks.size(), 3u);
  EXPECT_EQ(decode.to_sample()[0].sampling->seed, 1u);
  decode.commit(std::vector<int32_t>{12});
  EXPECT_EQ(decode.find(5)->tokens.size(), 21u);
}

// Rings across a handoff: the prefill side sends its ring's logical blocks from the receiver's
// ring_first to the positions' last (not the blocks its own window still held), refusing a start
// its ring released; the decode side takes a ring that reaches the positions' last block and
// starts no later than its next query's first key, refuses one block too few at either end, ids
// outside its ring pool and any ring without rings, and its first decode continues on that ring.
TEST(SequenceTable, RingHandoffSendsTheReceiversWindowAndTheReceiverChecksIt) {
  TableLimits with_rings = limits();
  with_rings.ring_blocks = 8;
  with_rings.ring_window = 32;
  SequenceTable prefill(with_rings);
  runtime::StepPlan plan;
  add_first(plan, 1, iota_tokens(64), {0, 1, 2, 3}, false).ring = {0, 1, 2, 3};
  run(prefill, plan);
  plan.clear();  // the last chunk's first query, 64, sees from key 33: its ring starts at block 2
  runtime::SeqPlan& last = add_next(plan, 1, 64, iota_tokens(36, 2), {4, 5, 6});
  last.ring = {5, 6, 7, 1, 2};
  last.ring_first = 2;
  run(prefill, plan, 11);
  // The decode worker's next query is at 100: it sees keys 69 .. 100, blocks 4 .. 6.
  auto out = prefill.handoff_out(1, 100, 4);
  ASSERT_TRUE(out.is_ok()) << out.status().message();
  EXPECT_EQ(out->ring_first, 4u);
  EXPECT_EQ(std::vector<int32_t>(out->ring.begin(), out->ring.end()), (std::vector<int32_t>{7, 1, 2}));
  EXPECT_EQ(out->blocks.size(), 7u);
  EXPECT_NE(
      prefill.handoff_out(1, 100, 1).status().message().find("holds ring blocks 2 .. 7, not the blocks 1 .. 7 to send"),
      std::string::npos);

  HandoffState state{.tokens = out->tokens, .last = out->last, .sampling = *out->sampling, .tail_end = out->tail_end};
  auto refused = [&](SequenceTable& table, std::vector<int32_t> ring, uint32_t first, const std::string& words) {
    const Status st = table.receive(
        IncomingHandoff{
            .seq_id = 5, .positions = 100, .blocks = {8, 9, 10, 11, 12, 13, 14}, .ring = ring, .ring_first = first},
        state);
    EXPECT_NE(st.message().find(words), std::string::npos) << st.message();
    EXPECT_EQ(table.size(), 0u);
  };
  SequenceTable decode(with_rings);
  refused(decode, {0, 1}, 4, "has a ring of blocks 4 .. 6; its next query at 100 needs blocks 4 .. 7");
  refused(decode, {0, 1}, 5, "has a ring of blocks 5 .. 7; its next query at 100 needs blocks 4 .. 7");
  refused(decode, {0, 1, 8}, 4, "names ring block 8, outside the ring pool of 8");
  SequenceTable plain(limits());
  refused(plain, {0, 1, 2}, 4, "comes with a ring, but this worker's KV pool has no rings");

  ASSERT_TRUE(decode
                  .receive(IncomingHandoff{.seq_id = 5,
                                           .positions = 100,
                                           .blocks = {8, 9, 10, 11, 12, 13, 14},
                                           .ring = {3, 0, 1},
                                           .ring_first = 4},
                           state)
                  .is_ok());
  EXPECT_EQ(decode.find(5)->ring, (std::vector<int32_t>{3, 0, 1}));
  plan.clear();
  runtime::SeqPlan& first_decode = add_next(plan, 5, 100);
  first_decode.ring = {3, 0, 1};
  first_decode.ring_first = 4;
  ASSERT_TRUE(decode.apply(plan).is_ok());
  EXPECT_EQ(decode.steps()[0].tokens[0], 11);
  EXPECT_EQ(decode.steps()[0].ring_first, 4u);
  EXPECT_EQ(decode.steps()[0].ring.size(), 3u);
  decode.commit(std::vector<int32_t>{12});
}

// A warm decode step (the plan's entries reused, every history with room to grow) allocates
// nothing: no allocation per sequence or token on the worker's hot path.
TEST(SequenceTable, AWarmDecodeStepAllocatesNothing) {
  constexpr uint32_t kStreams = 16;
  SequenceTable table(limits());
  runtime::StepPlan plan;
  for (uint64_t id = 1; id <= kStreams; ++id) add_first(plan, id, iota_tokens(40), {0, 1, 2, 3, 4}, true);
  run(table, plan);
  std::vector<int32_t> sampled(kStreams, 5);
  long allocations = 0;
  for (uint32_t pos = 40; pos < 78; ++pos) {  // histories grow once, at 41 (to 80)
    const long before = test::g_allocations.load();
    plan.clear();
    for (uint64_t id = 1; id <= kStreams; ++id) {
      runtime::SeqPlan& s = plan.add_seq();
      s.seq_id = id;
      s.start_pos = pos;
      s.sample = true;
    }
    ASSERT_TRUE(table.apply(plan).is_ok());
    table.commit(sampled);
    if (pos > 40) allocations += test::g_allocations.load() - before;
  }
  EXPECT_EQ(allocations, 0);
  EXPECT_EQ(table.find(1)->tokens.size(), 78u);
}

// A model of what the table must hold: per sequence, its positions and whether it has a
// sample to continue from. Random plans (valid, or with one bad entry), commits, aborts,
// trims and drops; after each, the table agrees with the model.
TEST(SequenceTable, RandomizedAgainstAModelOfPositions) {
  struct Model {
    uint32_t positions = 0, blocks = 0;
    int32_t last = -1;
  };
  std::mt19937 rng(1234);
  auto uniform = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
  SequenceTable table(limits());
  std::map<uint64_t, Model> model;
  int32_t next_block = 0;
  uint32_t refused = 0, committed = 0, aborted = 0;
  for (int round = 0; round < 3000; ++round) {
    const uint32_t op = uniform(10);
    if (op < 7) {
      runtime::StepPlan plan;
      std::map<uint64_t, Model> after = model;
      std::vector<uint64_t> sampled_ids;
      for (uint64_t id = 1; id <= 8; ++id) {
        if (uniform(2) == 0) continue;
        const bool held = model.count(id) > 0;
        Model m = held ? model[id] : Model{};
        const bool decode = held && m.last >= 0 && uniform(2) == 0;
        const uint32_t n = decode ? 1 : 1 + uniform(20);
        if (m.positions + n > 200) continue;  // trims and drops make room again
        std::vector<int32_t> blocks;
        for (const uint32_t need = (m.positions + n + kBt - 1) / kBt; m.blocks < need; ++m.blocks)
          blocks.push_back(next_block++ % static_cast<int32_t>(kBlocks));
        std::vector<int32_t> tokens = decode ? std::vector<int32_t>{} : iota_tokens(n, 1 + uniform(9));
        const bool sample = uniform(3) > 0;
        if (held)
          add_next(plan, id, m.positions, std::move(tokens), std::move(blocks), sample);
        else
          add_first(plan, id, std::move(tokens), std::move(blocks), sample);
        m.positions += n;
        if (sample) sampled_ids.push_back(id);
        after[id] = m;
      }
      const bool make_bad = uniform(5) == 0 && !plan.seqs().empty();
      if (make_bad) add_next(plan, 100 + uniform(3), 0, {1}, {0});  // never held: refused
      const Status st = table.apply(plan);
      if (make_bad) {
        ASSERT_FALSE(st.is_ok());
        ++refused;
      } else {
        ASSERT_TRUE(st.is_ok()) << st.message();
        if (uniform(4) == 0) {
          table.abort();
          ++aborted;
        } else {
          std::vector<int32_t> tokens;
          for (size_t i = 0; i < sampled_ids.size(); ++i) tokens.push_back(static_cast<int32_t>(uniform(kVocab)));
          ASSERT_EQ(table.to_sample().size(), tokens.size());
          table.commit(tokens);
          for (size_t i = 0; i < sampled_ids.size(); ++i) after[sampled_ids[i]].last = tokens[i];
          model = after;
          ++committed;
        }
      }
    } else if (op < 9 && !model.empty()) {
      auto it = std::next(model.begin(), uniform(static_cast<uint32_t>(model.size())));
      const uint32_t keep = uniform(it->second.positions + 1);
      ASSERT_TRUE(table.trim(it->first, keep).is_ok());
      if (keep < it->second.positions) it->second.last = -1;
      it->second.positions = keep;
      it->second.blocks = std::min(it->second.blocks, (keep + kBt - 1) / kBt);
    } else if (!model.empty()) {
      auto it = std::next(model.begin(), uniform(static_cast<uint32_t>(model.size())));
      table.drop(it->first);
      model.erase(it);
    }
    ASSERT_EQ(table.size(), model.size()) << "round " << round;
    for (const auto& [id, m] : model) {
      const Sequence* s = table.find(id);
      ASSERT_NE(s, nullptr) << "round " << round;
      ASSERT_EQ(s->tokens.size(), m.positions) << "round " << round << " seq " << id;
      ASSERT_EQ(s->blocks.size(), m.blocks) << "round " << round << " seq " << id;
      ASSERT_EQ(s->last, m.last) << "round " << round << " seq " << id;
    }
  }
  EXPECT_GT(refused, 100u);
  EXPECT_GT(committed, 1000u);
  EXPECT_GT(aborted, 200u);
}
}  // namespace
}  // namespace tandem::worker

namespace tandem::worker {
namespace {

// A speculating round (#19 Part B): it continues from the positions held, drafts from the
// sequence's own tokens within max_drafts, max_len, its blocks and (with a tail) its block;
// commit keeps the accepted drafts only; keep_blocks cuts the block table first; abort restores
// all of it; a worker that does not speculate refuses the entry.
TEST(SequenceTableSpec, RoundsDraftFromTheHistoryAndCommitKeepsTheAcceptedOnly) {
  TableLimits lim = limits();
  lim.spec_tokens = 4;
  SequenceTable table(lim);
  runtime::StepPlan plan;
  // A prompt that repeats: 1 2 3 1 2 3 1 2, then the sample 3 (so "2 3" occurred before).
  add_first(plan, 1, {1, 2, 3, 1, 2, 3, 1, 2}, {0, 1}, true);
  run(table, plan, 3);
  plan.clear();
  runtime::SeqPlan& s = add_next(plan, 1, /*start: unused*/ 99);
  s.speculate = true;
  s.max_drafts = 4;
  s.max_len = 100;
  ASSERT_TRUE(table.apply(plan).is_ok());
  ASSERT_EQ(table.to_sample().size(), 1u);
  const SampleRequest& q = table.to_sample()[0];
  // "1 2 3" last occurred at 3: what followed it, the loop going on past the history's end.
  EXPECT_EQ(std::vector<int32_t>(q.drafts.begin(), q.drafts.end()), (std::vector<int32_t>{1, 2, 3, 1}));
  EXPECT_EQ(table.steps()[0].start_pos, 8u);
  EXPECT_EQ(table.steps()[0].n_logits, 5u);
  EXPECT_EQ(q.history.size(), 13u);  // 8 held + the sample + 4 drafts
  const std::vector<int32_t> sampled = {9};
  const std::vector<uint32_t> accepted = {2};
  table.commit(sampled, accepted);
  const Sequence* seq = table.find(1);
  EXPECT_EQ(seq->tokens, (std::vector<int32_t>{1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2}));
  EXPECT_EQ(seq->last, 9);
  EXPECT_EQ(seq->tail_end, 13);  // the end of the last write, rejected drafts' included

  // max_len leaves room for one token more: no drafts (the round emits one token).
  plan.clear();
  add_round(plan, 1, 4, 13);
  ASSERT_TRUE(table.apply(plan).is_ok());
  EXPECT_TRUE(table.to_sample()[0].drafts.empty());
  table.abort();
  EXPECT_EQ(table.find(1)->tokens.size(), 11u);

  // keep_blocks cuts the table before new blocks are appended; abort puts the cut ones back.
  plan.clear();
  runtime::SeqPlan& u = add_next(plan, 1, 0, {}, {5});
  u.speculate = true;
  u.max_drafts = 2;
  u.max_len = 100;
  u.keep_blocks = 1;
  ASSERT_TRUE(table.apply(plan).is_ok());
  EXPECT_EQ(std::vector<int32_t>(table.steps()[0].blocks.begin(), table.steps()[0].blocks.end()),
            (std::vector<int32_t>{0, 5}));
  table.abort();
  EXPECT_EQ(table.find(1)->blocks, (std::vector<int32_t>{0, 1}));
  u.keep_blocks = 3;
  EXPECT_FALSE(table.apply(plan).is_ok());  // more than it holds

  SequenceTable plain(limits());
  plan.clear();
  add_first(plan, 1, {1, 2, 3}, {0}, true);
  run(plain, plan);
  plan.clear();
  add_next(plan, 1, 0).speculate = true;
  const Status st = plain.apply(plan);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("does not speculate"), std::string::npos) << st.message();
}

TEST(SequenceTableSpec, WithATailARoundStaysInItsBlock) {
  TableLimits lim = limits(2);
  lim.spec_tokens = 4;
  SequenceTable table(lim);
  runtime::StepPlan plan;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 13; ++i) prompt.push_back(1 + i % 2);  // 1 2 1 2 ...: drafts always found
  add_first(plan, 1, prompt, {0, 1}, true).tail_blocks = {10, 11};
  run(table, plan, 2);
  plan.clear();
  runtime::SeqPlan& s = add_next(plan, 1, 0);
  s.speculate = true;
  s.max_drafts = 4;
  s.max_len = 100;
  ASSERT_TRUE(table.apply(plan).is_ok());
  // The last sample goes in at position 13: positions 14 and 15 are left in block 0.
  EXPECT_EQ(table.to_sample()[0].drafts.size(), 2u);
  table.abort();
}

TEST(SequenceTableSpec, AWarmSpeculatingRoundAllocatesNothing) {
  constexpr uint32_t kStreams = 16;
  TableLimits lim = limits();
  lim.spec_tokens = 4;
  SequenceTable table(lim);
  runtime::StepPlan plan;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(1 + i % 4);  // 1 2 3 4 1 2 ...: drafts found
  for (uint64_t id = 1; id <= kStreams; ++id) add_first(plan, id, prompt, {0, 1, 2, 3, 4}, true);
  run(table, plan, 1);
  std::vector<int32_t> sampled(kStreams);
  std::vector<uint32_t> accepted(kStreams);
  long allocations = 0;
  size_t drafts = 0;
  // Histories (drafts included) grow once, in the first round (to 80 tokens).
  for (int round = 0; table.find(1)->tokens.size() + 6 < 80; ++round) {
    const long before = test::g_allocations.load();
    plan.clear();
    for (uint64_t id = 1; id <= kStreams; ++id) {
      runtime::SeqPlan& s = plan.add_seq();
      s.seq_id = id;
      s.sample = s.speculate = true;
      s.max_drafts = 4;
      s.max_len = 1000;
    }
    ASSERT_TRUE(table.apply(plan).is_ok());
    for (size_t i = 0; i < kStreams; ++i) {  // every draft accepted, the pattern continued
      const SampleRequest& q = table.to_sample()[i];
      accepted[i] = static_cast<uint32_t>(q.drafts.size());
      sampled[i] = 1 + q.history.back() % 4;
      drafts += q.drafts.size();
    }
    table.commit(sampled, accepted);
    if (round > 0) allocations += test::g_allocations.load() - before;
  }
  EXPECT_EQ(allocations, 0);
  EXPECT_GT(drafts, 16u * 8);
}

// With a draft model the table leaves a round's drafts for it (to_draft(): placeholders, q rows
// at temperature > 0, the valid draft KV), bounded by the draft's context too; commit, a
// rollback and a trim lower the valid draft positions to what they keep; abort restores them.
TEST(SequenceTableSpec, ADraftModelRoundIsLeftToItAndItsValidPositionsFollowTheKeptOnes) {
  TableLimits lim = limits();
  lim.spec_tokens = 4;
  lim.draft_model = true;
  lim.draft_context_length = 11;
  SequenceTable table(lim);
  runtime::StepPlan plan;
  add_first(plan, 1, {1, 2, 3, 4, 5, 6, 7, 8}, {0, 1}, true).sampling.temperature = 1.0f;
  run(table, plan, 3);
  EXPECT_EQ(table.find(1)->draft_pos, 0u);
  plan.clear();
  add_round(plan, 1, 4, 100);
  ASSERT_TRUE(table.apply(plan).is_ok());
  ASSERT_EQ(table.to_draft().size(), 1u);
  const workers::DraftJob& job = table.to_draft()[0];
  // The sample goes in at 8; the draft model writes up to at + k - 1 < its context (11): 3 drafts.
  EXPECT_EQ(job.k, 3u);
  EXPECT_EQ(job.tokens.size(), 12u);
  EXPECT_EQ(job.q.size(), 3u * kVocab);
  EXPECT_EQ(table.to_sample()[0].q.size(), 3u * kVocab);
  EXPECT_EQ(table.to_sample()[0].drafts.size(), 3u);
  *job.draft_pos = 11;  // what DraftModel::draft sets: positions [0, at + k)
  const std::vector<int32_t> sampled = {9};
  const std::vector<uint32_t> accepted = {1};
  table.commit(sampled, accepted);
  EXPECT_EQ(table.find(1)->tokens.size(), 10u);
  EXPECT_EQ(table.find(1)->draft_pos, 10u) << "the accepted positions only";
  // A rollback, then abort: the valid positions come back.
  plan.clear();
  add_next(plan, 1, 4, {5, 6});
  ASSERT_TRUE(table.apply(plan).is_ok());
  EXPECT_EQ(table.find(1)->draft_pos, 4u);
  table.abort();
  EXPECT_EQ(table.find(1)->draft_pos, 10u);
  ASSERT_TRUE(table.trim(1, 6).is_ok());
  EXPECT_EQ(table.find(1)->draft_pos, 6u);
}

}  // namespace
}  // namespace tandem::worker

namespace tandem::worker {
namespace {

TableLimits hybrid_limits(uint32_t slots) {
  TableLimits l = limits();
  l.state_slots = slots;
  return l;
}

// Every held sequence has its own slot and held + free = total.
void expect_slots_accounted(const SequenceTable& table, const std::vector<uint64_t>& ids, uint32_t total) {
  std::vector<int32_t> held;
  for (uint64_t id : ids)
    if (const Sequence* s = table.find(id)) held.push_back(s->state_slot);
  std::sort(held.begin(), held.end());
  EXPECT_EQ(std::adjacent_find(held.begin(), held.end()), held.end()) << "a slot held twice";
  for (int32_t s : held) EXPECT_TRUE(s >= 0 && static_cast<uint32_t>(s) < total) << s;
  EXPECT_EQ(held.size() + table.free_state_slots(), total);
}

TEST(SequenceTableHybrid, NewSequencesTakeSlotsAndFinishOrCancelReturnsThem) {
  SequenceTable table(hybrid_limits(2));
  EXPECT_EQ(table.free_state_slots(), 2u);
  runtime::StepPlan plan;
  add_first(plan, 1, iota_tokens(5), {0}, true);
  add_first(plan, 2, iota_tokens(5), {1}, true);
  ASSERT_TRUE(table.apply(plan).is_ok());
  EXPECT_NE(table.steps()[0].state_slot, table.steps()[1].state_slot);
  EXPECT_GE(table.steps()[0].state_slot, 0);
  table.commit(std::vector<int32_t>{7, 7});
  EXPECT_EQ(table.free_state_slots(), 0u);

  runtime::StepPlan third;  // no slot left: refused whole, nothing taken
  add_first(third, 3, iota_tokens(5), {2}, true);
  const Status full = table.apply(third);
  EXPECT_FALSE(full.is_ok());
  EXPECT_NE(full.message().find("recurrent state slots are free"), std::string::npos) << full.message();
  EXPECT_EQ(table.find(3), nullptr);

  table.drop(1);  // finished or cancelled: its slot is free again
  EXPECT_EQ(table.free_state_slots(), 1u);
  ASSERT_TRUE(table.apply(third).is_ok());
  table.abort();  // an engine refusal of a new sequence gives its slot back
  EXPECT_EQ(table.free_state_slots(), 1u);
  run(table, third);
  expect_slots_accounted(table, {1, 2, 3}, 2);
  table.drop_all();
  EXPECT_EQ(table.free_state_slots(), 2u);
}

TEST(SequenceTableHybrid, WhatARecurrentStateCannotDoIsRefused) {
  SequenceTable table(hybrid_limits(4));
  runtime::StepPlan plan;
  add_first(plan, 1, iota_tokens(20), {0, 1}, true);
  run(table, plan);
  runtime::StepPlan back;  // a rollback (a preempted recompute comes as a new sequence instead)
  add_next(back, 1, 10, iota_tokens(3));
  const Status rolled = table.apply(back);
  EXPECT_FALSE(rolled.is_ok());
  EXPECT_NE(rolled.message().find("cannot roll back"), std::string::npos) << rolled.message();
  runtime::StepPlan cached;  // a prefix-cache hit: KV blocks without a state
  runtime::SeqPlan& s = add_first(cached, 2, iota_tokens(4), {2, 3}, true);
  s.history = iota_tokens(16);
  s.start_pos = 16;
  const Status hit = table.apply(cached);
  EXPECT_FALSE(hit.is_ok());
  EXPECT_NE(hit.message().find("without a state checkpoint"), std::string::npos) << hit.message();
  s.restore_checkpoint = 0;  // with one (the actor copies it and checks its position) it starts
  ASSERT_TRUE(table.apply(cached).is_ok());
  table.abort();
  runtime::StepPlan again;  // a restore is a new sequence's only
  add_next(again, 1, 20, iota_tokens(1)).restore_checkpoint = 0;
  const Status twice = table.apply(again);
  EXPECT_FALSE(twice.is_ok());
  EXPECT_NE(twice.message().find("only a new sequence"), std::string::npos) << twice.message();
  IncomingHandoff in{.seq_id = 3, .positions = 1, .blocks = {4}};  // a handoff without a slot
  const std::vector<int32_t> one = {5};
  const Status slotless = table.receive(in, HandoffState{.tokens = one});
  EXPECT_NE(slotless.message().find("has no recurrent state slot"), std::string::npos) << slotless.message();
  EXPECT_EQ(table.free_state_slots(), 3u);
}

// Disaggregation: the decode worker takes a slot for a handed-off sequence's state when the
// scheduler announces it, refuses an announcement with no slot free (nothing taken), and every
// way a handoff ends (received, refused, dropped before it arrived, finished) returns the slot.
TEST(SequenceTableHybrid, AHandoffTakesASlotAtItsAnnouncementAndEveryEndReturnsIt) {
  SequenceTable prefill(hybrid_limits(2));
  runtime::StepPlan plan;
  add_first(plan, 1, iota_tokens(20), {3, 4}, true);
  run(prefill, plan, 11);
  auto out = prefill.handoff_out(1, 20);
  ASSERT_TRUE(out.is_ok());
  EXPECT_EQ(out->state_slot, prefill.find(1)->state_slot) << "the sender's slot travels";

  SequenceTable decode(hybrid_limits(2));
  ASSERT_TRUE(decode.expect(7, IncomingHandoff{.seq_id = 5, .positions = 20, .blocks = {30, 31}}).is_ok());
  ASSERT_TRUE(decode.expect(8, IncomingHandoff{.seq_id = 6, .positions = 20, .blocks = {32, 33}}).is_ok());
  const int32_t slot7 = decode.expected(7)->state_slot, slot8 = decode.expected(8)->state_slot;
  EXPECT_TRUE(slot7 >= 0 && slot8 >= 0 && slot7 != slot8) << slot7 << " " << slot8;
  EXPECT_EQ(decode.free_state_slots(), 0u);
  const Status full = decode.expect(9, IncomingHandoff{.seq_id = 7, .positions = 20, .blocks = {34, 35}});
  EXPECT_NE(full.message().find("handoff of sequence 7: no free recurrent state slot (all 2 are held"),
            std::string::npos)
      << full.message();
  EXPECT_EQ(decode.expected(9), nullptr);
  EXPECT_EQ(decode.expected_handoffs(), 2u);
  ASSERT_TRUE(decode.expect(7, IncomingHandoff{.seq_id = 5, .positions = 20, .blocks = {30, 31}}).is_ok());
  EXPECT_EQ(decode.expected(7)->state_slot, slot7) << "an announcement replaced keeps its slot";

  const HandoffState state{.tokens = out->tokens, .last = out->last, .sampling = *out->sampling, .tail_end = 20};
  auto taken = decode.take_expected(7);
  ASSERT_TRUE(decode.receive(*taken, state).is_ok());
  EXPECT_EQ(decode.find(5)->state_slot, slot7);
  plan.clear();
  add_next(plan, 5, 20, {}, {36});
  ASSERT_TRUE(decode.apply(plan).is_ok());
  EXPECT_EQ(decode.steps()[0].state_slot, slot7) << "the engine continues the state that arrived";
  decode.commit(std::vector<int32_t>{12});

  auto refused = decode.take_expected(8);  // its bytes do not fit: refused, the slot given back
  EXPECT_FALSE(decode.receive(*refused, HandoffState{.tokens = out->tokens.first(19)}).is_ok());
  decode.abandon(*refused);
  EXPECT_EQ(decode.free_state_slots(), 1u);
  ASSERT_TRUE(decode.expect(10, IncomingHandoff{.seq_id = 8, .positions = 20, .blocks = {40, 41}}).is_ok());
  EXPECT_EQ(decode.free_state_slots(), 0u);
  decode.drop(8);  // cancelled before its KV arrived
  EXPECT_EQ(decode.expected(10), nullptr);
  EXPECT_EQ(decode.free_state_slots(), 1u);
  expect_slots_accounted(decode, {5, 6, 7, 8}, 2);
  decode.drop(5);  // finished
  EXPECT_EQ(decode.free_state_slots(), 2u);
  ASSERT_TRUE(decode.expect(11, IncomingHandoff{.seq_id = 9, .positions = 20, .blocks = {40, 41}}).is_ok());
  decode.drop_all();
  EXPECT_EQ(decode.free_state_slots(), 2u);
}

// Random adds, decodes, aborts and drops (finish, cancel, preempt are all a drop on the
// worker): every slot is always either held by exactly one sequence or free.
TEST(SequenceTableHybrid, RandomizedSlotsAreNeverLostOrShared) {
  constexpr uint32_t kSlots = 5;
  SequenceTable table(hybrid_limits(kSlots));
  std::mt19937 rng(11);
  std::vector<uint64_t> ids;
  std::map<uint64_t, uint32_t> positions;
  uint64_t next_id = 1;
  int32_t next_block = 0;
  for (int round = 0; round < 400; ++round) {
    runtime::StepPlan plan;
    const uint32_t op = rng() % 4;
    if (op == 0 && next_block + 2 <= static_cast<int32_t>(kBlocks)) {
      add_first(plan, next_id, iota_tokens(1 + rng() % 8), {next_block}, true);
      ids.push_back(next_id++);
      ++next_block;
    } else if (op == 1 && !positions.empty()) {
      auto it = positions.begin();
      std::advance(it, rng() % positions.size());
      if (it->second + 1 >= kBt) continue;  // one block each
      add_next(plan, it->first, it->second);
    } else if (op == 2 && !positions.empty()) {
      auto it = positions.begin();
      std::advance(it, rng() % positions.size());
      table.drop(it->first);
      positions.erase(it);
      if (next_block >= static_cast<int32_t>(kBlocks) - 2) next_block = 0;
      expect_slots_accounted(table, ids, kSlots);
      continue;
    } else {
      continue;
    }
    if (!table.apply(plan).is_ok()) {  // out of slots: refused whole
      EXPECT_EQ(table.free_state_slots(), 0u);
      continue;
    }
    if (rng() % 5 == 0) {
      table.abort();
    } else {
      std::vector<int32_t> sampled(table.to_sample().size(), 7);
      for (const engine::SeqStep& st : table.steps()) (void)st;
      const uint64_t id = plan.seqs()[0].seq_id;
      table.commit(sampled);
      positions[id] = static_cast<uint32_t>(table.find(id)->tokens.size());
    }
    expect_slots_accounted(table, ids, kSlots);
  }
}

// Random local sequences, announced handoffs (some replaced), transfers that arrive (some
// refused and abandoned), steps and drops of held or announced sequences: every slot is always
// held by exactly one sequence or one announcement, or free.
TEST(SequenceTableHybrid, RandomizedHandoffsNeverLoseOrShareASlot) {
  constexpr uint32_t kSlots = 4;
  SequenceTable table(hybrid_limits(kSlots));
  std::mt19937 rng(5);
  std::map<uint64_t, uint64_t> pending;  // transfer id -> sequence id
  std::vector<uint64_t> ids;
  uint64_t next_id = 1, next_transfer = 100;
  const std::vector<int32_t> tokens = iota_tokens(4);
  uint32_t received = 0, refused = 0, full = 0, dropped_announced = 0;
  auto accounted = [&] {
    std::vector<int32_t> held;
    for (uint64_t id : ids)
      if (const Sequence* s = table.find(id)) held.push_back(s->state_slot);
    for (const auto& [transfer, id] : pending) held.push_back(table.expected(transfer)->state_slot);
    std::sort(held.begin(), held.end());
    EXPECT_EQ(std::adjacent_find(held.begin(), held.end()), held.end()) << "a slot held twice";
    EXPECT_TRUE(held.empty() || (held.front() >= 0 && held.back() < static_cast<int32_t>(kSlots)));
    EXPECT_EQ(held.size() + table.free_state_slots(), kSlots);
  };
  for (int round = 0; round < 800; ++round) {
    const uint32_t op = rng() % 5;
    if (op == 0) {  // a local sequence (refused whole when no slot is free)
      runtime::StepPlan plan;
      add_first(plan, next_id, iota_tokens(3), {0}, true);
      if (table.apply(plan).is_ok()) table.commit(std::vector<int32_t>{7});
      ids.push_back(next_id++);
    } else if (op == 1) {  // an announcement, new or replacing one
      const bool replace = !pending.empty() && rng() % 3 == 0;
      const uint64_t transfer = replace ? pending.begin()->first : next_transfer++;
      const uint64_t id = replace ? pending.begin()->second : next_id++;
      if (table.expect(transfer, IncomingHandoff{.seq_id = id, .positions = 4, .blocks = {1}}).is_ok()) {
        pending[transfer] = id;
      } else {
        EXPECT_EQ(table.free_state_slots(), 0u);
        ++full;
      }
      if (!replace) ids.push_back(id);
    } else if (op == 2 && !pending.empty()) {  // a transfer arrives, a third of them refused
      auto it = std::next(pending.begin(), static_cast<long>(rng() % pending.size()));
      auto taken = table.take_expected(it->first);
      pending.erase(it);
      const bool refuse = rng() % 3 == 0;
      const HandoffState state{.tokens = std::span(tokens).first(refuse ? 3 : 4), .last = 5};
      if (table.receive(*taken, state).is_ok()) {
        ++received;
      } else {
        table.abandon(*taken);
        ++refused;
      }
    } else if (op == 3 && !ids.empty()) {  // finished, cancelled or preempted, held or announced
      const uint64_t id = ids[rng() % ids.size()];
      table.drop(id);
      dropped_announced += static_cast<uint32_t>(std::erase_if(pending, [&](const auto& p) { return p.second == id; }));
    } else if (op == 4 && !ids.empty()) {  // a decode step of a held sequence
      const uint64_t id = ids[rng() % ids.size()];
      const Sequence* s = table.find(id);
      if (s == nullptr || s->tokens.size() + 1 >= kBt) continue;
      runtime::StepPlan plan;
      add_next(plan, id, static_cast<uint32_t>(s->tokens.size()));
      run(table, plan);
    }
    accounted();
  }
  EXPECT_TRUE(received > 0 && refused > 0 && full > 0 && dropped_announced > 0)
      << received << " " << refused << " " << full << " " << dropped_announced;
}

}  // namespace
}  // namespace tandem::worker

namespace tandem::worker {
namespace {

// The tiny qwen35 preset's state pool (2 slots, rollback 4): no engine runs here; its one effect
// on the pool, the position advanced by the positions fed, is played by StatePool::advance.
std::unique_ptr<engine::StatePool> tiny_hybrid_states() {
  const std::string path = test::temp_dir() + "/table-qwen35.gguf";
  const std::string cmd =
      std::string(TANDEM_TANDEM_BIN) + " make-model --arch qwen35 --preset tiny --out " + path + " >/dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto file = model::GgufFile::open(path);
  auto config = model::read_model_config(**file);
  return std::move(engine::StatePool::create(*config, 2, 4).value());
}

std::vector<int32_t> loop_of_three(uint32_t n) {
  std::vector<int32_t> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = 1 + static_cast<int32_t>(i % 3);
  return t;
}

// One speculating round of sequence 1: apply, the engine's advance, commit with `accepted`.
// Returns the drafts it carried.
size_t round_of(SequenceTable& table, engine::StatePool& states, uint32_t accepted) {
  runtime::StepPlan plan;
  add_round(plan, 1, 4, 1000);
  EXPECT_TRUE(table.apply(plan).is_ok());
  const size_t drafts = table.to_sample()[0].drafts.size();
  states.advance(static_cast<uint32_t>(table.steps()[0].state_slot), 1 + static_cast<uint32_t>(drafts));
  table.commit(std::vector<int32_t>{1}, std::vector<uint32_t>{std::min<uint32_t>(accepted, drafts)});
  return drafts;
}

// A hybrid's speculating rounds (docs/HYBRID.md, "Speculative decoding"): a round's drafts never
// complete a grid chunk (kGrid - 1 - (at + 1) % kGrid of them at most) nor pass the pool's
// rollback; commit rolls the slot back to the positions kept, abort to the step's start; trim
// rolls back or is refused where the state cannot; without a state pool a round is refused.
TEST(SequenceTableHybrid, SpeculatingRoundsRollTheStateBackToThePositionsKept) {
  auto states = tiny_hybrid_states();
  TableLimits lim = hybrid_limits(2);
  lim.spec_tokens = 4;
  SequenceTable table(lim, states.get());
  runtime::StepPlan plan;
  add_first(plan, 1, loop_of_three(58), {0, 1, 2, 3, 4}, true);
  ASSERT_TRUE(table.apply(plan).is_ok());
  const auto slot = static_cast<uint32_t>(table.steps()[0].state_slot);
  states->advance(slot, 58);
  table.commit(std::vector<int32_t>{2});
  EXPECT_EQ(round_of(table, *states, 1), 4u) << "fed at 58: rows up to 62";
  EXPECT_EQ(states->position(slot), 60u) << "the sample and one draft kept";
  EXPECT_EQ(round_of(table, *states, 2), 2u) << "fed at 60: drafts at 61 and 62, none at 63 (the fold)";
  EXPECT_EQ(states->position(slot), 63u);
  EXPECT_EQ(round_of(table, *states, 0), 4u) << "fed at 63 (it folds), drafts in the next chunk";
  EXPECT_EQ(states->position(slot), 64u);
  EXPECT_EQ(table.find(1)->tokens.size(), 64u);

  plan.clear();
  add_round(plan, 1, 4, 1000);
  ASSERT_TRUE(table.apply(plan).is_ok());
  states->advance(slot, 1 + static_cast<uint32_t>(table.to_sample()[0].drafts.size()));
  table.abort();  // e.g. sampling failed after the forward
  EXPECT_EQ(states->position(slot), 64u) << "abort rolls the state back to the step's start";
  const Status before_grid = table.trim(1, 63);
  EXPECT_NE(before_grid.message().find("go back to 64 at most"), std::string::npos) << before_grid.message();
  EXPECT_EQ(table.find(1)->tokens.size(), 64u) << "a refused trim changes nothing";

  plan.clear();  // a sequence fed at 62: its draft would be row 63
  add_first(plan, 2, loop_of_three(62), {5, 6, 7, 8}, true);
  ASSERT_TRUE(table.apply(plan).is_ok());
  states->advance(static_cast<uint32_t>(table.steps()[0].state_slot), 62);
  table.commit(std::vector<int32_t>{3});
  plan.clear();
  add_round(plan, 2, 4, 1000);
  ASSERT_TRUE(table.apply(plan).is_ok());
  EXPECT_TRUE(table.to_sample()[0].drafts.empty());
  table.abort();

  SequenceTable without(lim);  // no pool to roll a state back: speculation is refused
  plan.clear();
  add_first(plan, 1, loop_of_three(5), {0}, true);
  run(without, plan);
  plan.clear();
  add_round(plan, 1, 4, 1000);
  const Status refused = without.apply(plan);
  EXPECT_NE(refused.message().find("no state pool"), std::string::npos) << refused.message();
}

}  // namespace
}  // namespace tandem::worker
