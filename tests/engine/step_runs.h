// Running sequences through the engine in given chunks, several in one step: the helper of the
// bitwise chunking-and-batch tests (hybrid_engine_test, window_test).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "workers/engine/engine.h"

namespace tandem::engine::test_runs {

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
  std::vector<uint32_t> cuts;  // chunk ends within the tokens
  int32_t slot = -1;           // a hybrid's state slot
  std::vector<int32_t> tail;   // F32-window tail blocks (empty: none)
  std::vector<float> logits;   // every position's, [tokens][vocab]
  std::vector<int32_t> ring;   // rings: the windowed layers' blocks from ring_first on
  uint32_t ring_first = 0;
  size_t ring_peak = 0;  // the most ring blocks it held at once
};

// A pool with rings (KvPool::ring_blocks): free ring ids, reused last-freed first, so a block
// that left one sequence's window is at once overwritten by another position.
struct Rings {
  uint32_t window = 0;
  std::vector<int32_t> free_ids;
  // Before a step computing [from, to): frees the blocks every position of which is below
  // from + 1 - window, takes blocks up to `to`.
  void prepare(Seq& s, uint32_t from, uint32_t to, uint32_t bt) {
    const uint32_t first = from + 1 > window ? (from + 1 - window) / bt : 0;
    for (; s.ring_first < first && !s.ring.empty(); ++s.ring_first) {
      free_ids.push_back(s.ring.front());
      s.ring.erase(s.ring.begin());
    }
    while (s.ring_first + s.ring.size() < (to + bt - 1) / bt) {
      ASSERT_FALSE(free_ids.empty()) << "the ring pool is out of blocks";
      s.ring.push_back(free_ids.back());
      free_ids.pop_back();
    }
    s.ring_peak = std::max(s.ring_peak, s.ring.size());
  }
};

// Runs every sequence through its chunks, the i-th chunks of all sequences in one step, every
// position's logits kept; tails carry their tail_end (the previous chunk's end).
inline void run(Engine& e, KvPool& kv, StatePool* states, std::vector<Seq>& seqs, Rings* rings = nullptr) {
  size_t most = 0;
  for (const Seq& s : seqs) most = std::max(most, s.cuts.size());
  for (size_t c = 0; c < most; ++c) {
    std::vector<SeqStep> step;
    std::vector<Seq*> in;
    for (Seq& s : seqs) {
      if (c >= s.cuts.size()) continue;
      const uint32_t from = c == 0 ? 0 : s.cuts[c - 1], to = s.cuts[c];
      SeqStep q{
          std::span(s.tokens).subspan(from, to - from), from, s.blocks, to - from, s.tail, c == 0 ? -1 : int64_t{from}};
      q.state_slot = s.slot;
      if (rings) {
        rings->prepare(s, from, to, kv.block_tokens());
        q.ring = s.ring;
        q.ring_first = s.ring_first;
      }
      step.push_back(q);
      in.push_back(&s);
    }
    const Status st = e.forward(step, kv, states);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    uint32_t row = 0;
    for (size_t i = 0; i < step.size(); ++i)
      for (uint32_t r = 0; r < step[i].n_logits; ++r, ++row)
        in[i]->logits.insert(in[i]->logits.end(), e.logits(row).begin(), e.logits(row).end());
  }
  for (const Seq& s : seqs) ASSERT_EQ(s.logits.size(), s.tokens.size() * size_t{e.config().vocab_size});
}

// Chunk ends of n tokens cut in the sizes given, repeated.
inline std::vector<uint32_t> cuts_every(uint32_t n, std::vector<uint32_t> sizes) {
  std::vector<uint32_t> cuts;
  for (uint32_t at = 0, i = 0; at < n; ++i) cuts.push_back(at = std::min(n, at + sizes[i % sizes.size()]));
  return cuts;
}

}  // namespace tandem::engine::test_runs
