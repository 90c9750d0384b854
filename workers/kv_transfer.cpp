#include "workers/kv_transfer.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "runtime/wire.h"

namespace tandem::worker {

namespace {
// Calls fn(layer, kv_head, kv) for every region of the full layers (ring_layers false: every
// layer of a pool without rings) or of the ring layers, in the order of a transfer's frames. A
// hybrid's recurrent layers have no regions (their state travels as the state frame).
template <typename Fn>
void for_each_region(const engine::KvPool& pool, bool ring_layers, Fn fn) {
  for (uint32_t l = 0; l < pool.n_layers(); ++l) {
    if (pool.ring_layer(l) != ring_layers || pool.recurrent_layer(l)) continue;
    for (uint32_t h = 0; h < pool.n_kv_heads(); ++h)
      for (uint32_t kv = 0; kv < 2; ++kv) fn(l, h, kv);
  }
}

uint64_t regions(const engine::KvPool& pool, bool ring_layers) {
  uint64_t n = 0;
  for_each_region(pool, ring_layers, [&](uint32_t, uint32_t, uint32_t) { ++n; });
  return n;
}

using Runs = google::protobuf::RepeatedField<uint32_t>;

// The runs of consecutive ids in `blocks`, appended to `runs`.
void add_runs(std::span<const int32_t> blocks, Runs& runs) {
  for (size_t i = 0; i < blocks.size();) {
    size_t j = i + 1;
    while (j < blocks.size() && blocks[j] == blocks[j - 1] + 1) ++j;
    runs.Add(static_cast<uint32_t>(j - i));
    i = j;
  }
}

uint64_t covered(const Runs& runs) {
  uint64_t n = 0;
  for (uint32_t run : runs) n += run;
  return n;
}

// One frame per region and run of `blocks`: the pool's memory (zero copy; no free function:
// the pool owns it).
void push_frames(engine::KvPool& pool, bool ring_layers, const Runs& runs, std::span<const int32_t> blocks,
                 runtime::Frames& out) {
  for_each_region(pool, ring_layers, [&](uint32_t l, uint32_t h, uint32_t kv) {
    uint32_t i = 0;
    for (uint32_t run : runs) {
      out.emplace_back(pool.block_data(l, h, kv, static_cast<uint32_t>(blocks[i])), pool.region_block_bytes(l) * run,
                       nullptr, nullptr);
      i += run;
    }
  });
}

// Why frames[f..] are not one frame of each region and run's size ("" when they are); f moves past them.
std::string check_frames(const engine::KvPool& pool, bool ring_layers, const Runs& runs, const runtime::Frames& frames,
                         size_t& f) {
  std::string bad;
  for_each_region(pool, ring_layers, [&](uint32_t l, uint32_t, uint32_t) {
    for (uint32_t run : runs) {
      const size_t want = pool.region_block_bytes(l) * run;
      if (bad.empty() && frames[f].size() != want)
        bad = "transfer frame " + std::to_string(f) + " has " + std::to_string(frames[f].size()) + " bytes, expected " +
              std::to_string(want);
      ++f;
    }
  });
  return bad;
}

// Copies frames[f..] (checked) into `dest`; f moves past them. Returns the bytes copied.
uint64_t copy_frames(engine::KvPool& pool, bool ring_layers, const Runs& runs, std::span<const int32_t> dest,
                     const runtime::Frames& frames, size_t& f) {
  uint64_t copied = 0;
  for_each_region(pool, ring_layers, [&](uint32_t l, uint32_t h, uint32_t kv) {
    const size_t bytes = pool.region_block_bytes(l);
    uint32_t i = 0;
    for (uint32_t run : runs) {
      const auto* src = static_cast<const uint8_t*>(frames[f++].data());
      for (uint32_t b = 0; b < run;) {
        // Consecutive destination ids take one copy (their bytes are adjacent too).
        uint32_t m = 1;
        while (b + m < run && dest[i + m] == dest[i] + static_cast<int32_t>(m)) ++m;
        std::memcpy(pool.block_data(l, h, kv, static_cast<uint32_t>(dest[i])), src + size_t{b} * bytes, bytes * m);
        copied += bytes * m;
        b += m;
        i += m;
      }
    }
  });
  return copied;
}

// "no rings" or "rings of window W": a side's rings as an error names them.
std::string rings_name(uint32_t window) {
  return window == 0 ? std::string("no rings") : "rings of window " + std::to_string(window);
}

// The transfer's ring against this pool's rings and the ring reserved here.
Status check_ring(const engine::KvPool& pool, const v1::KvTransfer& header, TransferRing dest) {
  if (header.ring_window() != dest.window)
    return Status::invalid("KV rings differ: the sending worker keeps " + rings_name(header.ring_window()) +
                           ", this worker " + rings_name(dest.window) +
                           " (--kv-rings on both prefill and decode workers, or on neither)");
  const uint64_t sent = covered(header.ring_run_blocks());
  if (header.ring_first() != dest.first || sent != dest.blocks.size())
    return Status::invalid("transfer's ring is " + std::to_string(sent) + " blocks from logical block " +
                           std::to_string(header.ring_first()) + ", the ring reserved here " +
                           std::to_string(dest.blocks.size()) + " blocks from logical block " +
                           std::to_string(dest.first));
  for (int32_t id : dest.blocks)
    if (id < 0 || static_cast<uint32_t>(id) >= pool.ring_blocks())
      return Status::invalid("reserved ring block " + std::to_string(id) + " is outside the ring pool of " +
                             std::to_string(pool.ring_blocks()));
  return Status::ok();
}
}  // namespace

v1::KvQuantScheme kv_scheme_to_proto(const engine::KvFormat& format) {
  return format.rotated() ? v1::KV_QUANT_SCHEME_ROTATED : v1::KV_QUANT_SCHEME_UNIFORM;
}

namespace {
// "uniform" or "rotated (seed N)": a transfer's scheme as an error names it.
std::string scheme_name(v1::KvQuantScheme scheme, uint64_t seed) {
  if (scheme == v1::KV_QUANT_SCHEME_ROTATED) return "rotated (seed " + std::to_string(seed) + ")";
  if (scheme == v1::KV_QUANT_SCHEME_UNIFORM || scheme == v1::KV_QUANT_SCHEME_UNSPECIFIED) return "uniform";
  return "unknown scheme " + std::to_string(scheme);
}
}  // namespace

uint64_t max_transfer_bytes(const engine::KvPool& pool, uint32_t context_length) {
  const uint64_t blocks =
      std::min<uint64_t>(transfer_blocks(context_length, pool.block_tokens()), pool.n_blocks()) + pool.tail_blocks();
  const uint64_t frames = 1 + uint64_t{pool.n_layers()} * pool.n_kv_heads() * 2 * blocks;
  // With rings, the ring blocks a transfer can carry (at most the ring pool), a frame each per ring region.
  const uint64_t ring = std::min<uint64_t>(transfer_blocks(context_length, pool.block_tokens()), pool.ring_blocks());
  const uint64_t header = 4096 + 5 * (uint64_t{context_length} + blocks + ring + 3 * pool.n_layers());
  return blocks * pool.block_bytes() + ring * pool.ring_block_bytes() + header +
         (frames + regions(pool, true) * ring) * ZMQ_TANDEM_FRAME_OVERHEAD;
}

void pack_transfer(engine::KvPool& pool, std::span<const int32_t> positions_blocks, std::span<const int32_t> tail,
                   v1::KvTransfer& header, runtime::Frames& out, TransferRing ring) {
  std::vector<int32_t> blocks(positions_blocks.begin(),
                              positions_blocks.begin() + transfer_blocks(header.positions(), pool.block_tokens()));
  blocks.insert(blocks.end(), tail.begin(), tail.end());
  header.set_tail_blocks(static_cast<uint32_t>(tail.size()));
  header.clear_run_blocks();
  add_runs(blocks, *header.mutable_run_blocks());
  header.set_kv_quant_scheme(kv_scheme_to_proto(pool.format()));
  header.set_kv_rotation_seed(pool.format().rotated() ? pool.format().rotation_seed : 0);
  header.clear_region_block_bytes();
  for (uint32_t l = 0; l < pool.n_layers(); ++l) header.add_region_block_bytes(pool.region_block_bytes(l));
  header.set_ring_window(ring.window);
  header.set_ring_first(ring.first);
  header.clear_ring_run_blocks();
  add_runs(ring.blocks, *header.mutable_ring_run_blocks());
  out.push_back(runtime::to_frame(header));
  push_frames(pool, false, header.run_blocks(), blocks, out);
  push_frames(pool, true, header.ring_run_blocks(), ring.blocks, out);
}

Result<uint64_t> unpack_transfer(engine::KvPool& pool, const v1::KvTransfer& header,
                                 std::span<const int32_t> dest_blocks, std::span<const int32_t> dest_tail,
                                 const runtime::Frames& frames, TransferRing dest_ring) {
  const uint32_t positions_blocks = transfer_blocks(header.positions(), pool.block_tokens());
  if (dest_blocks.size() < positions_blocks)
    return Status::invalid("transfer of " + std::to_string(header.positions()) + " positions needs " +
                           std::to_string(positions_blocks) + " blocks, " + std::to_string(dest_blocks.size()) +
                           " were reserved");
  if (header.tail_blocks() != pool.tail_blocks() || dest_tail.size() != pool.tail_blocks())
    return Status::invalid("KV format differs: the transfer carries a tail of " + std::to_string(header.tail_blocks()) +
                           " blocks (F32 window), this pool's tails take " + std::to_string(pool.tail_blocks()) +
                           " and " + std::to_string(dest_tail.size()) + " were reserved");
  const v1::KvQuantScheme scheme = kv_scheme_to_proto(pool.format());
  const uint64_t seed = pool.format().rotated() ? pool.format().rotation_seed : 0;
  const v1::KvQuantScheme sent = header.kv_quant_scheme() == v1::KV_QUANT_SCHEME_UNSPECIFIED
                                     ? v1::KV_QUANT_SCHEME_UNIFORM
                                     : header.kv_quant_scheme();
  if (sent != scheme || header.kv_rotation_seed() != seed)
    return Status::invalid("KV format differs: the transfer's codes are " +
                           scheme_name(header.kv_quant_scheme(), header.kv_rotation_seed()) + ", this pool's " +
                           scheme_name(scheme, seed));
  if (header.tail_end() < -1 || header.tail_end() > header.positions())
    return Status::invalid("transfer's tail_end " + std::to_string(header.tail_end()) + " is outside [-1, " +
                           std::to_string(header.positions()) + "]");
  std::vector<int32_t> dest(dest_blocks.begin(), dest_blocks.begin() + positions_blocks);
  dest.insert(dest.end(), dest_tail.begin(), dest_tail.end());
  const uint32_t n = static_cast<uint32_t>(dest.size());
  if (covered(header.run_blocks()) != n)
    return Status::invalid("transfer runs cover " + std::to_string(covered(header.run_blocks())) +
                           " blocks, positions and tail need " + std::to_string(n));
  if (static_cast<uint32_t>(header.region_block_bytes_size()) != pool.n_layers())
    return Status::invalid("transfer has " + std::to_string(header.region_block_bytes_size()) + " layers, this pool " +
                           std::to_string(pool.n_layers()));
  for (uint32_t l = 0; l < pool.n_layers(); ++l)
    if (header.region_block_bytes(static_cast<int>(l)) != pool.region_block_bytes(l))
      return Status::invalid("KV format differs: layer " + std::to_string(l) + " blocks are " +
                             std::to_string(header.region_block_bytes(static_cast<int>(l))) +
                             " bytes per region there, " + std::to_string(pool.region_block_bytes(l)) + " here");
  for (int32_t id : dest)
    if (id < 0 || static_cast<uint32_t>(id) >= pool.n_blocks())
      return Status::invalid("reserved block " + std::to_string(id) + " is outside the pool");
  TANDEM_RETURN_IF_ERROR(check_ring(pool, header, dest_ring));
  const uint64_t expected = 1 + regions(pool, false) * header.run_blocks_size() +
                            regions(pool, true) * header.ring_run_blocks_size() + state_frames(header);
  if (frames.size() != expected)
    return Status::invalid("transfer has " + std::to_string(frames.size()) + " frames, expected " +
                           std::to_string(expected));
  // Check every frame before writing any: a refused transfer leaves the pool untouched.
  size_t f = 1;
  std::string bad = check_frames(pool, false, header.run_blocks(), frames, f);
  if (bad.empty()) bad = check_frames(pool, true, header.ring_run_blocks(), frames, f);
  if (!bad.empty()) return Status::invalid(bad);
  f = 1;
  const uint64_t copied = copy_frames(pool, false, header.run_blocks(), dest, frames, f);
  return copied + copy_frames(pool, true, header.ring_run_blocks(), dest_ring.blocks, frames, f);
}

namespace {
// "[a, b, ...]": a state layout as an error names it.
template <typename Seq>
std::string layout_name(const Seq& layout) {
  std::string out = "[";
  for (uint32_t v : layout) out += (out.size() > 1 ? ", " : "") + std::to_string(v);
  return out + "]";
}

// Why `header`'s state cannot go into a slot of `states` (empty: it can).
std::string state_mismatch(const engine::StatePool& states, const v1::KvTransfer& header) {
  if (header.state_rollback() >= 64 || header.state_floats() != states.slot_floats_with(header.state_rollback()))
    return "recurrent state differs: the transfer's slot holds " + std::to_string(header.state_floats()) +
           " floats with " + std::to_string(header.state_rollback()) + " older conv inputs, this worker's " +
           std::to_string(states.slot_floats_with(header.state_rollback())) + " would";
  const engine::StatePool::Layout& mine = states.layout();
  if (!std::equal(header.state_layout().begin(), header.state_layout().end(), mine.begin(), mine.end()))
    return "recurrent state layout differs: the transfer's is " + layout_name(header.state_layout()) +
           ", this worker's " + layout_name(mine) +
           " (recurrent layers, conv rows, conv channels, head dim, V heads, Q/K heads, grid, panel)";
  if (header.state_position() != header.positions())
    return "the transfer's recurrent state is at position " + std::to_string(header.state_position()) + ", its KV at " +
           std::to_string(header.positions());
  return {};
}
}  // namespace

Result<zmq::message_t> pack_state(engine::StatePool& states, uint32_t slot, v1::KvTransfer& header) {
  if (slot >= states.slots()) return Status::invalid("state slot " + std::to_string(slot) + " is outside the pool");
  if (states.position(slot) != header.positions())
    return Status::invalid("the sequence's recurrent state is at position " + std::to_string(states.position(slot)) +
                           ", the handoff sends " + std::to_string(header.positions()) + " positions");
  header.set_state_floats(states.slot_floats());
  header.set_state_rollback(states.rollback());
  header.mutable_state_layout()->Assign(states.layout().begin(), states.layout().end());
  header.set_state_position(states.position(slot));
  const std::span<float> floats = states.slot(slot);
  // Zero copy, as the KV blocks: the pool owns the memory.
  return zmq::message_t(floats.data(), floats.size_bytes(), nullptr, nullptr);
}

size_t state_frames(const v1::KvTransfer& header) { return header.state_floats() > 0 ? 1 : 0; }

Result<uint64_t> unpack_state(engine::StatePool* states, int32_t slot, const v1::KvTransfer& header,
                              const runtime::Frames& frames) {
  if (states == nullptr && header.state_floats() == 0) return uint64_t{0};
  if (states == nullptr)
    return Status::invalid("the transfer carries a recurrent state (a hybrid model's), this worker keeps none");
  if (header.state_floats() == 0)
    return Status::invalid("the transfer carries no recurrent state, this worker's model (a hybrid) needs one");
  if (slot < 0 || static_cast<uint32_t>(slot) >= states->slots())
    return Status::invalid("no state slot was taken for the transfer");
  if (std::string why = state_mismatch(*states, header); !why.empty()) return Status::invalid(why);
  const size_t bytes = header.state_floats() * sizeof(float);
  if (frames.size() < 2 || frames.back().size() != bytes)
    return Status::invalid("state frame has " + std::to_string(frames.size() < 2 ? 0 : frames.back().size()) +
                           " bytes, expected " + std::to_string(bytes));
  // The sender may keep another number of older conv inputs (--spec-tokens): not carried over.
  states->assign(static_cast<uint32_t>(slot),
                 std::span<const float>(static_cast<const float*>(frames.back().data()), header.state_floats()),
                 header.state_rollback(), header.state_position());
  return uint64_t{bytes};
}

uint64_t max_state_bytes(const engine::StatePool* states) {
  if (states == nullptr) return 0;
  // The frame, its overhead, and the header's fields (a few bytes each).
  return states->slot_floats() * sizeof(float) + ZMQ_TANDEM_FRAME_OVERHEAD + 128;
}

}  // namespace tandem::worker
