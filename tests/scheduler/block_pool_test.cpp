#include "scheduler/block_pool.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace tandem::scheduler {
namespace {

using Table = std::vector<int32_t>;

TEST(BlockPool, StartsFree) {
  BlockPool pool(8);
  EXPECT_EQ(pool.total(), 8u);
  EXPECT_EQ(pool.free(), 8u);
  EXPECT_EQ(pool.used(), 0u);
  EXPECT_TRUE(pool.consistent());
}

TEST(BlockPool, AllocateReleaseRef) {
  BlockPool pool(8);
  Table a;
  ASSERT_TRUE(pool.allocate(3, a));
  EXPECT_EQ(a, (Table{0, 1, 2}));
  EXPECT_EQ(pool.free(), 5u);
  EXPECT_EQ(pool.used(), 3u);

  // A second sequence shares a's first two blocks.
  Table b(a.begin(), a.begin() + 2);
  pool.ref(b);
  EXPECT_EQ(pool.used(), 3u);
  pool.release(a);  // 0 and 1 stay referenced by b; 2 is free again
  EXPECT_EQ(pool.free(), 6u);
  EXPECT_TRUE(pool.consistent());
  pool.release(b);
  EXPECT_EQ(pool.free(), 8u);
  EXPECT_TRUE(pool.consistent());
  EXPECT_EQ(pool.double_releases(), 0u);
  EXPECT_EQ(pool.bad_refs(), 0u);
}

TEST(BlockPool, AllocateZeroIsANoOp) {
  BlockPool pool(2);
  Table t;
  EXPECT_TRUE(pool.allocate(0, t));
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(pool.free(), 2u);
  BlockPool empty(0);
  EXPECT_TRUE(empty.allocate(0, t));
  EXPECT_FALSE(empty.allocate(1, t));
  EXPECT_TRUE(empty.consistent());
}

TEST(BlockPool, PrefersTheBlockAfterTheTablesLast) {
  BlockPool pool(8);
  Table a, b;
  ASSERT_TRUE(pool.allocate(1, a));  // {0}
  ASSERT_TRUE(pool.allocate(2, b));  // {1, 2}
  EXPECT_EQ(b, (Table{1, 2}));
  pool.release(a);  // 0 free, but 3 follows b
  ASSERT_TRUE(pool.allocate(1, b));
  EXPECT_EQ(b, (Table{1, 2, 3}));
  // The block after b's last (4) is free: the lowest free (0) is not taken.
  ASSERT_TRUE(pool.allocate(2, b));
  EXPECT_EQ(b, (Table{1, 2, 3, 4, 5}));
  EXPECT_TRUE(pool.consistent());
}

TEST(BlockPool, FallsBackToLowestFreeThenStaysContiguous) {
  BlockPool pool(10);
  Table a, b;
  ASSERT_TRUE(pool.allocate(3, a));  // {0, 1, 2}
  ASSERT_TRUE(pool.allocate(2, b));  // {3, 4}
  ASSERT_TRUE(pool.allocate(1, a));  // 3 is taken: lowest free is 5
  EXPECT_EQ(a, (Table{0, 1, 2, 5}));
  ASSERT_TRUE(pool.allocate(2, a));  // then 6, 7 right after
  EXPECT_EQ(a, (Table{0, 1, 2, 5, 6, 7}));

  pool.release(b);  // 3, 4 free
  Table c;
  ASSERT_TRUE(pool.allocate(3, c));  // lowest free 3, then 4; 5 is taken: lowest free 8
  EXPECT_EQ(c, (Table{3, 4, 8}));
  EXPECT_EQ(pool.free(), 1u);
  EXPECT_TRUE(pool.consistent());
}

TEST(BlockPool, TableEndingAtTheLastIdFallsBackToLowest) {
  BlockPool pool(4);
  Table a, b;
  ASSERT_TRUE(pool.allocate(2, a));  // {0, 1}
  ASSERT_TRUE(pool.allocate(2, b));  // {2, 3}: 3 is the pool's last id
  pool.release(a);
  ASSERT_TRUE(pool.allocate(1, b));
  EXPECT_EQ(b, (Table{2, 3, 0}));
  EXPECT_TRUE(pool.consistent());
}

TEST(BlockPool, FailureLeavesTableAndPoolUnchanged) {
  BlockPool pool(4);
  Table a;
  ASSERT_TRUE(pool.allocate(3, a));
  Table b = {7, 8};  // whatever the caller had
  EXPECT_FALSE(pool.allocate(2, b));
  EXPECT_EQ(b, (Table{7, 8}));
  EXPECT_EQ(pool.free(), 1u);
  EXPECT_FALSE(pool.allocate(2, a));
  EXPECT_EQ(a, (Table{0, 1, 2}));
  EXPECT_TRUE(pool.consistent());
  ASSERT_TRUE(pool.allocate(1, a));
  EXPECT_EQ(a, (Table{0, 1, 2, 3}));
  EXPECT_EQ(pool.free(), 0u);
  EXPECT_FALSE(pool.allocate(1, a));
  EXPECT_EQ(a.size(), 4u);
}

TEST(BlockPool, DoubleReleaseIsCaught) {
  BlockPool pool(4);
  Table a;
  ASSERT_TRUE(pool.allocate(2, a));
  pool.release(a);
  EXPECT_DEBUG_DEATH(pool.release(a), "release of a free or unknown block");
  Table unknown = {-1, 4};
  EXPECT_DEBUG_DEATH(pool.release(unknown), "release of a free or unknown block");
  EXPECT_DEBUG_DEATH(pool.ref(a), "ref of a free or unknown block");
#ifdef NDEBUG
  EXPECT_EQ(pool.double_releases(), 4u);
  EXPECT_EQ(pool.bad_refs(), 2u);
#endif
  EXPECT_EQ(pool.free(), 4u);
  EXPECT_TRUE(pool.consistent());
}

// Thousands of random allocate/ref/release operations against a plain model of the
// refcounts; the pool must agree after every one and end with nothing leaked.
// #18 item 1: a worker's claim of 2^24 blocks costs the scheduler state for the blocks it hands
// out, not for the claim; past the first kInitialBlocks ids the state grows and stays right.
TEST(BlockPool, StateFollowsTheIdsHandedOutNotTheTotal) {
  BlockPool pool(1u << 24);
  EXPECT_EQ(pool.total(), 1u << 24);
  EXPECT_EQ(pool.tracked(), BlockPool::kInitialBlocks);
  Table a, b;
  ASSERT_TRUE(pool.allocate(BlockPool::kInitialBlocks - 1, a));
  ASSERT_TRUE(pool.allocate(3, a));  // crosses the first tracked ids, contiguous
  EXPECT_EQ(a.back(), static_cast<int32_t>(BlockPool::kInitialBlocks + 1));
  EXPECT_EQ(pool.tracked(), 2 * BlockPool::kInitialBlocks);
  ASSERT_TRUE(pool.allocate(2, b));
  EXPECT_EQ(b, (Table{static_cast<int32_t>(BlockPool::kInitialBlocks + 2),
                      static_cast<int32_t>(BlockPool::kInitialBlocks + 3)}));
  std::vector<int32_t> tokens(16 * a.size(), 7);
  EXPECT_TRUE(pool.publish(a, 0, 11, tokens));
  EXPECT_EQ(pool.free(), (1u << 24) - BlockPool::kInitialBlocks - 4);
  EXPECT_TRUE(pool.consistent());
  pool.release(a);
  pool.release(b);
  EXPECT_EQ(pool.cached(), 1u);
  EXPECT_EQ(pool.free() + pool.cached(), pool.total());
  EXPECT_TRUE(pool.consistent());
  Table c;
  ASSERT_TRUE(pool.allocate(1, c));
  EXPECT_EQ(c, (Table{1})) << "the lowest free id";
  EXPECT_TRUE(pool.consistent());
}

TEST(BlockPool, RandomizedAgainstModel) {
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    std::mt19937 rng(seed);
    const uint32_t n_blocks = 64;
    BlockPool pool(n_blocks);
    std::vector<uint32_t> model(n_blocks, 0);
    std::vector<Table> tables;
    auto model_free = [&] {
      uint32_t n = 0;
      for (uint32_t r : model) n += r == 0;
      return n;
    };
    auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };

    for (int op = 0; op < 5000; ++op) {
      const int kind = static_cast<int>(pick(10));
      if (kind < 5 || tables.empty()) {  // allocate, to a new or an existing table
        const uint32_t n = static_cast<uint32_t>(pick(6));
        Table* t;
        if (tables.empty() || pick(2) == 0) {
          tables.emplace_back();
          t = &tables.back();
        } else {
          t = &tables[pick(tables.size())];
        }
        const Table before = *t;
        const bool fits = n <= model_free();
        const bool ok = pool.allocate(n, *t);
        ASSERT_EQ(ok, fits) << "op " << op;
        if (ok) {
          ASSERT_EQ(t->size(), before.size() + n);
          for (size_t i = before.size(); i < t->size(); ++i) {
            const int32_t id = (*t)[i];
            ASSERT_TRUE(id >= 0 && static_cast<uint32_t>(id) < n_blocks);
            ASSERT_EQ(model[id], 0u) << "block " << id << " handed out twice";
            // The policy: the block after the table's last when free, else the lowest free.
            int32_t want = -1;
            if (i > 0 && (*t)[i - 1] + 1 < static_cast<int32_t>(n_blocks) && model[(*t)[i - 1] + 1] == 0) {
              want = (*t)[i - 1] + 1;
            } else {
              for (uint32_t b = 0; b < n_blocks && want < 0; ++b) {
                if (model[b] == 0) want = static_cast<int32_t>(b);
              }
            }
            ASSERT_EQ(id, want) << "op " << op;
            model[id] = 1;
          }
        } else {
          ASSERT_EQ(*t, before);
        }
      } else if (kind < 7) {  // share a prefix of a table (prefix caching)
        const Table& src = tables[pick(tables.size())];
        Table shared(src.begin(), src.begin() + static_cast<std::ptrdiff_t>(pick(src.size() + 1)));
        pool.ref(shared);
        for (int32_t id : shared) ++model[id];
        tables.push_back(std::move(shared));
      } else {  // a sequence ends
        const size_t i = pick(tables.size());
        pool.release(tables[i]);
        for (int32_t id : tables[i]) --model[id];
        tables.erase(tables.begin() + static_cast<std::ptrdiff_t>(i));
      }
      ASSERT_TRUE(pool.consistent()) << "op " << op;
      ASSERT_EQ(pool.free(), model_free()) << "op " << op;
      ASSERT_EQ(pool.used() + pool.free(), n_blocks);
    }
    for (const Table& t : tables) pool.release(t);
    EXPECT_EQ(pool.free(), n_blocks);
    EXPECT_TRUE(pool.consistent());
    EXPECT_EQ(pool.double_releases(), 0u);
    EXPECT_EQ(pool.bad_refs(), 0u);
  }
}

// ---- Prefix cache.

constexpr uint32_t kBt = 4;  // tokens per block in these tests

std::vector<int32_t> seq_tokens(std::initializer_list<int32_t> blocks) {  // block b: b*10 .. b*10+3
  std::vector<int32_t> t;
  for (int32_t b : blocks)
    for (int32_t i = 0; i < static_cast<int32_t>(kBt); ++i) t.push_back(b * 10 + i);
  return t;
}

// A sequence allocated, fully published, and released (its blocks now cached).
Table cache_sequence(BlockPool& pool, const std::vector<int32_t>& tokens, BlockHash hash = xxh3_block_hash) {
  std::vector<uint64_t> keys;
  chain_keys(tokens, kBt, hash, keys);
  Table t;
  EXPECT_TRUE(pool.allocate(static_cast<uint32_t>(keys.size()), t));
  for (uint32_t i = 0; i < keys.size(); ++i) pool.publish(t, i, keys[i], tokens);
  pool.release(t);
  return t;
}

uint32_t match_len(const BlockPool& pool, const std::vector<int32_t>& tokens, BlockHash hash = xxh3_block_hash) {
  std::vector<uint64_t> keys;
  chain_keys(tokens, kBt, hash, keys);
  Table out;
  return pool.match(tokens, keys, out);
}

TEST(PrefixCache, ReleasedBlocksStayCachedAndTheLongestPrefixMatches) {
  BlockPool pool(16, kBt);
  const Table a = cache_sequence(pool, seq_tokens({1, 2, 3}));
  EXPECT_EQ(pool.cached(), 3u);
  EXPECT_EQ(pool.free(), 13u);
  EXPECT_EQ(pool.used(), 0u);
  EXPECT_EQ(pool.available(), 16u);
  EXPECT_EQ(match_len(pool, seq_tokens({1, 2, 3, 4})), 3u);
  EXPECT_EQ(match_len(pool, seq_tokens({1, 2, 9})), 2u);
  EXPECT_EQ(match_len(pool, seq_tokens({2, 3})), 0u) << "a block is only shared after the same parents";
  std::vector<int32_t> partial = seq_tokens({1});
  partial.push_back(20);  // an incomplete second block is never matched
  EXPECT_EQ(match_len(pool, partial), 1u);
  // Sharing revives cached blocks; releasing returns them to the cache.
  std::vector<uint64_t> keys;
  const auto t = seq_tokens({1, 2});
  chain_keys(t, kBt, xxh3_block_hash, keys);
  Table shared;
  ASSERT_EQ(pool.match(t, keys, shared), 2u);
  EXPECT_EQ(shared, Table(a.begin(), a.begin() + 2));
  pool.ref(shared);
  EXPECT_EQ(pool.used(), 2u);
  EXPECT_EQ(pool.cached(), 1u);
  pool.release(shared);
  EXPECT_EQ(pool.cached(), 3u);
  EXPECT_TRUE(pool.consistent());
}

TEST(PrefixCache, EvictsOnlyWhenFreeBlocksRunOutLeavesFirst) {
  BlockPool pool(4, kBt);
  cache_sequence(pool, seq_tokens({1, 2, 3}));
  Table t;
  ASSERT_TRUE(pool.allocate(1, t));  // the free block: no eviction
  EXPECT_EQ(pool.evictions(), 0u);
  EXPECT_EQ(match_len(pool, seq_tokens({1, 2, 3})), 3u);
  ASSERT_TRUE(pool.allocate(1, t));  // evicts the leaf, block 3
  EXPECT_EQ(pool.evictions(), 1u);
  EXPECT_EQ(match_len(pool, seq_tokens({1, 2, 3})), 2u);
  ASSERT_TRUE(pool.allocate(1, t));
  EXPECT_EQ(match_len(pool, seq_tokens({1, 2, 3})), 1u);
  EXPECT_FALSE(pool.allocate(2, t)) << "one block is left";
  ASSERT_TRUE(pool.allocate(1, t));
  EXPECT_EQ(match_len(pool, seq_tokens({1})), 0u);
  EXPECT_EQ(pool.used(), 4u);
  EXPECT_TRUE(pool.consistent());
}

// Keys that ignore the parent: block Y after X and Y after W collide.
uint64_t parentless_hash(uint64_t, std::span<const int32_t> block) { return xxh3_block_hash(0, block); }
// Every key collides.
uint64_t constant_hash(uint64_t, std::span<const int32_t>) { return 42; }

// With parent-blind keys, a child of an evicted parent must not follow the parent's block
// id into its new content.
TEST(PrefixCache, AChildDoesNotFollowItsEvictedParentsBlockIntoNewContent) {
  BlockPool pool(3, kBt);
  const Table a = cache_sequence(pool, seq_tokens({1, 2}), parentless_hash);  // X in a[0], Y in a[1]
  Table y{a[1]};
  pool.ref(y);
  pool.release(y);  // Y is now the most recent: X goes first
  Table t;
  ASSERT_TRUE(pool.allocate(2, t));  // the free block, then X evicted
  ASSERT_EQ(t[1], a[0]);
  EXPECT_EQ(pool.evictions(), 1u);
  const auto w = seq_tokens({3});
  std::vector<uint64_t> keys;
  chain_keys(w, kBt, parentless_hash, keys);
  ASSERT_TRUE(pool.publish(Table{a[0]}, 0, keys[0], w));  // W now lives in X's old block
  pool.release(t);
  EXPECT_EQ(match_len(pool, seq_tokens({3, 2}), parentless_hash), 1u)
      << "Y was computed after X, not after W, although its parent block id is the same";
  EXPECT_TRUE(pool.consistent());
}

TEST(PrefixCache, ForcedHashCollisionsNeverShareAWrongBlock) {
  {
    BlockPool pool(16, kBt);
    cache_sequence(pool, seq_tokens({1, 2}), parentless_hash);  // X=1, Y=2
    cache_sequence(pool, seq_tokens({3, 2}), parentless_hash);  // W=3, then Y's key is taken
    EXPECT_EQ(match_len(pool, seq_tokens({1, 2}), parentless_hash), 2u);
    EXPECT_EQ(match_len(pool, seq_tokens({3, 2}), parentless_hash), 1u)
        << "Y after W must not reuse Y after X (same key and tokens, other parent)";
    EXPECT_TRUE(pool.consistent());
  }
  {
    BlockPool pool(16, kBt);
    cache_sequence(pool, seq_tokens({1, 2}), constant_hash);
    EXPECT_EQ(match_len(pool, seq_tokens({1, 2}), constant_hash), 1u) << "only the first block got the key";
    EXPECT_EQ(match_len(pool, seq_tokens({7, 2}), constant_hash), 0u) << "same key, other tokens";
    EXPECT_TRUE(pool.consistent());
  }
}

TEST(PrefixCache, ManyPrefixesInASmallPoolNeverLeakOrShareWrongly) {
  for (uint32_t seed = 0; seed < 30; ++seed) {
    std::mt19937 rng(seed);
    const uint32_t n_blocks = 8 + rng() % 24;
    const BlockHash hash = seed % 3 == 0 ? constant_hash : seed % 3 == 1 ? parentless_hash : xxh3_block_hash;
    BlockPool pool(n_blocks, kBt);
    // What each block really holds: the whole token prefix up to its end, set when a
    // sequence writes it; a match must only return blocks holding exactly the prompt's prefix.
    std::vector<std::vector<int32_t>> holds(n_blocks);
    struct Live {
      Table table;
      std::vector<int32_t> tokens;
    };
    std::vector<Live> live;
    for (int op = 0; op < 2000; ++op) {
      if (rng() % 3 != 0 || live.empty()) {  // a new sequence: 1..5 blocks of 8 distinct prefixes
        std::vector<int32_t> tokens;
        const uint32_t len = 1 + rng() % 5, family = rng() % 8;
        for (uint32_t b = 0; b < len; ++b)
          for (uint32_t i = 0; i < kBt; ++i)
            tokens.push_back(static_cast<int32_t>(family * 100 + (b < 2 ? 0 : rng() % 3) * 10 + i));
        std::vector<uint64_t> keys;
        chain_keys(tokens, kBt, hash, keys);
        Table hit;
        pool.match(tokens, keys, hit);
        for (size_t i = 0; i < hit.size(); ++i)
          ASSERT_EQ(holds[hit[i]], std::vector<int32_t>(tokens.begin(), tokens.begin() + (i + 1) * kBt))
              << "wrong reuse, seed " << seed << " op " << op;
        uint32_t hit_cached = 0;
        for (int32_t b : hit) hit_cached += pool.cached_block(b);
        if (pool.available() < len - hit.size() + hit_cached) continue;
        Live s{hit, tokens};
        pool.ref(s.table);
        ASSERT_TRUE(pool.allocate(len - static_cast<uint32_t>(hit.size()), s.table));
        for (size_t i = hit.size(); i < len; ++i) {
          holds[s.table[i]].assign(tokens.begin(), tokens.begin() + (i + 1) * kBt);
          pool.publish(s.table, static_cast<uint32_t>(i), keys[i], tokens);
        }
        live.push_back(std::move(s));
      } else {
        const size_t i = rng() % live.size();
        pool.release(live[i].table);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
      ASSERT_TRUE(pool.consistent()) << "seed " << seed << " op " << op;
      ASSERT_EQ(pool.free() + pool.cached() + pool.used(), n_blocks);
    }
    for (const Live& s : live) pool.release(s.table);
    EXPECT_EQ(pool.used(), 0u);
    EXPECT_EQ(pool.free() + pool.cached(), n_blocks);
    EXPECT_EQ(pool.double_releases() + pool.bad_refs(), 0u);
  }
}

}  // namespace
}  // namespace tandem::scheduler
