// The per-worker KV cache manager: slots, the tail blocks, the headroom rule, prefix matching
// and publishing, trim and free, against the pool's own counts.
#include "scheduler/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
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

// Runs `seq` over tokens [from, to) in steps of `step` as the planner does (release_window,
// allocate_slots, publish); returns the ring block it held at each logical block.
std::vector<int32_t> run_ring(KvCacheManager& kv, KvSeq& seq, std::span<const int32_t> t, PrefixKeys& keys,
                              uint32_t from, uint32_t to, uint32_t step) {
  std::vector<int32_t> held;
  for (uint32_t fed = from; fed < to; fed += step) {
    kv.release_window(seq, fed);
    const uint32_t n = std::min(step, to - fed);
    EXPECT_TRUE(kv.allocate_slots(seq, fed + n));
    kv.publish(seq, t, fed + n, keys);
    const std::span<const int32_t> ring = kv.ring(seq);
    for (size_t b = 0; b < ring.size(); ++b) {
      const size_t logical = seq.ring_first() + b;
      if (held.size() <= logical) held.resize(logical + 1, -1);
      held[logical] = ring[b];
    }
  }
  return held;
}

// Prefix caching with rings: a publishing sequence's ring blocks that leave the window are
// cached, not freed; a hit shares the full blocks and the window that ends at it, and the
// ring's later blocks are fresh.
TEST(KvCacheManagerRings, APublishedPrefixKeepsItsWindowAndAHitSharesIt) {
  constexpr uint32_t kB = 4, kW = 10;
  KvCacheManager kv(64, kB, 0, true, xxh3_block_hash);
  kv.set_rings(16, kW, 0, 4);  // cap: the blocks of 9 + 4 positions, plus one = 4
  const std::vector<int32_t> a_tokens = tokens(40);
  PrefixKeys keys_a;
  KvSeq a;
  const std::vector<int32_t> a_ring = run_ring(kv, a, a_tokens, keys_a, 0, 40, 4);
  EXPECT_EQ(a.ring_first(), 6u);    // (36 + 1 - 10) / 4: blocks 0..5 left the window
  EXPECT_EQ(kv.ring_cached(), 6u);  // ... and stay cached: every published end keeps its window
  EXPECT_EQ(kv.ring_used(), a.ring_blocks());
  // B shares A's first 30 tokens: full blocks 0..6 (28 tokens), and the window a query at 28
  // sees (19..28): ring blocks 4, 5, 6.
  std::vector<int32_t> b_tokens = tokens(50);
  std::iota(b_tokens.begin() + 30, b_tokens.end(), 1000);
  PrefixKeys keys_b;
  const PrefixHit hit = kv.match_prefix(b_tokens, keys_b);
  EXPECT_EQ(hit.blocks(), 7u);
  EXPECT_EQ(hit.ring_blocks(), 3u);
  EXPECT_TRUE(kv.has_room(hit, 50, 1));
  KvSeq b;
  ASSERT_TRUE(kv.allocate_slots(b, 32, hit));
  EXPECT_EQ(b.ring_first(), 4u);
  ASSERT_EQ(b.ring_blocks(), 4u);  // the 3 shared, then one fresh for positions 28..31
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(kv.ring(b)[i], a_ring[4 + i]) << i;
  EXPECT_EQ(std::count(a_ring.begin(), a_ring.end(), kv.ring(b)[3]), 0);
  EXPECT_EQ(kv.ring_cached(), 4u);  // 4, 5, 6 are used again
  const std::vector<int32_t> b_ring = run_ring(kv, b, b_tokens, keys_b, 32, 50, 4);
  kv.free(a);
  kv.free(b);
  EXPECT_EQ(kv.ring_used(), 0u);
  EXPECT_EQ(kv.ring_free() + kv.ring_cached(), 16u);
  EXPECT_TRUE(kv.consistent());
}

// An evicted ring block ends every match whose window holds it: the hit falls back to a shorter
// end whose window is whole, or to nothing.
TEST(KvCacheManagerRings, AnEvictedWindowBlockShortensTheHit) {
  constexpr uint32_t kB = 4, kW = 10;
  KvCacheManager kv(64, kB, 0, true, xxh3_block_hash);
  kv.set_rings(12, kW, 0, 4);
  const std::vector<int32_t> t = tokens(40);
  PrefixKeys keys;
  KvSeq a;
  run_ring(kv, a, t, keys, 0, 40, 4);
  kv.free(a);  // LRU: ring blocks 0..5 as they left the window, then 9, 8, 7, 6
  EXPECT_EQ(kv.ring_cached(), 10u);
  PrefixKeys k1;
  EXPECT_EQ(kv.match_prefix(t, k1).blocks(), 9u);  // 39 positions cached of 40
  // Another prompt takes 4 ring blocks: 2 free, then ring blocks 0 and 1 are evicted.
  const std::vector<int32_t> other = tokens(16, 500);
  PrefixKeys keys_c;
  KvSeq c;
  ASSERT_TRUE(kv.allocate_slots(c, 16));
  EXPECT_EQ(kv.ring_cached(), 8u);
  PrefixKeys k2, k3;
  EXPECT_EQ(kv.match_prefix(t, k2).blocks(), 9u);  // the window of end 9 is 6..8
  // A prompt sharing 10 tokens: full blocks 0, 1 match, but end 2's window (block 0) is gone
  // and end 1's too.
  std::vector<int32_t> short_shared = t;
  std::iota(short_shared.begin() + 10, short_shared.end(), 2000);
  EXPECT_EQ(kv.match_prefix(short_shared, k3).blocks(), 0u);
  // Sharing 30 tokens: ends 7 (window 4..6) still matches.
  std::vector<int32_t> mid = t;
  std::iota(mid.begin() + 30, mid.end(), 3000);
  PrefixKeys k4;
  const PrefixHit hit = kv.match_prefix(mid, k4);
  EXPECT_EQ(hit.blocks(), 7u);
  EXPECT_EQ(hit.ring_blocks(), 3u);
  kv.free(c);
  EXPECT_TRUE(kv.consistent());
}

// A trim that drops published blocks drops their ring blocks' keys too (freed, not cached, when
// released); distrust drops the keys of the whole ring, the shared window included.
TEST(KvCacheManagerRings, TrimAndDistrustUnpublishTheRingToo) {
  KvCacheManager kv(64, 4, 0, true, xxh3_block_hash);
  kv.set_rings(16, 10, 4, 4);  // W = 10, margin 4
  const std::vector<int32_t> t = tokens(40);
  PrefixKeys keys;
  KvSeq a;
  run_ring(kv, a, t, keys, 0, 24, 4);  // 6 blocks published; ring block 0 left the window
  kv.trim(a, 21);                      // block 5 is no longer full
  PrefixKeys k1;
  EXPECT_EQ(kv.match_prefix(t, k1).blocks(), 5u);
  kv.free(a);
  EXPECT_EQ(kv.ring_cached(), 5u);  // ring blocks 0..4: block 5's lost its key with the full block's
  KvSeq b;
  PrefixKeys kb;
  const PrefixHit hit = kv.match_prefix(t, kb);
  ASSERT_EQ(hit.ring_blocks(), 3u);  // the window of end 5: ring blocks 2..4
  ASSERT_TRUE(kv.allocate_slots(b, 24, hit));
  kv.publish(b, t, 24, kb);
  kv.distrust(b);
  PrefixKeys k2;
  EXPECT_EQ(kv.match_prefix(t, k2).blocks(), 0u);
  kv.free(b);
  EXPECT_EQ(kv.ring_cached(), 2u);  // ring blocks 0 and 1, which b did not hold
  EXPECT_EQ(kv.free(), 64u);
  EXPECT_TRUE(kv.consistent());
}

// Many sequences over three prompts sharing prefixes start from prefix hits, grow by chunks,
// publish, are trimmed back within the margin and are freed (finish, cancel, preempt) at random,
// on pools small enough to evict; against a model of the pools: each block id's content (the
// prompt and logical block it was written for), so every hit's shared blocks, full and ring,
// hold the new sequence's own prefix; used counts the ids some sequence holds; every block of
// both pools comes back.
TEST(KvCacheManagerRings, RandomizedPrefixHitsShareOnlyTheirOwnContentAndEveryBlockComesBack) {
  constexpr uint32_t kB = 4, kW = 11, kMargin = 3, kStep = 6, kFull = 96, kRing = 40;
  KvCacheManager kv(kFull, kB, 1, true, xxh3_block_hash);
  kv.set_rings(kRing, kW, kMargin, kStep);
  std::mt19937 rng(23);
  std::vector<std::vector<int32_t>> prompts(3, tokens(160));
  std::iota(prompts[1].begin() + 60, prompts[1].end(), 5000);  // shares 60 tokens with 0
  std::iota(prompts[2].begin() + 100, prompts[2].end(), 9000);
  auto same_until = [&](size_t x, size_t y, size_t n) {
    return std::equal(prompts[x].begin(), prompts[x].begin() + n, prompts[y].begin());
  };
  struct Content {
    size_t prompt = 0;
    uint32_t block = 0;
  };
  std::vector<Content> full_content(kFull), ring_content(kRing);
  struct Model {
    KvSeq seq;
    PrefixKeys keys;
    size_t prompt = 0;
    uint32_t len = 0, start = 0, released_for = 0;  // start: the prefix it began with
  };
  std::vector<Model> seqs(6);
  uint32_t hits = 0, ring_hits = 0;
  auto record = [&](Model& m, uint32_t from_block) {
    for (uint32_t b = from_block; b < m.seq.blocks(); ++b) full_content[kv.blocks(m.seq)[b]] = {m.prompt, b};
    const std::span<const int32_t> ring = kv.ring(m.seq);
    for (uint32_t b = std::max(from_block, m.seq.ring_first()); b < m.seq.ring_first() + ring.size(); ++b)
      ring_content[ring[b - m.seq.ring_first()]] = {m.prompt, b};
  };
  for (int step = 0; step < 20000; ++step) {
    Model& m = seqs[rng() % seqs.size()];
    const uint32_t op = rng() % 10;
    if (m.seq.empty()) {  // a placement: the longest cached prefix, then its first chunk
      m.prompt = rng() % prompts.size();
      m.keys = {};
      const std::vector<int32_t>& t = prompts[m.prompt];
      const PrefixHit hit = kv.match_prefix(t, m.keys);
      const uint32_t e = hit.blocks(), n = std::min<uint32_t>(1 + rng() % kStep, 160 - e * kB);
      if (!kv.has_room(hit, e * kB + n, 0) || !kv.allocate_slots(m.seq, e * kB + n, hit)) continue;
      hits += e > 0;
      ring_hits += hit.ring_blocks() > 0;
      m.len = e * kB + n;
      m.start = m.released_for = e * kB;
      // The shared blocks hold this prompt's own prefix; the window reaches the first query's keys.
      for (uint32_t b = 0; b < e; ++b) {
        const Content f = full_content[kv.blocks(m.seq)[b]];
        ASSERT_TRUE(f.block == b && same_until(f.prompt, m.prompt, (b + 1) * kB)) << step;
      }
      ASSERT_LE(m.seq.ring_first() * kB, e * kB + 1 > kW ? e * kB + 1 - kW : 0);
      for (uint32_t b = m.seq.ring_first(); b < e; ++b) {
        const Content r = ring_content[kv.ring(m.seq)[b - m.seq.ring_first()]];
        ASSERT_TRUE(r.block == b && same_until(r.prompt, m.prompt, (b + 1) * kB)) << step;
      }
      record(m, e);
      kv.publish(m.seq, t, m.len, m.keys);
    } else if (op < 6) {  // a step computing positions len .. len + n - 1
      const uint32_t n = 1 + rng() % kStep;
      if (m.len + n > prompts[m.prompt].size()) continue;
      kv.release_window(m.seq, m.len);
      m.released_for = std::max(m.released_for, m.len);
      const uint32_t had = m.seq.blocks();
      if (!kv.allocate_slots(m.seq, m.len + n)) continue;
      record(m, had > 0 ? had - 1 : 0);  // the last block is rewritten past its old end
      m.len += n;
      kv.publish(m.seq, prompts[m.prompt], m.len, m.keys);
      ASSERT_LE(m.seq.ring_first() * kB, m.len - n + 1 > kW ? m.len - n + 1 - kW : 0);
    } else if (op < 8) {  // a speculative trim, within the margin and never into its prefix
      const uint32_t floor = std::max(m.start, m.released_for > kMargin ? m.released_for - kMargin : 0);
      if (m.len > floor + 1) kv.trim(m.seq, m.len = floor + 1 + rng() % (m.len - floor - 1));
    } else {  // finish, cancel or preempt
      kv.free(m.seq);
      m = Model{};
    }
    std::vector<int32_t> full_ids, ring_ids;
    for (const Model& s : seqs) {
      full_ids.insert(full_ids.end(), kv.blocks(s.seq).begin(), kv.blocks(s.seq).end());
      full_ids.insert(full_ids.end(), kv.tail(s.seq).begin(), kv.tail(s.seq).end());
      ring_ids.insert(ring_ids.end(), kv.ring(s.seq).begin(), kv.ring(s.seq).end());
      ASSERT_LE(s.seq.ring_blocks(), kv.ring_need(s.len));
    }
    for (std::vector<int32_t>* ids : {&full_ids, &ring_ids}) {
      std::sort(ids->begin(), ids->end());
      ids->erase(std::unique(ids->begin(), ids->end()), ids->end());
    }
    ASSERT_EQ(kv.used(), full_ids.size());
    ASSERT_EQ(kv.ring_used(), ring_ids.size());
    ASSERT_TRUE(kv.consistent());
  }
  EXPECT_GT(hits, 200u);
  EXPECT_GT(ring_hits, 200u);
  EXPECT_GT(kv.evictions(), 0u);
  for (Model& m : seqs) kv.free(m.seq);
  EXPECT_EQ(kv.used(), 0u);
  EXPECT_EQ(kv.ring_used(), 0u);
  EXPECT_EQ(kv.free() + kv.cached(), kFull);
  EXPECT_EQ(kv.ring_free() + kv.ring_cached(), kRing);
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
