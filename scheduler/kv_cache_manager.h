// One worker's KV cache as the scheduler accounts it: the block pool (block_pool.h), each
// sequence's block table and F32 tail blocks, the headroom rule for new sequences, and the
// prefix cache (chained keys, matching, publishing). The only code that touches block ids:
// the planner asks for slots and gets yes or no (vLLM v1's KVCacheManager.allocate_slots
// returns None and the scheduler preempts), and reads a sequence's ids only to send them.
// Pure: no sockets, no clocks.
//
// Room left for other layer kinds (not built; the interface does not change for them):
// - Recurrent layers (Mamba/RWKV-style state, the hybrid-cache issue): a KvSeq will also hold
//   one fixed-size state slot per recurrent layer group, taken by its first allocate_slots and
//   returned by free, like the tail blocks today; match_prefix then only matches at positions
//   where a state checkpoint was published.
// Windowed layers (sliding-window attention, #23; docs/WINDOWS.md "Rings"): set_rings() gives
// them a second pool of their own block ids (the ring pool). A KvSeq then holds two tables: the
// full layers' blocks (every logical block 0..n) and the ring, the windowed layers' blocks of
// logical blocks ring_first..n only. release_window() frees the ring's leading blocks once the
// window (plus the trim margin) has passed them, so a sequence's ring stops growing at the
// window. With the prefix cache, publishing full block i also publishes the ring block of
// logical block i (its key names the full block's id and generation); released, it is cached
// like a full block, and a prefix end matches only while its window's ring blocks are all
// still cached (match_prefix).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "scheduler/block_pool.h"

namespace tandem::scheduler {

class KvCacheManager;

// A request's chained prefix keys (chain_keys), kept across its placements: extended, never
// recomputed, while the workers it meets have the same block size.
class PrefixKeys {
 private:
  friend class KvCacheManager;
  std::vector<uint64_t> keys_;
  uint32_t block_tokens_ = 0;
};

// The cached blocks holding a prompt's longest known prefix on one worker (match_prefix).
// With rings, also the ring blocks of the window that ends at the hit (logical blocks
// ring_first_ .. blocks() - 1).
class PrefixHit {
 public:
  uint32_t blocks() const { return static_cast<uint32_t>(blocks_.size()); }
  bool empty() const { return blocks_.empty(); }
  uint32_t ring_blocks() const { return static_cast<uint32_t>(ring_.size()); }
  int32_t checkpoint() const { return checkpoint_; }  // a hybrid's: the state checkpoint at its end

 private:
  friend class KvCacheManager;
  std::vector<int32_t> blocks_;
  std::vector<int32_t> ring_;
  uint32_t ring_first_ = 0;
  int32_t checkpoint_ = -1;
};

// One sequence's KV on one worker: its block table, its tail blocks and what of it was sent
// to the worker and published to the prefix cache. Opaque: only KvCacheManager changes it.
class KvSeq {
 public:
  bool empty() const { return blocks_.empty() && tail_.empty() && ring_.empty(); }  // holds no block
  uint32_t blocks() const { return static_cast<uint32_t>(blocks_.size()); }
  uint32_t ring_blocks() const { return static_cast<uint32_t>(ring_.size()); }
  // Logical index of the ring's first held block; the ring covers ring_first() .. blocks() - 1, or
  // fewer (at most the ring cap) right after a whole prompt's placement (ring_end).
  uint32_t ring_first() const { return ring_first_; }

 private:
  friend class KvCacheManager;
  std::vector<int32_t> blocks_;
  std::vector<int32_t> tail_;     // the worker's tail_blocks for this sequence (F32 window)
  size_t blocks_sent_ = 0;        // leading blocks the worker has been told about
  size_t worker_blocks_ = 0;      // its block table's length on the worker (trim cuts it later: take_cut)
  bool started_ = false;          // took its prefix and tail blocks (the first allocate_slots)
  uint32_t published_ = 0;        // leading blocks offered to the prefix cache
  bool publish_stopped_ = false;  // a block's key was taken by another copy, or its KV failed
  std::vector<int32_t> ring_;     // windowed layers' blocks of logical blocks ring_first_ ..
  uint32_t ring_first_ = 0;
  int32_t restore_ = -1;        // a hybrid's: the checkpoint its first plan restores (pinned until then)
  bool distrusted_ = false;     // a failed step: its state is saved in no checkpoint
  std::vector<int32_t> saved_;  // the checkpoints its plans saved into (distrust drops them)
};

class KvCacheManager {
 public:
  // `tail_blocks`: blocks each sequence takes besides its positions' (WorkerInfo::tail_blocks).
  // `prefix_cache` off: match_prefix finds nothing and publish offers nothing.
  KvCacheManager(uint32_t n_blocks, uint32_t block_tokens, uint32_t tail_blocks, bool prefix_cache, BlockHash hash);

  // Windowed layers keep their own pool of `ring_blocks` blocks (ids 0..ring_blocks-1) and each
  // sequence only the blocks its window needs: `window` (W, a query at p sees p-W+1..p),
  // `margin` positions more (the most a round's trim may cut back: no trim needs a released
  // block), and `step_tokens`, the most positions one step computes for a sequence (a prefill
  // chunk's first query still sees W-1 keys before it). Call once, before any sequence
  // starts; 0 blocks or a 0 window leave rings off.
  void set_rings(uint32_t ring_blocks, uint32_t window, uint32_t margin, uint32_t step_tokens);
  bool rings() const { return window_ > 0; }
  uint32_t ring_total() const { return ring_pool_.total(); }
  uint32_t ring_free() const { return ring_pool_.free(); }
  uint32_t ring_cached() const { return ring_pool_.cached(); }
  uint32_t ring_used() const { return ring_pool_.used(); }
  // The ring blocks a sequence of `positions` positions holds at most (0 without rings).
  uint32_t ring_need(uint32_t positions) const { return rings() ? std::min(blocks_for(positions), ring_cap_) : 0; }

  uint32_t block_tokens() const { return block_tokens_; }
  uint32_t total() const { return pool_.total(); }
  uint32_t free() const { return pool_.free(); }
  uint32_t cached() const { return pool_.cached(); }
  uint32_t used() const { return pool_.used(); }
  uint64_t evictions() const { return pool_.evictions(); }
  uint32_t available() const { return pool_.available(); }  // free + cached (evictable)
  double load() const { return double(pool_.used()) / double(pool_.total()); }
  // Tokens the whole pool holds (the admission check's figure; tail blocks not counted).
  uint64_t capacity_tokens() const { return uint64_t{pool_.total()} * block_tokens_; }
  // A sequence of `positions` positions fits this worker when it has the pool to itself.
  bool can_ever_fit(uint32_t positions) const;

  // The blocks holding the longest cached prefix of `tokens`, leaving at least one position to
  // compute (its logits give the next token). Extends `keys` as needed. Refs nothing. With
  // rings, the longest such prefix whose window's ring blocks (window_first .. end) are all
  // still cached, and those ring blocks.
  PrefixHit match_prefix(std::span<const int32_t> tokens, PrefixKeys& keys) const;
  uint32_t hit_tokens(const PrefixHit& hit) const { return hit.blocks() * block_tokens_; }
  // The headroom rule: a new sequence of `positions` positions sharing `hit` may start here
  // when the pool has blocks for it plus its next token, the hit's cached blocks (they stop
  // being evictable), and a block for every fourth of the `running` sequences (they grow: no
  // placement that at once forces a preemption).
  bool has_room(const PrefixHit& hit, uint32_t positions, uint32_t running) const;

  // Makes `seq` hold slots for its first `positions` positions. Its first call starts it with
  // `prefix`'s blocks and, with rings, its window's ring blocks (shared), and takes its tail
  // blocks too. False when the pool cannot:
  // `seq` is then as it was (nothing taken, a fresh one holds nothing).
  [[nodiscard]] bool allocate_slots(KvSeq& seq, uint32_t positions, const PrefixHit& prefix = {}) {
    if (seq.started_ && seq.blocks_.size() >= blocks_for(positions) &&
        seq.ring_first_ + seq.ring_.size() >= ring_end(seq, positions))
      return true;  // every decode but one a block
    return allocate_more(seq, positions, prefix);
  }
  // Rings, for a sequence that holds nothing yet and whose queries start at `first_query` (a
  // handoff's receiver: the positions before come with the transfer): its ring will start at
  // the window of that query, the block of position first_query - W + 1, and the next
  // allocate_slots takes it from there. Nothing without rings or for a sequence already started.
  void start_ring_at(KvSeq& seq, uint32_t first_query) const {
    if (!rings() || seq.started_ || !seq.empty()) return;
    seq.ring_first_ = first_query + 1 > window_ ? (first_query + 1 - window_) / block_tokens_ : 0;
  }
  // Rings: frees the ring's leading blocks whose every position is below
  // first_query - W + 1 - margin, where `first_query` is the lowest position the next step of
  // `seq` computes (its computed positions). Never frees a block the ring does not hold.
  void release_window(KvSeq& seq, uint32_t first_query);
  // Gives back every block of `seq` (shared ones lose a reference; published ones stay cached).
  void free(KvSeq& seq);
  // Keeps slots for `seq`'s first `positions` positions only and frees the blocks past them
  // (rejected draft tokens; `positions` is never inside the prefix it started with). A dropped block that was published
  // is unpublished first, so no rejected token stays findable in the prefix cache. Blocks not yet sent are just
  // forgotten; the worker is told to cut its table by the next take_cut.
  void trim(KvSeq& seq, uint32_t positions);

  // Offers `seq`'s full blocks among its first `known` positions (of `tokens`) to the prefix
  // cache, once each; stops for good at a block whose key another copy holds. With rings, each
  // with the ring block of the same logical block when the ring holds it: every prefix end the
  // cache can match at keeps its window, so a publishing sequence's ring blocks that leave the
  // window are cached (evictable, LRU, as full blocks), not freed.
  void publish(KvSeq& seq, std::span<const int32_t> tokens, uint32_t known, PrefixKeys& keys);
  // `seq`'s blocks hold KV that cannot be trusted (a failed step): unpublished, never again.
  void distrust(KvSeq& seq);

  // What goes to the worker: how many blocks its copy of the table keeps, when a trim freed
  // some it holds (0: no cut; call before take_unsent), then the blocks not sent before (marks
  // them sent), every block, the tail.
  uint32_t take_cut(KvSeq& seq) {
    if (seq.worker_blocks_ <= seq.blocks_sent_) return 0;
    seq.worker_blocks_ = seq.blocks_sent_;
    return static_cast<uint32_t>(seq.blocks_sent_);
  }
  std::span<const int32_t> take_unsent(KvSeq& seq) {
    const auto unsent = std::span<const int32_t>(seq.blocks_).subspan(seq.blocks_sent_);
    seq.blocks_sent_ = seq.worker_blocks_ = seq.blocks_.size();
    return unsent;
  }
  std::span<const int32_t> blocks(const KvSeq& seq) const { return seq.blocks_; }
  std::span<const int32_t> tail(const KvSeq& seq) const { return seq.tail_; }
  std::span<const int32_t> ring(const KvSeq& seq) const { return seq.ring_; }  // ring_first() ..
  // Every block of `seq` counts as sent (a KvExpect named them all).
  void mark_sent(KvSeq& seq) { seq.blocks_sent_ = seq.worker_blocks_ = seq.blocks_.size(); }

  bool consistent() const { return pool_.consistent() && ring_pool_.consistent(); }  // BlockPool::consistent

  // Hybrid models (docs/HYBRID.md "Prefix cache"): cached KV blocks alone cannot resume a
  // sequence, its recurrent state must come too. The worker keeps `n` state checkpoints; one
  // sits at a published block end every `interval` tokens (a multiple of the block size),
  // saved by the step that computed that position and attached to the block ending there. It
  // is free again once that block no longer holds its prefix (evicted, distrusted, unpublished:
  // checked when needed, nothing to hook), else the least recently used unpinned one is
  // reused. match_prefix then ends a hit only at a block end with its checkpoint. n = 0 turns
  // the prefix cache off. Call once, before any sequence starts.
  void set_checkpoints(uint32_t n, uint32_t interval);
  bool checkpointed() const { return interval_ > 0; }
  uint32_t checkpoints_total() const { return static_cast<uint32_t>(checkpoints_.size()); }
  uint32_t checkpoints_free() const;  // holding no findable prefix
  // A prompt chunk of `n` positions from `fed` for `seq`, cut to end at the last checkpoint
  // position inside it when a checkpoint would be saved there (its prefix is not checkpointed
  // yet and a checkpoint can be had), so that later prompts sharing it resume there.
  uint32_t checkpoint_chunk(const KvSeq& seq, std::span<const int32_t> tokens, uint32_t fed, uint32_t n,
                            PrefixKeys& keys) const;
  // Once `seq`'s plan computing its first `known` positions went out and publish() ran: the
  // checkpoint the worker saves the state in after that step, attached to the cached block
  // ending at `known` (`seq`'s own or another copy's, checked token by token); -1 when `known`
  // is no checkpoint position, no block holds that prefix, it has a checkpoint already, `seq`
  // was distrusted or every checkpoint is pinned.
  int32_t save_checkpoint(KvSeq& seq, std::span<const int32_t> tokens, uint32_t known, const PrefixKeys& keys);
  // The checkpoint `seq`'s first plan restores (-1: none); unpins it. Call when that plan goes out.
  int32_t take_restore(KvSeq& seq);

 private:
  uint32_t blocks_for(uint32_t positions) const { return (positions + block_tokens_ - 1) / block_tokens_; }
  bool allocate_more(KvSeq& seq, uint32_t positions, const PrefixHit& prefix);
  void extend_keys(std::span<const int32_t> tokens, PrefixKeys& keys) const;

  // Ring blocks up to ring_end(seq, positions); false: none taken.
  bool allocate_ring(KvSeq& seq, uint32_t positions);
  // The logical block the ring of `seq` reaches for `positions` positions (0 without rings):
  // their blocks, but at most ring cap blocks past ring_first, so that a whole prompt's
  // placement takes only the ring its first steps use (the window releases the rest as it goes).
  size_t ring_end(const KvSeq& seq, uint32_t positions) const {
    return rings() ? std::min<size_t>(blocks_for(positions), seq.ring_first_ + ring_cap_) : 0;
  }
  void release_ring_front(KvSeq& seq, uint32_t first);
  // The first logical block of the window a query at the end of `blocks` full blocks sees.
  uint32_t window_first(uint32_t blocks) const {
    const uint64_t end = uint64_t{blocks} * block_tokens_;
    return end + 1 > window_ ? static_cast<uint32_t>((end + 1 - window_) / block_tokens_) : 0;
  }
  // A ring block's key in the ring pool: the full block it was published with, by id and
  // generation (the full pool checks a prefix token by token; this ties the ring block to it).
  uint64_t ring_key(int32_t full_block) const {
    return uint64_t{pool_.generation(full_block)} << 32 | static_cast<uint32_t>(full_block);
  }
  void cut_hit_to_window(PrefixHit& hit) const;
  void publish_ring(KvSeq& seq, uint32_t index, std::span<const int32_t> tokens);
  // The ring blocks `seq` holds of logical blocks from .. to - 1 lose their keys (trim, distrust).
  void unpublish_ring(KvSeq& seq, uint32_t from, uint32_t to);

  // Hybrids: cuts `hit` back to its last block end that has a live checkpoint (none: empty).
  void match_checkpointed(PrefixHit& hit, const PrefixKeys& keys) const;
  struct Checkpoint {
    uint64_t key = 0;
    int32_t block = -1;  // the published block ending at its position; -1: never saved
    uint32_t gen = 0;    // the block's generation when saved (BlockPool::holds)
    uint32_t pins = 0;   // placed sequences whose first plan restores it (not sent yet)
    uint64_t used = 0;   // LRU clock
  };
  bool live(int32_t c) const;  // its block still holds its prefix, and it is that prefix's checkpoint
  int32_t checkpoint_victim() const;
  std::vector<Checkpoint> checkpoints_;
  std::unordered_map<uint64_t, int32_t> checkpoint_by_key_;
  uint32_t interval_ = 0;
  uint64_t checkpoint_clock_ = 0;

  BlockPool pool_;
  BlockPool ring_pool_{0};
  uint32_t window_ = 0, margin_ = 0, ring_cap_ = 0;
  uint32_t block_tokens_;
  uint32_t tail_blocks_;
  bool prefix_cache_;
  BlockHash hash_;
};

}  // namespace tandem::scheduler
