#include "workers/engine/state_pool.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "workers/engine/hybrid.h"

namespace tandem::engine {

Result<std::unique_ptr<StatePool>> StatePool::create(const ModelConfig& c, uint32_t slots, uint32_t rollback) {
  uint32_t n_rec = 0;
  for (uint32_t l = 0; l < c.n_layers; ++l) n_rec += c.is_recurrent(l) ? 1 : 0;
  if (n_rec == 0) return Status::invalid("state pool: the model has no recurrent layers");
  if (slots == 0) return Status::invalid("state pool: needs at least one slot");
  if (rollback >= hybrid::kGrid)
    return Status::invalid("state pool: a rollback of " + std::to_string(rollback) +
                           " positions reaches past a grid chunk of " + std::to_string(hybrid::kGrid));
  auto pool = std::unique_ptr<StatePool>(new StatePool());
  pool->slots_ = slots;
  pool->n_rec_ = n_rec;
  pool->rollback_ = rollback;
  pool->channels_ = c.conv_channels();
  pool->history_floats_ = size_t{rollback} * c.conv_channels();
  pool->conv_floats_ = pool->history_floats_ + size_t{c.ssm_conv_kernel - 1} * c.conv_channels();
  const hybrid::ChunkLayout delta{c.ssm_state_size, c.ssm_time_step_rank, c.ssm_group_count};
  pool->layer_floats_ = pool->conv_floats_ + delta.floats();
  pool->slot_floats_ = pool->layer_floats_ * n_rec;
  pool->layout_ = {n_rec,         c.ssm_conv_kernel - 1, c.conv_channels(), delta.d,
                   delta.v_heads, delta.k_heads,         hybrid::kGrid,     kernels::kPanel};
  if (pool->slot_floats_ * slots > (size_t{1} << 34))
    return Status::invalid("state pool: " + std::to_string(slots) + " slots of " +
                           std::to_string(pool->slot_floats_ * sizeof(float)) + " bytes are too many");
  pool->data_.assign(pool->slot_floats_ * slots, 0.0f);
  pool->positions_.assign(slots, 0);
  pool->kept_.assign(slots, 0);
  return pool;
}

void StatePool::advance(uint32_t slot, uint32_t n) {
  positions_[slot] += n;
  kept_[slot] = std::min(rollback_, kept_[slot] + n);
}

uint32_t StatePool::rollback_floor(uint32_t slot) const {
  const uint32_t pos = positions_[slot];
  return pos - std::min(pos % hybrid::kGrid, kept_[slot]);
}

uint32_t StatePool::drafts_within_chunk(uint32_t at) { return hybrid::kGrid - 1 - (at + 1) % hybrid::kGrid; }

Status StatePool::roll_back(uint32_t slot, uint32_t pos) {
  if (slot >= slots_) return Status::invalid("state pool: no slot " + std::to_string(slot));
  const uint32_t at = positions_[slot];
  if (pos > at || pos < rollback_floor(slot))
    return Status::invalid("state pool: slot " + std::to_string(slot) + " holds " + std::to_string(at) +
                           " positions and can go back to " + std::to_string(rollback_floor(slot)) + " at most, not " +
                           std::to_string(pos));
  const uint32_t back = at - pos;
  if (back == 0) return Status::ok();
  // Each layer's inputs [history | conv] move `back` rows toward the end: the rows that end at
  // `pos`; the oldest `back` rows are no longer held (kept_ shrinks).
  const size_t rows_floats = conv_floats_, shift = size_t{back} * channels_;
  for (uint32_t r = 0; r < n_rec_; ++r) {
    float* in = base(slot) + r * layer_floats_;
    std::memmove(in + shift, in, (rows_floats - shift) * sizeof(float));
    std::fill_n(in, shift, 0.0f);
  }
  positions_[slot] = pos;
  kept_[slot] -= back;
  return Status::ok();
}

void StatePool::assign(uint32_t slot, std::span<const float> src, uint32_t src_rollback, uint32_t pos) {
  const size_t src_history = size_t{src_rollback} * channels_,
               src_layer = layer_floats_ - history_floats_ + src_history;
  for (uint32_t r = 0; r < n_rec_; ++r) {
    float* dst = base(slot) + r * layer_floats_;
    std::fill_n(dst, history_floats_, 0.0f);
    std::memcpy(dst + history_floats_, src.data() + r * src_layer + src_history,
                (layer_floats_ - history_floats_) * sizeof(float));
  }
  set_position(slot, pos);
}

void StatePool::reset(uint32_t slot) {
  std::fill_n(base(slot), slot_floats_, 0.0f);
  positions_[slot] = 0;
  kept_[slot] = rollback_;  // the inputs before position 0 are zeros
}

void StatePool::copy(uint32_t from, uint32_t to) {
  if (from == to) return;
  std::copy_n(base(from), slot_floats_, base(to));
  positions_[to] = positions_[from];
  kept_[to] = kept_[from];
}

}  // namespace tandem::engine
