// A hybrid model's prefix cache in the per-worker KV cache manager (docs/HYBRID.md "Prefix
// cache"): a hit ends only at a block end with a live state checkpoint, a checkpoint is free again
// once its block stops holding its prefix, pinned ones are never reused, and every block and
// checkpoint comes back.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "scheduler/kv_cache_manager.h"

namespace tandem::scheduler {
namespace {

constexpr uint32_t kB = 4, kEvery = 8;  // 4-token blocks, a checkpoint every 2 blocks

std::vector<int32_t> prompt(uint32_t n, int32_t first = 3) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

KvCacheManager manager(uint32_t blocks, uint32_t checkpoints) {
  KvCacheManager kv(blocks, kB, 0, true, xxh3_block_hash);
  kv.set_checkpoints(checkpoints, kEvery);
  return kv;
}

// What the planner does for one prompt chunk ending at `known`: publish, then save.
int32_t compute(KvCacheManager& kv, KvSeq& seq, const std::vector<int32_t>& t, uint32_t known, PrefixKeys& keys) {
  EXPECT_TRUE(kv.allocate_slots(seq, known));
  kv.publish(seq, t, known, keys);
  return kv.save_checkpoint(seq, t, known, keys);
}

TEST(KvCheckpoints, AHitEndsOnlyAtACheckpointedBlockEnd) {
  KvCacheManager kv = manager(32, 4);
  const std::vector<int32_t> t = prompt(21);
  PrefixKeys keys;
  KvSeq a;
  EXPECT_EQ(compute(kv, a, t, 4, keys), -1);  // a block end, not a checkpoint position
  const int32_t c = compute(kv, a, t, 8, keys);
  ASSERT_GE(c, 0);
  EXPECT_EQ(compute(kv, a, t, 12, keys), -1);
  ASSERT_TRUE(kv.allocate_slots(a, 16));
  kv.publish(a, t, 16, keys);  // published, but no checkpoint saved at 16
  EXPECT_EQ(kv.checkpoints_free(), 3u);
  PrefixKeys other;
  const PrefixHit hit = kv.match_prefix(t, other);
  EXPECT_EQ(kv.hit_tokens(hit), 8u);  // 16 tokens of blocks are cached; the state only at 8
  EXPECT_EQ(hit.checkpoint(), c);
  // The same prefix again: no second checkpoint, and no chunk cut for it.
  KvSeq b;
  ASSERT_TRUE(kv.allocate_slots(b, 21, hit));
  EXPECT_EQ(kv.take_restore(b), c);
  EXPECT_EQ(kv.take_restore(b), -1);
  EXPECT_EQ(kv.checkpoint_chunk(b, t, 0, 13, other), 13u);
  EXPECT_EQ(kv.checkpoint_chunk(b, t, 8, 13, other), 8u);  // cut at 16: that prefix has none
  EXPECT_EQ(kv.checkpoint_chunk(b, t, 8, 7, other), 7u);   // no checkpoint position inside
  kv.free(a);
  kv.free(b);
  EXPECT_TRUE(kv.consistent());
}

TEST(KvCheckpoints, NoCheckpointsNoPrefixCache) {
  KvCacheManager kv = manager(32, 0);
  const std::vector<int32_t> t = prompt(21);
  PrefixKeys keys;
  KvSeq a;
  EXPECT_EQ(compute(kv, a, t, 16, keys), -1);
  EXPECT_TRUE(kv.match_prefix(t, keys).empty());
  EXPECT_EQ(kv.checkpoints_total(), 0u);
  kv.free(a);
}

TEST(KvCheckpoints, EvictingOrDistrustingItsBlockFreesTheCheckpoint) {
  KvCacheManager kv = manager(4, 2);
  const std::vector<int32_t> t = prompt(9);
  PrefixKeys keys;
  KvSeq a;
  ASSERT_GE(compute(kv, a, t, 8, keys), 0);
  kv.free(a);  // its blocks stay cached, the checkpoint with them
  EXPECT_EQ(kv.checkpoints_free(), 1u);
  EXPECT_EQ(kv.hit_tokens(kv.match_prefix(t, keys)), 8u);
  KvSeq hog;
  ASSERT_TRUE(kv.allocate_slots(hog, 16));  // every block: the cached ones are evicted
  EXPECT_EQ(kv.checkpoints_free(), 2u);
  EXPECT_TRUE(kv.match_prefix(t, keys).empty());
  kv.free(hog);
  KvSeq b;
  ASSERT_GE(compute(kv, b, t, 8, keys), 0);
  kv.distrust(b);
  EXPECT_EQ(kv.checkpoints_free(), 2u);
  EXPECT_TRUE(kv.match_prefix(t, keys).empty());
  kv.free(b);
  // A checkpoint saved at another copy's block (its prefix was cached without one) goes with a
  // distrust of the sequence that saved it, though that block stays published.
  KvSeq c, d;
  PrefixKeys kc, kd;
  ASSERT_TRUE(kv.allocate_slots(c, 8));
  kv.publish(c, t, 8, kc);  // published, no checkpoint
  ASSERT_TRUE(kv.allocate_slots(d, 8));
  kv.publish(d, t, 8, kd);  // the key is c's: d publishes nothing
  ASSERT_GE(kv.save_checkpoint(d, t, 8, kd), 0);
  EXPECT_EQ(kv.hit_tokens(kv.match_prefix(t, keys)), 8u);
  kv.distrust(d);
  EXPECT_TRUE(kv.match_prefix(t, keys).empty());
  EXPECT_EQ(kv.checkpoints_free(), 2u);
  kv.free(c);
  kv.free(d);
  EXPECT_TRUE(kv.consistent());
}

TEST(KvCheckpoints, ThePoolReusesTheLeastRecentlyUsedButNeverAPinnedOne) {
  KvCacheManager kv = manager(64, 1);
  const std::vector<int32_t> p1 = prompt(9, 100), p2 = prompt(9, 200);
  PrefixKeys k1, k2, k3;
  KvSeq a, c;
  ASSERT_EQ(compute(kv, a, p1, 8, k1), 0);
  const PrefixHit hit = kv.match_prefix(p1, k3);
  ASSERT_EQ(hit.checkpoint(), 0);
  KvSeq b;
  ASSERT_TRUE(kv.allocate_slots(b, 9, hit));            // pinned until its first plan goes out
  EXPECT_EQ(kv.checkpoint_chunk(c, p2, 0, 9, k2), 9u);  // nothing to save into: no cut
  EXPECT_EQ(compute(kv, c, p2, 8, k2), -1);
  EXPECT_EQ(kv.take_restore(b), 0);
  kv.free(c);
  KvSeq d;
  PrefixKeys k4;
  ASSERT_EQ(compute(kv, d, p2, 8, k4), 0);  // the least recently used, now unpinned
  EXPECT_TRUE(kv.match_prefix(p1, k3).empty());
  PrefixKeys k5;
  EXPECT_EQ(kv.match_prefix(p2, k5).checkpoint(), 0);
  for (KvSeq* s : {&a, &b, &d}) kv.free(*s);
  EXPECT_TRUE(kv.consistent());
}

// Random prompts over a few shared prefixes, placed from their hits, computed chunk by chunk
// as the planner cuts them, freed, distrusted or left unplaced in any order: every hit ends at
// its checkpoint's block, and at the end every block and every checkpoint comes back.
TEST(KvCheckpoints, RandomizedEveryBlockAndCheckpointComesBack) {
  std::mt19937 rng(20);
  constexpr uint32_t kBlocks = 48, kCheckpoints = 5;
  KvCacheManager kv = manager(kBlocks, kCheckpoints);
  struct Live {
    KvSeq seq;
    std::vector<int32_t> tokens;
    PrefixKeys keys;
    uint32_t fed = 0;
  };
  std::vector<Live> live;
  std::vector<std::vector<int32_t>> bases;
  for (int i = 0; i < 4; ++i) bases.push_back(prompt(40, 1000 * (i + 1)));
  for (int round = 0; round < 4000; ++round) {
    const uint32_t op = rng() % 10;
    if (op < 3 && live.size() < 6) {
      Live l;
      l.tokens = bases[rng() % bases.size()];
      l.tokens.resize(9 + rng() % 31);
      l.tokens.push_back(static_cast<int32_t>(rng() % 50000));
      const PrefixHit hit = kv.match_prefix(l.tokens, l.keys);
      if (!hit.empty()) {
        ASSERT_EQ(kv.hit_tokens(hit) % kEvery, 0u);
        ASSERT_GE(hit.checkpoint(), 0);
      }
      if (!kv.allocate_slots(l.seq, static_cast<uint32_t>(l.tokens.size()), hit)) continue;
      l.fed = kv.hit_tokens(hit);
      if (rng() % 2) EXPECT_EQ(kv.take_restore(l.seq), hit.checkpoint());
      live.push_back(std::move(l));
    } else if (op < 8 && !live.empty()) {
      Live& l = live[rng() % live.size()];
      const auto left = static_cast<uint32_t>(l.tokens.size()) - l.fed;
      if (left == 0) continue;
      const uint32_t n = kv.checkpoint_chunk(l.seq, l.tokens, l.fed, 1 + rng() % left, l.keys);
      ASSERT_GE(n, 1u);
      l.fed += n;
      kv.publish(l.seq, l.tokens, l.fed, l.keys);
      const int32_t c = kv.save_checkpoint(l.seq, l.tokens, l.fed, l.keys);
      if (c >= 0) ASSERT_EQ(l.fed % kEvery, 0u);
    } else if (!live.empty()) {
      const size_t i = rng() % live.size();
      if (op == 9) kv.distrust(live[i].seq);
      kv.free(live[i].seq);
      live.erase(live.begin() + static_cast<ptrdiff_t>(i));
    }
    ASSERT_LE(kv.checkpoints_free(), kCheckpoints);
  }
  for (Live& l : live) kv.free(l.seq);
  EXPECT_TRUE(kv.consistent());
  EXPECT_EQ(kv.used(), 0u);
  // None is left pinned: five new prefixes each get one.
  for (int32_t i = 0; i < static_cast<int32_t>(kCheckpoints); ++i) {
    const std::vector<int32_t> t = prompt(9, 900000 + 100 * i);
    PrefixKeys keys;
    KvSeq s;
    EXPECT_GE(compute(kv, s, t, 8, keys), 0) << i;
    kv.free(s);
  }
  KvSeq hog;
  ASSERT_TRUE(kv.allocate_slots(hog, kBlocks * kB));  // evicts every cached block
  EXPECT_EQ(kv.checkpoints_free(), kCheckpoints);
  kv.free(hog);
  EXPECT_EQ(kv.free(), kBlocks);
  EXPECT_TRUE(kv.consistent());
}

}  // namespace
}  // namespace tandem::scheduler
