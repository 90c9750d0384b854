// The per-worker KV cache manager: slots, the tail blocks, the headroom rule, prefix matching
// and publishing, trim and free, against the pool's own counts.
#include "scheduler/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

namespace tandem::scheduler {
namespace {

std::vector<int32_t> tokens(uint32_t n, int32_t first = 3) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(KvCacheManager, ASequenceTakesItsTailOnceAndGrowsABlockAtATime) {
  KvCacheManager kv(16, 4, 2, true, xxh3_block_hash);
  KvSeq seq;
  ASSERT_TRUE(kv.allocate_slots(seq, 5));  // 2 blocks + 2 tail
  EXPECT_EQ(seq.blocks(), 2u);
  EXPECT_EQ(kv.tail(seq).size(), 2u);
  EXPECT_EQ(kv.used(), 4u);
  ASSERT_TRUE(kv.allocate_slots(seq, 8));  // still 2 blocks
  EXPECT_EQ(kv.used(), 4u);
  ASSERT_TRUE(kv.allocate_slots(seq, 9));
  EXPECT_EQ(seq.blocks(), 3u);
  EXPECT_EQ(kv.tail(seq).size(), 2u);  // the tail is not taken again
  EXPECT_EQ(kv.take_unsent(seq).size(), 3u);
  EXPECT_EQ(kv.take_unsent(seq).size(), 0u);
  kv.free(seq);
  EXPECT_TRUE(seq.empty());
  EXPECT_EQ(kv.free(), 16u);
  EXPECT_TRUE(kv.consistent());
}

TEST(KvCacheManager, AFailedAllocationChangesNothing) {
  KvCacheManager kv(4, 4, 1, true, xxh3_block_hash);
  KvSeq a, b;
  ASSERT_TRUE(kv.allocate_slots(a, 8));   // 2 + 1 tail
  EXPECT_FALSE(kv.allocate_slots(b, 5));  // needs 2 + 1, 1 left: b holds nothing after
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(kv.free(), 1u);
  EXPECT_FALSE(kv.allocate_slots(a, 13));  // 2 more blocks: only 1 free
  EXPECT_EQ(a.blocks(), 2u);
  EXPECT_EQ(kv.free(), 1u);
  EXPECT_TRUE(kv.can_ever_fit(12));   // 3 blocks + the tail = 4
  EXPECT_FALSE(kv.can_ever_fit(13));  // 4 + 1
  kv.free(a);
  EXPECT_EQ(kv.free(), 4u);
  EXPECT_TRUE(kv.consistent());
}

TEST(KvCacheManager, APublishedPrefixIsMatchedSharedAndNeedsLessRoom) {
  KvCacheManager kv(8, 4, 0, true, xxh3_block_hash);
  const std::vector<int32_t> t = tokens(10);
  PrefixKeys keys_a, keys_b;
  KvSeq a;
  ASSERT_TRUE(kv.allocate_slots(a, 10, kv.match_prefix(t, keys_a)));
  kv.publish(a, t, 10, keys_a);  // 2 full blocks
  PrefixHit hit = kv.match_prefix(t, keys_b);
  EXPECT_EQ(hit.blocks(), 2u);
  EXPECT_EQ(kv.hit_tokens(hit), 8u);
  // 3 blocks for 10 positions + 1, 2 of them shared: 1 fresh, and a block for the 1-4 running.
  EXPECT_TRUE(kv.has_room(hit, 10, 1));
  EXPECT_FALSE(kv.has_room(hit, 10, 100));  // 25 blocks of headroom
  KvSeq b;
  ASSERT_TRUE(kv.allocate_slots(b, 10, hit));
  EXPECT_EQ(kv.used(), 4u);  // 3 + 1: b shares a's first two
  EXPECT_EQ(kv.blocks(b)[0], kv.blocks(a)[0]);
  // A whole prompt in the cache still leaves its last position to compute.
  EXPECT_EQ(kv.match_prefix(tokens(8), keys_b).blocks(), 1u);
  kv.free(a);
  kv.free(b);
  EXPECT_EQ(kv.cached(), 2u);
  EXPECT_TRUE(kv.consistent());
}

TEST(KvCacheManager, TrimFreesWholeBlocksAndUnpublishesRejectedTokens) {
  KvCacheManager kv(8, 4, 1, true, xxh3_block_hash);
  const std::vector<int32_t> t = tokens(13);
  PrefixKeys keys;
  KvSeq seq;
  ASSERT_TRUE(kv.allocate_slots(seq, 13));  // 4 blocks + 1 tail
  EXPECT_EQ(kv.take_unsent(seq).size(), 4u);
  kv.publish(seq, t, 13, keys);  // 3 full blocks
  kv.trim(seq, 6);               // keeps 2 blocks; only block 0 is still full
  EXPECT_EQ(seq.blocks(), 2u);
  EXPECT_EQ(kv.tail(seq).size(), 1u);
  EXPECT_EQ(kv.used(), 3u);
  PrefixKeys fresh;
  EXPECT_EQ(kv.match_prefix(t, fresh).blocks(), 1u);  // blocks 1 and 2 held rejected tokens
  ASSERT_TRUE(kv.allocate_slots(seq, 9));
  EXPECT_EQ(kv.take_unsent(seq).size(), 1u);  // the regrown block is sent again
  kv.trim(seq, 20);                           // past its end: nothing changes
  EXPECT_EQ(seq.blocks(), 3u);
  kv.free(seq);
  EXPECT_EQ(kv.free() + kv.cached(), 8u);
  EXPECT_TRUE(kv.consistent());
}

TEST(KvCacheManager, RandomizedGrowTrimFreeReturnsEveryBlock) {
  KvCacheManager kv(64, 4, 1, true, xxh3_block_hash);
  std::mt19937 rng(7);
  std::vector<KvSeq> seqs(8);
  std::vector<uint32_t> len(8, 0);
  std::vector<PrefixKeys> keys(8);
  const std::vector<int32_t> t = tokens(200);
  for (int step = 0; step < 5000; ++step) {
    const size_t i = rng() % seqs.size();
    switch (rng() % 4) {
      case 0:
      case 1: {
        const uint32_t n = len[i] + 1 + rng() % 6;
        if (n < t.size() && kv.allocate_slots(seqs[i], n)) len[i] = n;
        kv.publish(seqs[i], t, len[i], keys[i]);
        break;
      }
      case 2:
        if (len[i] > 0) kv.trim(seqs[i], len[i] -= std::min<uint32_t>(len[i], 1 + rng() % 5));
        break;
      default:
        kv.free(seqs[i]);
        keys[i] = {};
        len[i] = 0;
    }
    ASSERT_TRUE(kv.consistent());
  }
  for (KvSeq& s : seqs) kv.free(s);
  EXPECT_EQ(kv.free() + kv.cached(), 64u);
  EXPECT_EQ(kv.used(), 0u);
}

// Rings (set_rings): a windowed layer's blocks of one sequence stay bounded by the window while
// the full layers' blocks grow with the context.
TEST(KvCacheManagerRings, TheRingStopsGrowingAtTheWindowAndFreeReturnsBothPools) {
  KvCacheManager kv(128, 4, 1, false, xxh3_block_hash);
  kv.set_rings(8, 10, 2, 1);          // W = 10, margin 2, one position a step
  EXPECT_EQ(kv.ring_need(1000), 4u);  // the blocks of 9 + 2 + 1 positions, plus one
  KvSeq seq;
  for (uint32_t c = 0; c < 400; ++c) {
    kv.release_window(seq, c);
    ASSERT_TRUE(kv.allocate_slots(seq, c + 1));
    ASSERT_LE(seq.ring_blocks(), kv.ring_need(c + 1));
    ASSERT_EQ(seq.ring_first() + seq.ring_blocks(), seq.blocks());
    ASSERT_LE(seq.ring_first() * 4, c + 1 > 10 ? c + 1 - 10 : 0);  // the window's keys are all held
  }
  EXPECT_EQ(seq.blocks(), 100u);
  EXPECT_EQ(kv.ring_used(), seq.ring_blocks());
  kv.free(seq);
  EXPECT_TRUE(seq.empty());
  EXPECT_EQ(kv.free(), 128u);
  EXPECT_EQ(kv.ring_free(), 8u);
  EXPECT_TRUE(kv.consistent());
}

// A placement reserves a whole prompt's full blocks but only the ring cap's ring blocks (the
// service places a 300-token prompt on a ring pool smaller than its blocks); each step's
// allocate_slots then grows the ring as release_window frees its front.
TEST(KvCacheManagerRings, APlacedPromptTakesTheRingCapAndItsRingGrowsStepByStep) {
  KvCacheManager kv(64, 4, 0, false, xxh3_block_hash);
  kv.set_rings(4, 8, 0, 4);  // cap: the blocks of 7 + 4 positions, plus one = 4
  KvSeq s;
  ASSERT_TRUE(kv.allocate_slots(s, 40));
  EXPECT_EQ(s.blocks(), 10u);
  EXPECT_EQ(s.ring_blocks(), 4u);
  for (uint32_t fed = 0; fed < 40; fed += 4) {
    kv.release_window(s, fed);
    ASSERT_TRUE(kv.allocate_slots(s, fed + 4)) << fed;
    ASSERT_GE(s.ring_first() + s.ring_blocks(), (fed + 4 + 3) / 4) << fed;  // reaches the step's last block
    ASSERT_LE(s.ring_first() * 4, fed + 1 > 8 ? fed + 1 - 8 : 0) << fed;    // holds the first query's keys
  }
  kv.free(s);
  EXPECT_EQ(kv.free(), 64u);
  EXPECT_EQ(kv.ring_free(), 4u);
  EXPECT_TRUE(kv.consistent());
}

TEST(KvCacheManagerRings, AFullRingPoolRefusesAndTakesNoFullBlock) {
  KvCacheManager kv(64, 4, 0, false, xxh3_block_hash);
  kv.set_rings(3, 8, 0, 4);
  EXPECT_FALSE(kv.can_ever_fit(1000));  // 4 ring blocks needed, 3 exist
  KvSeq a, b;
  ASSERT_TRUE(kv.allocate_slots(a, 8));  // 2 ring blocks
  EXPECT_FALSE(kv.has_room({}, 8, 0));
  EXPECT_FALSE(kv.allocate_slots(b, 8));
  EXPECT_TRUE(b.empty());
  ASSERT_TRUE(kv.allocate_slots(a, 12));
  EXPECT_FALSE(kv.allocate_slots(a, 16));  // the ring pool is out: a keeps its 3 full blocks
  EXPECT_EQ(a.blocks(), 3u);
  EXPECT_EQ(kv.used(), 3u);
  kv.release_window(a, 12);  // keys from 5 on: block 0 (positions 0..3) leaves
  EXPECT_EQ(a.ring_first(), 1u);
  ASSERT_TRUE(kv.allocate_slots(a, 16));
  kv.free(a);
  EXPECT_EQ(kv.free(), 64u);
  EXPECT_EQ(kv.ring_free(), 3u);
}

// Many sequences grow by chunks, are trimmed back (never past the margin behind the first query
// their ring was released for), and are finished, cancelled or preempted (free) at random; against
// a model of which ring blocks each must hold.
TEST(KvCacheManagerRings, RandomizedRingsReleaseAsTheWindowPassesAndEveryBlockComesBack) {
  constexpr uint32_t kB = 4, kW = 11, kMargin = 3, kStep = 6;
  KvCacheManager kv(256, kB, 1, false, xxh3_block_hash);
  kv.set_rings(40, kW, kMargin, kStep);
  std::mt19937 rng(11);
  struct Model {
    KvSeq seq;
    uint32_t len = 0, first = 0, released_for = 0;
  };
  std::vector<Model> seqs(6);
  uint32_t releases = 0;
  for (int step = 0; step < 20000; ++step) {
    Model& m = seqs[rng() % seqs.size()];
    const uint32_t op = rng() % 8;
    if (op < 5) {  // a step computing positions len .. len + n - 1
      const uint32_t n = 1 + rng() % kStep, before = m.seq.ring_first();
      kv.release_window(m.seq, m.len);
      releases += m.seq.ring_first() > before;
      if (m.len + 1 >= kW + kMargin) m.first = std::max(m.first, (m.len + 1 - kW - kMargin) / kB);
      m.first = std::min(m.first, m.seq.blocks());
      m.released_for = std::max(m.released_for, m.len);
      if (kv.allocate_slots(m.seq, m.len + n)) m.len += n;
      ASSERT_EQ(m.seq.ring_first(), m.first);  // released exactly as the window passed
      ASSERT_LE(m.seq.ring_first() * kB, m.len > kW ? m.len - kW : 0);
    } else if (op < 7) {  // a speculative trim, within the margin
      const uint32_t floor = m.released_for > kMargin ? m.released_for - kMargin : 0;
      if (m.len > floor + 1) kv.trim(m.seq, m.len = floor + 1 + rng() % (m.len - floor - 1));
    } else {  // finish, cancel or preempt: all free
      kv.free(m.seq);
      m = Model{};
    }
    uint32_t ring = 0;
    for (const Model& s : seqs) {
      ASSERT_EQ(s.seq.ring_first() + s.seq.ring_blocks(), s.seq.blocks());
      ASSERT_LE(s.seq.ring_blocks(), kv.ring_need(s.len));
      ring += s.seq.ring_blocks();
    }
    ASSERT_EQ(kv.ring_used(), ring);
    ASSERT_TRUE(kv.consistent());
  }
  EXPECT_GT(releases, 1000u);
  for (Model& m : seqs) kv.free(m.seq);
  EXPECT_EQ(kv.free(), 256u);
  EXPECT_EQ(kv.ring_free(), 40u);
}

// bench/RESULTS.md "Rings": gemma3 small's shape (W = 512, blocks of 16; 18 layers, 15 windowed),
// a prompt in chunks of 512 then one position a step: the ring holds the same blocks at 1k, 4k
// and 16k while the full layers' table grows with the context.
TEST(KvCacheManagerRings, TheRingHoldsTheSameBlocksAt1k4kAnd16k) {
  KvCacheManager kv(1u << 12, 16, 0, false, xxh3_block_hash);
  kv.set_rings(64, 512, 0, 512);
  KvSeq seq;
  uint32_t c = 0;
  std::vector<uint32_t> ring_at;
  for (const uint32_t context : {1024u, 4096u, 16384u}) {
    for (; c < context; c += c < 2048 ? 512 : 1) {
      kv.release_window(seq, c);
      ASSERT_TRUE(kv.allocate_slots(seq, c + (c < 2048 ? 512 : 1)));
    }
    kv.release_window(seq, c);  // before the next step
    ring_at.push_back(seq.ring_blocks());
    std::printf("context %u: full-layer blocks %u, ring blocks %u\n", context, seq.blocks(), seq.ring_blocks());
  }
  EXPECT_EQ(ring_at[0], 32u);  // the 511 keys a query at 1024 sees, from block 32 on
  EXPECT_EQ(ring_at[1], ring_at[0]);
  EXPECT_EQ(ring_at[2], ring_at[0]);
  EXPECT_EQ(seq.blocks(), 1024u);
  kv.free(seq);
}

}  // namespace
}  // namespace tandem::scheduler
