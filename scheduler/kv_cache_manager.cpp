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
  if (checkpointed()) match_checkpointed(hit, keys);
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
  if (prefix.checkpoint_ >= 0) {  // pinned until the plan restoring it goes out (take_restore)
    seq.restore_ = prefix.checkpoint_;
    ++checkpoints_[seq.restore_].pins;
    checkpoints_[seq.restore_].used = ++checkpoint_clock_;
  }
  return true;
}

void KvCacheManager::free(KvSeq& seq) {
  take_restore(seq);
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
  seq.distrusted_ = true;
  // A checkpoint it saved may sit at another copy's block, which stays published: drop it too
  // (one it no longer holds, since reused, is dropped as well: a lost entry, never a wrong one).
  for (int32_t c : seq.saved_) checkpoints_[c].block = -1;
}

void KvCacheManager::set_checkpoints(uint32_t n, uint32_t interval) {
  if (n == 0 || interval == 0 || interval % block_tokens_ != 0) {
    prefix_cache_ = false;
    return;
  }
  checkpoints_.assign(n, Checkpoint{});
  interval_ = interval;
}

bool KvCacheManager::live(int32_t c) const {
  const Checkpoint& cp = checkpoints_[c];
  if (!pool_.holds(cp.block, cp.key, cp.gen)) return false;
  const auto it = checkpoint_by_key_.find(cp.key);
  return it != checkpoint_by_key_.end() && it->second == c;
}

uint32_t KvCacheManager::checkpoints_free() const {
  uint32_t n = 0;
  for (size_t c = 0; c < checkpoints_.size(); ++c) n += !live(static_cast<int32_t>(c));
  return n;
}

void KvCacheManager::match_checkpointed(PrefixHit& hit, const PrefixKeys& keys) const {
  const uint32_t per = interval_ / block_tokens_;  // blocks between checkpoint positions
  for (uint32_t n = hit.blocks() / per * per; n > 0; n -= per) {
    const auto it = checkpoint_by_key_.find(keys.keys_[n - 1]);
    if (it == checkpoint_by_key_.end() || checkpoints_[it->second].block != hit.blocks_[n - 1] || !live(it->second))
      continue;
    hit.blocks_.resize(n);
    hit.checkpoint_ = it->second;
    return;
  }
  hit.blocks_.clear();
}

int32_t KvCacheManager::checkpoint_victim() const {
  int32_t best = -1;
  for (size_t i = 0; i < checkpoints_.size(); ++i) {
    const auto c = static_cast<int32_t>(i);
    if (checkpoints_[c].pins > 0) continue;
    if (!live(c)) return c;  // holds nothing findable
    if (best < 0 || checkpoints_[c].used < checkpoints_[best].used) best = c;
  }
  return best;
}

uint32_t KvCacheManager::checkpoint_chunk(const KvSeq& seq, std::span<const int32_t> tokens, uint32_t fed, uint32_t n,
                                          PrefixKeys& keys) const {
  if (!checkpointed() || !prefix_cache_ || seq.distrusted_) return n;
  const uint32_t at = std::min<uint32_t>(fed + n, static_cast<uint32_t>(tokens.size())) / interval_ * interval_;
  if (at <= fed || checkpoint_victim() < 0) return n;
  extend_keys(tokens.first(at), keys);
  const auto it = checkpoint_by_key_.find(keys.keys_[at / block_tokens_ - 1]);
  if (it != checkpoint_by_key_.end() && live(it->second)) return n;  // that prefix has one
  return at - fed;
}

int32_t KvCacheManager::save_checkpoint(KvSeq& seq, std::span<const int32_t> tokens, uint32_t known,
                                        const PrefixKeys& keys) {
  if (!checkpointed() || known == 0 || known % interval_ != 0 || seq.distrusted_) return -1;
  const uint32_t n = known / block_tokens_;
  if (keys.keys_.size() < n || tokens.size() < known) return -1;
  const uint64_t key = keys.keys_[n - 1];
  const auto it = checkpoint_by_key_.find(key);
  if (it != checkpoint_by_key_.end() && live(it->second)) return -1;
  const int32_t c = checkpoint_victim();
  if (c < 0) return -1;
  // The cached blocks holding this prefix (its own, or another copy's if it published first).
  std::vector<int32_t> held;  // once per checkpoint position of a prompt: not a per-token cost
  if (pool_.match(tokens.first(known), std::span<const uint64_t>(keys.keys_).first(n), held) != n) return -1;
  Checkpoint& cp = checkpoints_[c];
  if (const auto old = checkpoint_by_key_.find(cp.key); old != checkpoint_by_key_.end() && old->second == c)
    checkpoint_by_key_.erase(old);
  cp = Checkpoint{key, held[n - 1], pool_.generation(held[n - 1]), 0, ++checkpoint_clock_};
  checkpoint_by_key_[key] = c;
  seq.saved_.push_back(c);  // once per checkpoint position: not a per-token cost
  return c;
}

int32_t KvCacheManager::take_restore(KvSeq& seq) {
  const int32_t c = seq.restore_;
  if (c >= 0) --checkpoints_[c].pins;
  seq.restore_ = -1;
  return c;
}

}  // namespace tandem::scheduler
