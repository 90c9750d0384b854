#include "scheduler/kv_cache_manager.h"

#include <algorithm>
#include <cassert>

namespace tandem::scheduler {

KvCacheManager::KvCacheManager(uint32_t n_blocks, uint32_t block_tokens, uint32_t tail_blocks, bool prefix_cache,
                               BlockHash hash)
    : pool_(n_blocks, block_tokens),
      block_tokens_(block_tokens),
      tail_blocks_(tail_blocks),
      prefix_cache_(prefix_cache),
      hash_(hash) {}

void KvCacheManager::set_rings(uint32_t ring_blocks, uint32_t window, uint32_t margin, uint32_t step_tokens) {
  if (ring_blocks == 0 || window == 0) return;
  ring_pool_ = BlockPool(ring_blocks, block_tokens_);
  window_ = window;
  margin_ = margin;
  // Held at once: the blocks that W - 1 + margin positions before a step's first query and the
  // step's own positions can touch (the first at a block's last slot).
  ring_cap_ = (window - 1 + margin + std::max(step_tokens, 1u) + 2 * block_tokens_ - 2) / block_tokens_;
}

bool KvCacheManager::can_ever_fit(uint32_t positions) const {
  return uint64_t{blocks_for(positions)} + tail_blocks_ <= pool_.total() && ring_need(positions) <= ring_pool_.total();
}

void KvCacheManager::extend_keys(std::span<const int32_t> tokens, PrefixKeys& keys) const {
  if (keys.block_tokens_ != block_tokens_) {
    keys.keys_.clear();
    keys.block_tokens_ = block_tokens_;
  }
  chain_keys(tokens, block_tokens_, hash_, keys.keys_);
}

PrefixHit KvCacheManager::match_prefix(std::span<const int32_t> tokens, PrefixKeys& keys) const {
  PrefixHit hit;
  if (!prefix_cache_ || tokens.empty()) return hit;
  extend_keys(tokens, keys);
  const size_t usable = std::min<size_t>(keys.keys_.size(), (tokens.size() - 1) / block_tokens_);
  pool_.match(tokens, std::span<const uint64_t>(keys.keys_).first(usable), hit.blocks_);
  if (rings()) cut_hit_to_window(hit);
  return hit;
}

void KvCacheManager::cut_hit_to_window(PrefixHit& hit) const {
  // The longest end e whose ring blocks window_first(e) .. e - 1 are all cached: `run` is where
  // the run of found ring blocks ending at block j begins.
  std::vector<int32_t> ring(hit.blocks());
  uint32_t run = 0, end = 0;
  for (uint32_t j = 0; j < hit.blocks(); ++j) {
    ring[j] = ring_pool_.find(ring_key(hit.blocks_[j]));
    if (ring[j] < 0)
      run = j + 1;
    else if (run <= window_first(j + 1))
      end = j + 1;
  }
  hit.blocks_.resize(end);
  hit.ring_first_ = end > 0 ? window_first(end) : 0;
  hit.ring_.assign(ring.begin() + hit.ring_first_, ring.begin() + end);
}

bool KvCacheManager::has_room(const PrefixHit& hit, uint32_t positions, uint32_t running) const {
  uint32_t hit_cached = 0, ring_cached = 0;  // shared blocks that stop being available
  for (int32_t b : hit.blocks_) hit_cached += pool_.cached_block(b);
  for (int32_t b : hit.ring_) ring_cached += ring_pool_.cached_block(b);
  const uint32_t headroom = (running + 3) / 4;
  const uint32_t fresh = blocks_for(positions + 1) - hit.blocks() + tail_blocks_;
  // The ring's first placement reaches ring_end: the window's shared blocks, then fresh ones.
  const uint32_t ring_fresh =
      rings() ? std::min(blocks_for(positions + 1), hit.ring_first_ + ring_cap_) - hit.ring_first_ - hit.ring_blocks()
              : 0;
  if (rings() && ring_pool_.available() < uint64_t{ring_fresh} + ring_cached + headroom) return false;
  return pool_.available() >= uint64_t{fresh} + hit_cached + headroom;
}

bool KvCacheManager::allocate_ring(KvSeq& seq, uint32_t positions) {
  if (!rings()) return true;
  const size_t end = seq.ring_first_ + seq.ring_.size(), want = ring_end(seq, positions);
  return want <= end || ring_pool_.allocate(static_cast<uint32_t>(want - end), seq.ring_);
}

void KvCacheManager::release_ring_front(KvSeq& seq, uint32_t first) {
  const uint32_t end = seq.ring_first_ + seq.ring_blocks();
  first = std::min(first, end);
  if (first <= seq.ring_first_) return;
  const auto gone = seq.ring_.begin() + (first - seq.ring_first_);
  ring_pool_.release(std::span<const int32_t>(seq.ring_.data(), gone - seq.ring_.begin()));
  seq.ring_.erase(seq.ring_.begin(), gone);  // a few ids: no allocation, no per-token cost
  seq.ring_first_ = first;
}

void KvCacheManager::release_window(KvSeq& seq, uint32_t first_query) {
  if (!rings() || first_query + 1 < window_ + margin_) return;
  // Every position of block b is below t = first_query - W + 1 - margin iff (b + 1) * B <= t.
  release_ring_front(seq, (first_query + 1 - window_ - margin_) / block_tokens_);
}

bool KvCacheManager::allocate_more(KvSeq& seq, uint32_t positions, const PrefixHit& prefix) {
  const uint32_t need = blocks_for(positions);
  if (seq.started_) {
    const uint32_t had = seq.blocks();
    if (!pool_.allocate(need - std::min(need, had), seq.blocks_)) return false;
    if (allocate_ring(seq, positions)) return true;
    pool_.release(std::span<const int32_t>(seq.blocks_).subspan(had));
    seq.blocks_.resize(had);
    return false;
  }
  seq.blocks_ = prefix.blocks_;
  pool_.ref(seq.blocks_);
  seq.ring_ = prefix.ring_;  // the window ending at the prefix (shared), then fresh ring blocks
  if (!prefix.empty()) seq.ring_first_ = prefix.ring_first_;  // else start_ring_at's start, or 0
  ring_pool_.ref(seq.ring_);
  if (!pool_.allocate(need - std::min(need, seq.blocks()), seq.blocks_) || !pool_.allocate(tail_blocks_, seq.tail_) ||
      !allocate_ring(seq, positions)) {
    free(seq);
    return false;
  }
  seq.published_ = prefix.blocks();
  seq.started_ = true;
  return true;
}

void KvCacheManager::free(KvSeq& seq) {
  pool_.release(seq.blocks_);
  pool_.release(seq.tail_);
  ring_pool_.release(seq.ring_);
  seq = KvSeq{};
}

void KvCacheManager::trim(KvSeq& seq, uint32_t positions) {
  const uint32_t keep = blocks_for(positions);
  const uint32_t full = positions / block_tokens_;
  if (seq.published_ > full) {
    unpublish_ring(seq, full, seq.published_);
    pool_.unpublish(std::span<const int32_t>(seq.blocks_).subspan(full, seq.published_ - full));
    seq.published_ = full;
  }
  if (seq.blocks() <= keep) return;
  pool_.release(std::span<const int32_t>(seq.blocks_).subspan(keep));
  seq.blocks_.resize(keep);
  // The margin keeps every block a trim returns to in the ring (release_window).
  assert(!rings() || seq.ring_first_ <= keep);
  const size_t ring_keep = keep - std::min(keep, seq.ring_first_);
  if (seq.ring_.size() > ring_keep) {
    ring_pool_.release(std::span<const int32_t>(seq.ring_).subspan(ring_keep));
    seq.ring_.resize(ring_keep);
  }
  seq.blocks_sent_ = std::min<size_t>(seq.blocks_sent_, keep);
}

void KvCacheManager::publish(KvSeq& seq, std::span<const int32_t> tokens, uint32_t known, PrefixKeys& keys) {
  if (!prefix_cache_ || seq.publish_stopped_) return;
  const uint32_t full = known / block_tokens_;
  if (full <= seq.published_) return;
  extend_keys(tokens.first(known), keys);
  for (; seq.published_ < full; ++seq.published_) {
    if (!pool_.publish(seq.blocks_, seq.published_, keys.keys_[seq.published_], tokens)) {
      seq.publish_stopped_ = true;
      return;
    }
    publish_ring(seq, seq.published_, tokens);
  }
}

void KvCacheManager::publish_ring(KvSeq& seq, uint32_t index, std::span<const int32_t> tokens) {
  if (!rings() || index < seq.ring_first_ || index >= seq.ring_first_ + seq.ring_blocks()) return;
  // Alone, without a parent: a window is matched from any of its blocks (cut_hit_to_window).
  const int32_t id = seq.ring_[index - seq.ring_first_];
  (void)ring_pool_.publish(std::span<const int32_t>(&id, 1), 0, ring_key(seq.blocks_[index]),
                           tokens.subspan(size_t{index} * block_tokens_, block_tokens_));
}

void KvCacheManager::unpublish_ring(KvSeq& seq, uint32_t from, uint32_t to) {
  from = std::max(from, seq.ring_first_);
  to = std::min(to, seq.ring_first_ + seq.ring_blocks());
  if (from < to) ring_pool_.unpublish(std::span<const int32_t>(seq.ring_).subspan(from - seq.ring_first_, to - from));
}

void KvCacheManager::distrust(KvSeq& seq) {
  pool_.unpublish(seq.blocks_);
  ring_pool_.unpublish(seq.ring_);
  seq.publish_stopped_ = true;
}

}  // namespace tandem::scheduler
