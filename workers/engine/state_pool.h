// Per-sequence recurrent state of a hybrid model (docs/HYBRID.md): a pool of fixed-size slots
// beside the KV blocks, one slot per live sequence, each holding for every Gated DeltaNet layer
// its conv state (the last conv_kernel - 1 inputs, oldest first, [K - 1][channels]) and its
// delta-rule state on the 64-token grid (hybrid::ChunkLayout: per V head the state at the last
// grid point and the rows since, per Q/K head those rows' keys). A slot also records the position its state has
// reached: the engine continues a slot only from there (a recurrent state cannot roll back),
// and starts it from zero at position 0. Who owns which slot is the caller's (the worker's
// sequence table); the pool only holds the floats.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/status.h"
#include "workers/engine/model_file.h"

namespace tandem::engine {

class StatePool {
 public:
  // `slots` slots for `config` (a hybrid: config.recurrent names its recurrent layers).
  // Errors (kInvalidArgument): a model without recurrent layers, 0 slots, or more than 1 GiB x 64.
  static Result<std::unique_ptr<StatePool>> create(const ModelConfig& config, uint32_t slots);

  uint32_t slots() const { return slots_; }
  uint32_t recurrent_layers() const { return n_rec_; }
  // Floats of one slot (every recurrent layer's conv and recurrent state).
  size_t slot_floats() const { return slot_floats_; }
  // The conv state, [K - 1][channels], and the delta-rule state (hybrid::ChunkLayout) of
  // recurrent layer `r` (0 for the model's first recurrent layer, ...) in `slot`.
  float* conv(uint32_t slot, uint32_t r) { return base(slot) + r * layer_floats_; }
  float* recurrent(uint32_t slot, uint32_t r) { return base(slot) + r * layer_floats_ + conv_floats_; }
  // The position the slot's state has consumed tokens up to (0: fresh).
  uint32_t position(uint32_t slot) const { return positions_[slot]; }
  void set_position(uint32_t slot, uint32_t pos) { positions_[slot] = pos; }
  // Zeroes the slot (every layer) and its position.
  void reset(uint32_t slot);
  // Makes slot `to` a bitwise copy of slot `from`, position included (a prefix-cache checkpoint
  // saved or restored, docs/HYBRID.md "Prefix cache").
  void copy(uint32_t from, uint32_t to);

 private:
  float* base(uint32_t slot) { return data_.data() + size_t{slot} * slot_floats_; }
  uint32_t slots_ = 0, n_rec_ = 0;
  size_t conv_floats_ = 0, layer_floats_ = 0, slot_floats_ = 0;
  std::vector<float> data_;
  std::vector<uint32_t> positions_;
};

}  // namespace tandem::engine
