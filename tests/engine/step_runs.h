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
};

// Runs every sequence through its chunks, the i-th chunks of all sequences in one step, every
// position's logits kept; tails carry their tail_end (the previous chunk's end).
inline void run(Engine& e, KvPool& kv, StatePool* states, std::vector<Seq>& seqs) {
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
