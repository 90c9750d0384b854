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
  pool.release(a);                   // 0 free, but 3 follows b
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

}  // namespace
}  // namespace tandem::scheduler
