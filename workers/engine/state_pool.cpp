#include "workers/engine/state_pool.h"

#include <algorithm>
#include <string>

#include "workers/engine/hybrid.h"

namespace tandem::engine {

Result<std::unique_ptr<StatePool>> StatePool::create(const ModelConfig& c, uint32_t slots) {
  uint32_t n_rec = 0;
  for (uint32_t l = 0; l < c.n_layers; ++l) n_rec += c.is_recurrent(l) ? 1 : 0;
  if (n_rec == 0) return Status::invalid("state pool: the model has no recurrent layers");
  if (slots == 0) return Status::invalid("state pool: needs at least one slot");
  auto pool = std::unique_ptr<StatePool>(new StatePool());
  pool->slots_ = slots;
  pool->n_rec_ = n_rec;
  pool->conv_floats_ = size_t{c.ssm_conv_kernel - 1} * c.conv_channels();
  const hybrid::ChunkLayout delta{c.ssm_state_size, c.ssm_time_step_rank, c.ssm_group_count};
  pool->layer_floats_ = pool->conv_floats_ + delta.floats();
  pool->slot_floats_ = pool->layer_floats_ * n_rec;
  if (pool->slot_floats_ * slots > (size_t{1} << 34))
    return Status::invalid("state pool: " + std::to_string(slots) + " slots of " +
                           std::to_string(pool->slot_floats_ * sizeof(float)) + " bytes are too many");
  pool->data_.assign(pool->slot_floats_ * slots, 0.0f);
  pool->positions_.assign(slots, 0);
  return pool;
}

void StatePool::reset(uint32_t slot) {
  std::fill_n(base(slot), slot_floats_, 0.0f);
  positions_[slot] = 0;
}

void StatePool::copy(uint32_t from, uint32_t to) {
  if (from == to) return;
  std::copy_n(base(from), slot_floats_, base(to));
  positions_[to] = positions_[from];
}

}  // namespace tandem::engine
