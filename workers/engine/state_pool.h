// Per-sequence recurrent state of a hybrid model (docs/HYBRID.md): a pool of fixed-size slots
// beside the KV blocks, one slot per live sequence, each holding for every Gated DeltaNet layer
// its conv state (the last conv_kernel - 1 inputs, oldest first, [K - 1][channels]), right after
// `rollback` older inputs kept for roll_back, and its delta-rule state on the 64-token grid
// (hybrid::ChunkLayout: per V head the state at the last grid point and the rows since, per Q/K
// head those rows' keys). A slot also records the position its state has reached: the engine
// continues a slot only from there, and starts it from zero at position 0. Who owns which slot is
// the caller's (the worker's sequence table); the pool only holds the floats.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/status.h"
#include "workers/engine/model_file.h"

namespace tandem::engine {

class StatePool {
 public:
  // `slots` slots for `config` (a hybrid: config.recurrent names its recurrent layers), each
  // able to roll back `rollback` positions (speculative decoding's drafts per round; 0: never).
  // Errors (kInvalidArgument): a model without recurrent layers, 0 slots, a rollback of 64 or
  // more (a grid chunk), or more than 1 GiB x 64.
  static Result<std::unique_ptr<StatePool>> create(const ModelConfig& config, uint32_t slots, uint32_t rollback = 0);

  uint32_t slots() const { return slots_; }
  uint32_t recurrent_layers() const { return n_rec_; }
  uint32_t rollback() const { return rollback_; }
  // Floats of one slot (every recurrent layer's conv inputs and recurrent state).
  size_t slot_floats() const { return slot_floats_; }
  // What the floats of a slot mean, for a handoff between workers (v1::KvTransfer.state_layout):
  // recurrent layers, conv rows (kernel - 1), conv channels, delta-rule head dim, V heads,
  // Q/K heads, grid rows (hybrid::kGrid), GEMM panel width (kernels::kPanel). Two pools whose
  // layouts are equal hold the same state in the same bytes.
  using Layout = std::array<uint32_t, 8>;
  const Layout& layout() const { return layout_; }
  // A slot's floats, as they lie in the pool (stable: the pool never moves them).
  std::span<float> slot(uint32_t slot) { return {base(slot), slot_floats_}; }
  // The conv state, [K - 1][channels], and the delta-rule state (hybrid::ChunkLayout) of
  // recurrent layer `r` (0 for the model's first recurrent layer, ...) in `slot`. The
  // rollback() inputs before the conv state's are its rows -rollback() .. -1.
  float* conv(uint32_t slot, uint32_t r) { return base(slot) + r * layer_floats_ + history_floats_; }
  float* recurrent(uint32_t slot, uint32_t r) { return base(slot) + r * layer_floats_ + conv_floats_; }
  // The position the slot's state has consumed tokens up to (0: fresh).
  uint32_t position(uint32_t slot) const { return positions_[slot]; }
  // A state set from elsewhere: it holds `pos` positions and no older conv inputs (no rollback).
  void set_position(uint32_t slot, uint32_t pos) { positions_[slot] = pos, kept_[slot] = 0; }
  // The engine fed `n` more positions (their conv inputs shifted into the slot).
  void advance(uint32_t slot, uint32_t n);
  // The earliest position roll_back can take `slot` to: the open grid chunk's start (the rows
  // since it can be forgotten; the state before it is folded away), no further back than the
  // conv inputs kept.
  uint32_t rollback_floor(uint32_t slot) const;
  // Takes `slot` back to position `pos`, as if the positions after it had never been fed: the
  // open grid chunk's rows past it are forgotten (written over by the next feed) and the conv
  // state becomes the K - 1 inputs ending at it. Refused (the slot unchanged) for a position
  // past the slot's or before rollback_floor().
  [[nodiscard]] Status roll_back(uint32_t slot, uint32_t pos);
  // Drafts a speculating round that feeds its last sample at position `at` may carry so that
  // a rollback to at + 1 (no draft accepted) stays possible: none of the draft rows may complete
  // a grid chunk (its fold), i.e. kGrid - 1 - (at + 1) % kGrid (0 for one round in 64).
  static uint32_t drafts_within_chunk(uint32_t at);
  // Zeroes the slot (every layer) and its position.
  void reset(uint32_t slot);
  // The floats of a slot of this layout that keeps `rollback` older conv inputs (another
  // worker's pool: --spec-tokens may differ between a prefill and a decode worker).
  size_t slot_floats_with(uint32_t rollback) const {
    return slot_floats_ - history_floats_ * n_rec_ + size_t{rollback} * channels_ * n_rec_;
  }
  // Writes into `slot` the state `src`, a slot of a pool of this layout keeping `src_rollback`
  // older inputs (slot_floats_with(src_rollback) floats), at position `pos`: each layer's conv
  // state and recurrent state; the older inputs are not taken (set_position: none kept).
  void assign(uint32_t slot, std::span<const float> src, uint32_t src_rollback, uint32_t pos);
  // Makes slot `to` a bitwise copy of slot `from`, position included (a prefix-cache checkpoint
  // saved or restored, docs/HYBRID.md "Prefix cache").
  void copy(uint32_t from, uint32_t to);

 private:
  float* base(uint32_t slot) { return data_.data() + size_t{slot} * slot_floats_; }
  uint32_t slots_ = 0, n_rec_ = 0, rollback_ = 0, channels_ = 0;
  // Per layer: history (rollback_ rows), conv state (K - 1 rows), recurrent state.
  size_t history_floats_ = 0, conv_floats_ = 0, layer_floats_ = 0, slot_floats_ = 0;
  Layout layout_{};
  std::vector<float> data_;
  std::vector<uint32_t> positions_;
  std::vector<uint32_t> kept_;  // per slot: conv inputs held before the conv state's (<= rollback_)
};

}  // namespace tandem::engine
