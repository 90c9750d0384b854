// Moving a sequence's KV blocks from one worker's pool to another's (disaggregated
// prefill and decode). The sender's frames point into its pool (ZeroMQ sends them from
// there: no copy into protobuf, no staging buffer); the receiver copies each block once,
// into the blocks the scheduler reserved for it.
//
// Message: frame 0 is a v1::KvTransfer header; then, for each region (layer, KV head,
// K|V) in that order, one frame per run of consecutive source block ids (the positions'
// blocks, then the tail's), holding the region's bytes of those blocks as they lie in the pool.
// With rings (KvPool::ring_blocks() > 0, docs/WINDOWS.md) those regions are the full layers'
// only; the windowed layers' regions follow, each with one frame per run of the ring's blocks
// the transfer carries (the window the receiver's next query needs, not every position's).
// A hybrid model's sequence also carries its recurrent state slot, as the message's last frame
// (pack_state / unpack_state: kept apart from the KV frames).
#pragma once

#include <cstdint>
#include <span>

#include "runtime/event_loop.h"
#include "runtime/status.h"
#include "tandem/v1/worker.pb.h"
#include "workers/engine/kv_cache.h"
#include "workers/engine/state_pool.h"

namespace tandem::worker {

// The wire's name of a format's code scheme (Register and KvTransfer carry it).
v1::KvQuantScheme kv_scheme_to_proto(const engine::KvFormat& format);

// A sequence's ring in a transfer: the windowed layers' blocks (ring pool ids) of logical blocks
// `first` .. first + blocks.size() - 1, and this side's ring window (the pool's ring layers'
// ModelConfig::window; 0: the pool has no rings). Empty without rings.
struct TransferRing {
  std::span<const int32_t> blocks = {};
  uint32_t first = 0;
  uint32_t window = 0;
};

// Blocks that hold positions [0, positions).
inline uint32_t transfer_blocks(uint32_t positions, uint32_t block_tokens) {
  return (positions + block_tokens - 1) / block_tokens;
}

// The most a transfer into `pool` of a sequence of up to `context_length` positions takes as
// ZeroMQ counts a message (payloads plus ZMQ_TANDEM_FRAME_OVERHEAD a frame): every block it
// can carry (with rings: the full layers' of every position, the ring pool's at most), one frame
// per block and region at worst (no two blocks consecutive), and a
// header with a token (5 bytes at most) per position and a run per block. The decode worker's
// KV socket drops a peer that sends a larger message as it reads it.
uint64_t max_transfer_bytes(const engine::KvPool& pool, uint32_t context_length);

// Appends the frames of a transfer of `blocks` (the sequence's first blocks, enough for
// header.positions()) to `out`: the header (its run_blocks and region_block_bytes filled
// here) and the raw frames. The pool's memory must stay as it is until ZeroMQ has sent
// them: the scheduler frees the source blocks only after the receiver acknowledged.
// With an F32 window (quantized KV), the sequence's `tail` blocks travel after those
// (tail_blocks and tail_end in the header), so the receiver continues with the same F32 rows.
// With rings, `blocks` are the full layers' and `ring` the windowed layers' blocks to send
// (ring_first, ring_run_blocks and ring_window in the header), their frames after the others.
void pack_transfer(engine::KvPool& pool, std::span<const int32_t> blocks, std::span<const int32_t> tail,
                   v1::KvTransfer& header, runtime::Frames& out, TransferRing ring = {});

// Writes the raw frames of a transfer (frames[1..]) into `dest` blocks of `pool`. Refuses,
// changing nothing, when the header's KV format (bytes per region, code scheme, rotation seed), the frame count or a
// frame's size does not match, or `dest` is too short. Returns the bytes copied. `dest_tail`: the receiving sequence's
// tail (its size must be the header's tail_blocks). `dest_ring`: with rings, the ring the scheduler reserved
// here; refused too when the sender's rings differ (none against some, another window) or its
// ring is not this one's logical blocks.
Result<uint64_t> unpack_transfer(engine::KvPool& pool, const v1::KvTransfer& header,
                                 std::span<const int32_t> dest_blocks, std::span<const int32_t> dest_tail,
                                 const runtime::Frames& frames, TransferRing dest_ring = {});

// A hybrid model's recurrent state in a transfer. Before pack_transfer (frame 0 is the
// header): fills the header's state fields for `slot` of `states`. Returns the frame to append
// after every other frame of the transfer: the slot's floats where they lie (zero copy; the
// slot stays as it is until the scheduler releases the sequence, after the receiver
// acknowledged). Refused when the slot's state is not at header.positions() (the state would
// not be the KV's).
Result<zmq::message_t> pack_state(engine::StatePool& states, uint32_t slot, v1::KvTransfer& header);

// Frames at the end of a transfer that pack_state added (0 or 1): unpack_transfer leaves them.
size_t state_frames(const v1::KvTransfer& header);

// Writes the transfer's state frame into `slot` of `states` (null: the receiver keeps no
// recurrent state) and sets the slot's position to the state's. Refuses, changing nothing,
// when one side has a state and the other not, or the slot's float count, layout, position
// or frame size differ. Returns the bytes copied (0 without a state).
Result<uint64_t> unpack_state(engine::StatePool* states, int32_t slot, const v1::KvTransfer& header,
                              const runtime::Frames& frames);

// What a state frame adds to a transfer at most (for max_transfer_bytes' bound; 0 without states).
uint64_t max_state_bytes(const engine::StatePool* states);

}  // namespace tandem::worker
