// KV block accounting for one worker: which block ids are free, how many sequences
// reference each used block, and which unreferenced blocks still hold a known prompt
// prefix (the prefix cache). The scheduler owns it; the worker only holds the bytes.
// Pure: no sockets, no clocks.
//
// Every block is in exactly one state: free; used (refcount > 0); or cached (refcount 0,
// holding the KV of a published full block, evictable). free + cached + used = total.
//
// Memory follows the ids handed out, not the declared total: per-block state covers the
// first kInitialBlocks ids and doubles when an id past it is allocated, so a registration
// that claims 2^24 blocks costs nothing until they are used (#18).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace tandem::scheduler {

class BlockPool {
 public:
  // `block_tokens`: tokens per block (the length of a published block's token run).
  explicit BlockPool(uint32_t n_blocks, uint32_t block_tokens = 16);

  // Per-block state is kept for this many ids at first (~2 MiB), then grown by doubling.
  static constexpr uint32_t kInitialBlocks = 1u << 16;

  uint32_t total() const { return total_; }
  uint32_t tracked() const { return static_cast<uint32_t>(refs_.size()); }  // ids with state; the rest are free
  uint32_t free() const { return n_free_; }
  uint32_t cached() const { return n_cached_; }
  uint32_t used() const { return total() - n_free_ - n_cached_; }
  // What allocate() can hand out: free blocks, then cached ones (evicted).
  uint32_t available() const { return n_free_ + n_cached_; }
  uint64_t evictions() const { return evictions_; }
  bool cached_block(int32_t id) const { return is_cached(id); }
  // Block `id` is published under `key` (used or cached) and has not been evicted or
  // unpublished since generation `gen` (generation()): what it held then is still findable.
  bool holds(int32_t id, uint64_t key, uint32_t gen) const {
    return id >= 0 && static_cast<uint32_t>(id) < tracked() && published_[id] && key_[id] == key && gen_[id] == gen;
  }

  // Appends `n` newly allocated blocks (refcount 1) to `table`. Prefers the id right after
  // the table's last block, then the lowest free ids, so tables stay contiguous where the
  // pool allows (attention reads contiguous blocks ~3x faster). Only when no free block is
  // left does it evict cached ones, least recently used first. Returns false and changes
  // nothing when fewer than `n` blocks are available.
  [[nodiscard]] bool allocate(uint32_t n, std::vector<int32_t>& table);
  // Adds a reference to each used or cached block (prefix sharing; a cached block becomes
  // used again). Referencing a free or unknown block is a caller bug: it asserts in debug
  // builds; release builds skip that id and count it in bad_refs().
  void ref(std::span<const int32_t> ids);
  // Drops one reference from each block; at 0 a published block becomes cached (most
  // recently used), any other block free. Releasing a free, cached or unknown block is a
  // caller bug (a double release): it asserts in debug builds; release builds skip that id
  // and count it in double_releases(). Release a table in order: its last block becomes
  // the least recently used of them, so leaves are evicted before their parents.
  void release(std::span<const int32_t> ids);

  // Prefix cache. A full block's key is chained from its parent's:
  // key_i = hash(key_{i-1}, tokens of block i) (key_{-1} = 0), see chain_keys().
  // publish(): used block `id` holds block `index` of a sequence whose blocks so far are
  // `table` (table[index] == id) and whose tokens are `tokens`: later prompts may share it.
  // False (nothing changes) when another block already holds that key: the first stays.
  bool publish(std::span<const int32_t> table, uint32_t index, uint64_t key, std::span<const int32_t> tokens);
  // Appends to `out` the blocks holding the longest prefix of `tokens`' full blocks
  // (keys from chain_keys), each checked token by token and parent by parent (a hash
  // collision never shares a wrong block). Returns how many it appended. Does not ref.
  uint32_t match(std::span<const int32_t> tokens, std::span<const uint64_t> keys, std::vector<int32_t>& out) const;
  // Drops the keys of these blocks (their KV is not trustworthy: a failed step).
  void unpublish(std::span<const int32_t> ids);
  // The used or cached block published under `key`, or -1 (no chain or token check: for keys
  // that already name one block's content, as a ring block's does, kv_cache_manager.h).
  int32_t find(uint64_t key) const {
    const auto it = by_key_.find(key);
    return it == by_key_.end() ? kNone : it->second;
  }
  // Bumped each time block `id` is evicted or unpublished: (id, generation) names one content.
  uint32_t generation(int32_t id) const { return id >= 0 && static_cast<uint32_t>(id) < tracked() ? gen_[id] : 0; }

  // Caller bugs survived in release builds (always 0 in a correct scheduler).
  uint32_t double_releases() const { return double_releases_; }
  uint32_t bad_refs() const { return bad_refs_; }

  // Every block in exactly one state, the counts match, the LRU list holds exactly the
  // cached blocks, every key maps to a published block. For tests and debug assertions. O(total).
  bool consistent() const;

 private:
  static constexpr int32_t kNone = -1;
  bool is_used(int32_t id) const { return id >= 0 && static_cast<uint32_t>(id) < tracked() && refs_[id] > 0; }
  bool is_cached(int32_t id) const {
    return id >= 0 && static_cast<uint32_t>(id) < tracked() && refs_[id] == 0 && published_[id];
  }
  bool is_free(uint32_t id) const { return id < total() && (id >= tracked() || (refs_[id] == 0 && !published_[id])); }
  void track(uint32_t id);  // grows the per-block state to cover `id` (doubling, up to total)
  // The lowest free id at or above `from`, or total() when none (ids past tracked() are free).
  uint32_t next_free(uint32_t from) const;
  void lru_push_back(int32_t id);
  void lru_remove(int32_t id);
  void drop_key(int32_t id);  // unpublish one block (any state)

  uint32_t block_tokens_;
  uint32_t total_;
  std::vector<uint32_t> refs_;
  std::vector<uint8_t> published_;  // holds a key (used or cached)
  // Per published block: its key, its parent block and the parent's generation when
  // published (a parent evicted and reused since has a new generation), its tokens.
  std::vector<uint64_t> key_;
  std::vector<int32_t> parent_;
  std::vector<uint32_t> parent_gen_, gen_;
  std::vector<int32_t> tokens_;  // block_tokens per block
  std::unordered_map<uint64_t, int32_t> by_key_;
  std::vector<int32_t> prev_, next_;  // LRU list of cached blocks (head: least recent)
  int32_t lru_head_ = kNone, lru_tail_ = kNone;
  uint32_t n_free_ = 0, n_cached_ = 0;
  uint32_t lowest_free_ = 0;  // no free id below this
  uint64_t evictions_ = 0;
  uint32_t double_releases_ = 0;
  uint32_t bad_refs_ = 0;
};

// Chained keys of the full blocks of `tokens`: keys[i] identifies tokens [0, (i+1) * B).
// Extends `keys` (already holding the first keys.size() blocks' keys) to every full block.
// `hash` is xxh3_block_hash unless a test forces collisions.
using BlockHash = uint64_t (*)(uint64_t parent, std::span<const int32_t> block);
uint64_t xxh3_block_hash(uint64_t parent, std::span<const int32_t> block);
void chain_keys(std::span<const int32_t> tokens, uint32_t block_tokens, BlockHash hash, std::vector<uint64_t>& keys);

}  // namespace tandem::scheduler
