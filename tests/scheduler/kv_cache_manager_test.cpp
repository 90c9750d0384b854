// The per-worker KV cache manager: slots, the tail blocks, the headroom rule, prefix matching
// and publishing, trim and free, against the pool's own counts.
#include "scheduler/kv_cache_manager.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace tandem::scheduler
