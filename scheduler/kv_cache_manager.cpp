#include "scheduler/kv_cache_manager.h"

#include <algorithm>

namespace tandem::scheduler {

KvCacheManager::KvCacheManager(uint32_t n_blocks, uint32_t block_tokens, uint32_t tail_blocks, bool prefix_cache,
                               BlockHash hash)
    : pool_(n_blocks, block_tokens),
      block_tokens_(block_tokens),
      tail_blocks_(tail_blocks),
      prefix_cache_(prefix_cache),
      hash_(hash) {}

bool KvCacheManager::can_ever_fit(uint32_t positions) const {
  return uint64_t{blocks_for(positions)} + tail_blocks_ <= pool_.total();
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
  return hit;
}

bool KvCacheManager::has_room(const PrefixHit& hit, uint32_t positions, uint32_t running) const {
  uint32_t hit_cached = 0;  // shared blocks that stop being available
  for (int32_t b : hit.blocks_) hit_cached += pool_.cached_block(b);
  const uint32_t headroom = (running + 3) / 4;
  const uint32_t fresh = blocks_for(positions + 1) - hit.blocks() + tail_blocks_;
  return pool_.available() >= uint64_t{fresh} + hit_cached + headroom;
}

bool KvCacheManager::allocate_more(KvSeq& seq, uint32_t positions, const PrefixHit& prefix) {
  const uint32_t need = blocks_for(positions);
  if (seq.started_) return pool_.allocate(need - seq.blocks(), seq.blocks_);
  seq.blocks_ = prefix.blocks_;
  pool_.ref(seq.blocks_);
  if (!pool_.allocate(need - std::min(need, seq.blocks()), seq.blocks_) || !pool_.allocate(tail_blocks_, seq.tail_)) {
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
  seq = KvSeq{};
}

void KvCacheManager::trim(KvSeq& seq, uint32_t positions) {
  const uint32_t keep = blocks_for(positions);
  const uint32_t full = positions / block_tokens_;
  if (seq.published_ > full) {
    pool_.unpublish(std::span<const int32_t>(seq.blocks_).subspan(full, seq.published_ - full));
    seq.published_ = full;
  }
  if (seq.blocks() <= keep) return;
  pool_.release(std::span<const int32_t>(seq.blocks_).subspan(keep));
  seq.blocks_.resize(keep);
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
  }
}

void KvCacheManager::distrust(KvSeq& seq) {
  pool_.unpublish(seq.blocks_);
  seq.publish_stopped_ = true;
}

}  // namespace tandem::scheduler
