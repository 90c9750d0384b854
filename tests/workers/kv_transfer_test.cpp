// Moving KV blocks between two pools over a real ZeroMQ socket: the bytes arrive exactly,
// into whatever blocks the receiver reserved; every mismatch is refused with the pool
// untouched. A hybrid model's state slot travels with them, and the receiving engine continues
// the sequence bitwise as the sending one would have.
#include "workers/kv_transfer.h"

#include <gtest/gtest.h>

#include <cassert>
#include <cstdlib>
#include <cstring>
#include <random>

#include "model/gguf.h"
#include "model/model_config.h"
#include "runtime/wire.h"
#include "tests/test_util.h"
#include "workers/engine/engine.h"

namespace tandem::worker {
namespace {

model::ModelConfig tiny_config() {
  auto f = model::GgufFile::open(test::model_file("tiny", 1));
  return model::read_model_config(**f).value();
}

// Random bytes in every block of every region (with rings: the full layers' n_blocks, the ring
// layers' ring_blocks).
void fill(engine::KvPool& pool, uint32_t seed) {
  std::mt19937 rng(seed);
  for (uint32_t l = 0; l < pool.n_layers(); ++l)
    for (uint32_t h = 0; h < pool.n_kv_heads(); ++h)
      for (uint32_t kv = 0; kv < 2; ++kv)
        for (uint32_t b = 0; b < (pool.ring_layer(l) ? pool.ring_blocks() : pool.n_blocks()); ++b) {
          uint8_t* p = pool.block_data(l, h, kv, b);
          for (size_t i = 0; i < pool.region_block_bytes(l); ++i) p[i] = static_cast<uint8_t>(rng());
        }
}

bool same_block(engine::KvPool& a, uint32_t ba, engine::KvPool& b, uint32_t bb) {
  for (uint32_t l = 0; l < a.n_layers(); ++l)
    for (uint32_t h = 0; h < a.n_kv_heads(); ++h)
      for (uint32_t kv = 0; kv < 2; ++kv)
        if (std::memcmp(a.block_data(l, h, kv, ba), b.block_data(l, h, kv, bb), a.region_block_bytes(l)) != 0)
          return false;
  return true;
}

// Sends over a real ipc-free in-process ZeroMQ pair (inproc behaves like ipc/tcp for
// framing; the processes test covers ipc).
runtime::Frames round_trip(runtime::Frames& frames) {
  zmq::context_t ctx;
  zmq::socket_t push(ctx, zmq::socket_type::push), pull(ctx, zmq::socket_type::pull);
  pull.bind("inproc://kv");
  push.connect("inproc://kv");
  for (size_t i = 0; i < frames.size(); ++i)
    (void)push.send(frames[i], i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  runtime::Frames got;
  do {
    got.emplace_back();
    (void)pull.recv(got.back());
  } while (got.back().more());
  return got;
}

TEST(KvTransfer, BlocksArriveExactlyInTheReservedBlocks) {
  const model::ModelConfig config = tiny_config();
  auto src = engine::KvPool::create(config, 64).value();
  auto dst = engine::KvPool::create(config, 64).value();
  fill(*src, 1);
  fill(*dst, 2);
  // A source table with two runs and a scattered destination with a run of its own.
  const std::vector<int32_t> from = {3, 4, 5, 9, 10, 40, 41};
  const std::vector<int32_t> to = {60, 7, 8, 9, 0, 33, 12};
  v1::KvTransfer header;
  header.set_positions(6 * 16 + 5);  // the last block partly filled: sent whole
  runtime::Frames frames;
  pack_transfer(*src, from, {}, header, frames);
  EXPECT_EQ(header.run_blocks_size(), 3);
  EXPECT_EQ(frames.size(), 1 + size_t{config.n_layers} * config.n_kv_heads * 2 * 3);
  runtime::Frames got = round_trip(frames);
  v1::KvTransfer parsed;
  ASSERT_TRUE(runtime::parse_frame(got[0], parsed).is_ok());
  auto copied = unpack_transfer(*dst, parsed, to, {}, got);
  ASSERT_TRUE(copied) << copied.status().to_string();
  EXPECT_EQ(*copied, 7 * src->block_bytes());
  for (size_t i = 0; i < from.size(); ++i) EXPECT_TRUE(same_block(*src, from[i], *dst, to[i])) << i;
  // Nothing else changed.
  auto ref = engine::KvPool::create(config, 64).value();
  fill(*ref, 2);
  for (int32_t b = 0; b < 64; ++b) {
    if (std::find(to.begin(), to.end(), b) != to.end()) continue;
    EXPECT_TRUE(same_block(*ref, b, *dst, b)) << b;
  }
}

TEST(KvTransfer, MismatchesAreRefusedAndThePoolIsUntouched) {
  const model::ModelConfig config = tiny_config();
  auto src = engine::KvPool::create(config, 16).value();
  auto dst = engine::KvPool::create(config, 16).value();
  fill(*src, 3);
  fill(*dst, 4);
  auto ref = engine::KvPool::create(config, 16).value();
  fill(*ref, 4);
  auto untouched = [&] {
    for (int32_t b = 0; b < 16; ++b)
      if (!same_block(*ref, b, *dst, b)) return false;
    return true;
  };
  const std::vector<int32_t> blocks = {0, 1, 2};
  v1::KvTransfer header;
  header.set_positions(40);
  runtime::Frames frames;
  pack_transfer(*src, blocks, {}, header, frames);

  auto expect_refused = [&](const v1::KvTransfer& h, std::span<const int32_t> dest, const runtime::Frames& f,
                            const std::string& words) {
    auto r = unpack_transfer(*dst, h, dest, {}, f);
    ASSERT_FALSE(r);
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
    EXPECT_TRUE(untouched());
  };
  const std::vector<int32_t> short_dest = {5, 6};
  expect_refused(header, short_dest, frames, "3 blocks");
  const std::vector<int32_t> outside = {5, 6, 99};
  expect_refused(header, outside, frames, "outside the pool");
  v1::KvTransfer other_format = header;
  other_format.set_region_block_bytes(1, other_format.region_block_bytes(1) / 2);
  const std::vector<int32_t> dest = {5, 6, 7};
  expect_refused(other_format, dest, frames, "KV format differs");
  runtime::Frames fewer;
  for (size_t i = 0; i + 1 < frames.size(); ++i) fewer.emplace_back(frames[i].data(), frames[i].size());
  expect_refused(header, dest, fewer, "frames");
  runtime::Frames cut;
  for (size_t i = 0; i < frames.size(); ++i) cut.emplace_back(frames[i].data(), frames[i].size() - (i == 3 ? 4 : 0));
  expect_refused(header, dest, cut, "bytes, expected");
  v1::KvTransfer wrong_runs = header;
  wrong_runs.set_run_blocks(0, 2);
  expect_refused(wrong_runs, dest, frames, "runs cover");
}

// Rotated KV: the header carries the scheme and the seed of the signs; a receiver of another
// scheme or seed refuses even where the bytes per block agree (the codes would mean other
// vectors), leaving its pool untouched, and a matching one takes the blocks as they are.
TEST(KvTransfer, ARotatedTransferNeedsTheSameSchemeAndSeed) {
  const model::ModelConfig config = tiny_config();
  const engine::KvFormat rot4{4, 64, false, 0, engine::KvScheme::kRotated};
  auto src = engine::KvPool::create(config, 16, 16, rot4).value();
  fill(*src, 5);
  const std::vector<int32_t> blocks = {0, 1, 2}, dest = {5, 6, 7};
  v1::KvTransfer header;
  header.set_positions(40);
  runtime::Frames frames;
  pack_transfer(*src, blocks, {}, header, frames);
  EXPECT_EQ(header.kv_quant_scheme(), v1::KV_QUANT_SCHEME_ROTATED);
  EXPECT_EQ(header.kv_rotation_seed(), engine::kKvRotationSeed);
  auto same = engine::KvPool::create(config, 16, 16, rot4).value();
  ASSERT_TRUE(unpack_transfer(*same, header, dest, {}, frames));
  for (size_t i = 0; i < blocks.size(); ++i) EXPECT_TRUE(same_block(*src, blocks[i], *same, dest[i])) << i;

  engine::KvFormat other_seed = rot4;
  other_seed.rotation_seed ^= 1;
  engine::KvFormat uniform = rot4;
  uniform.scheme = engine::KvScheme::kUniform;
  for (const auto& [format, words] :
       {std::pair{other_seed, "the transfer's codes are rotated (seed " + std::to_string(engine::kKvRotationSeed) +
                                  "), this pool's rotated (seed " + std::to_string(engine::kKvRotationSeed ^ 1) + ")"},
        std::pair{uniform, std::string("this pool's uniform")}}) {
    auto dst = engine::KvPool::create(config, 16, 16, format).value();
    fill(*dst, 6);
    v1::KvTransfer h = header;  // bytes per region made to agree: only the scheme or seed differs
    h.clear_region_block_bytes();
    for (uint32_t l = 0; l < dst->n_layers(); ++l) h.add_region_block_bytes(dst->region_block_bytes(l));
    auto r = unpack_transfer(*dst, h, dest, {}, frames);
    ASSERT_FALSE(r);
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
    auto ref = engine::KvPool::create(config, 16, 16, format).value();
    fill(*ref, 6);
    for (int32_t b = 0; b < 16; ++b) EXPECT_TRUE(same_block(*ref, b, *dst, b)) << b;
  }
}

// 8-bit KV with an F32 window: the sender's tail blocks follow its positions' blocks and
// land in the receiver's tail; a receiver whose format keeps no window refuses.
// The decode worker's KV socket drops a message over max_transfer_bytes (ZeroMQ counts 64
// bytes a frame besides its payload): the largest legitimate transfer, a whole context in
// blocks none of which are consecutive (a frame per block and region), with its tail and a
// token per position, fits it, and the bound is not much more than the blocks' bytes.
TEST(KvTransfer, TheLargestTransferFitsTheKvSocketsBound) {
  const model::ModelConfig config = tiny_config();
  auto pool = engine::KvPool::create(config, 128, 16, engine::KvFormat{8, 64}).value();
  const uint32_t context = config.context_length;
  const uint32_t blocks = transfer_blocks(context, pool->block_tokens());
  ASSERT_LE(2 * blocks + pool->tail_blocks(), pool->n_blocks());
  std::vector<int32_t> from, tail;
  for (uint32_t i = 0; i < blocks; ++i) from.push_back(static_cast<int32_t>(2 * i));  // no runs
  for (uint32_t i = 0; i < pool->tail_blocks(); ++i) tail.push_back(static_cast<int32_t>(2 * blocks + 2 * i + 1));
  v1::KvTransfer header;
  header.set_transfer_id(~uint64_t{0});
  header.set_nonce(~uint64_t{0});
  header.set_scheduler_epoch(~uint64_t{0});
  header.set_positions(context);
  header.set_tail_end(context);
  for (uint32_t i = 0; i < context; ++i) header.add_tokens(static_cast<int32_t>(config.vocab_size - 1));
  runtime::Frames frames;
  pack_transfer(*pool, from, tail, header, frames);
  uint64_t counted = 0;
  for (const zmq::message_t& f : frames) counted += f.size() + ZMQ_TANDEM_FRAME_OVERHEAD;
  const uint64_t bound = max_transfer_bytes(*pool, context);
  EXPECT_LE(counted, bound);
  EXPECT_LT(bound, counted + 64 * 1024) << "the bound is far above the largest transfer";
}

TEST(KvTransfer, TheTailTravelsWithTheBlocks) {
  const model::ModelConfig config = tiny_config();
  const engine::KvFormat q8{8, 64};
  auto src = engine::KvPool::create(config, 32, 16, q8).value();
  auto dst = engine::KvPool::create(config, 32, 16, q8).value();
  ASSERT_EQ(src->tail_blocks(), 6u);
  fill(*src, 5);
  fill(*dst, 6);
  const std::vector<int32_t> from = {3, 4}, from_tail = {20, 21, 22, 23, 24, 25};
  const std::vector<int32_t> to = {10, 12}, to_tail = {0, 30, 31, 5, 6, 7};
  v1::KvTransfer header;
  header.set_positions(16 + 7);
  header.set_tail_end(16 + 7);
  runtime::Frames frames;
  pack_transfer(*src, from, from_tail, header, frames);
  EXPECT_EQ(header.tail_blocks(), 6u);
  runtime::Frames got = round_trip(frames);
  v1::KvTransfer parsed;
  ASSERT_TRUE(runtime::parse_frame(got[0], parsed).is_ok());
  EXPECT_EQ(parsed.tail_end(), 23);

  auto no_tail = engine::KvPool::create(config, 32, 16, engine::KvFormat{8, 64, false, 0}).value();
  auto refused = unpack_transfer(*no_tail, parsed, to, {}, got);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.status().message().find("tail of 6 blocks"), std::string::npos) << refused.status().message();
  const std::vector<int32_t> short_tail = {0, 30, 31, 5, 6};
  EXPECT_FALSE(unpack_transfer(*dst, parsed, to, short_tail, got));
  v1::KvTransfer past_end = parsed;  // a tail claiming rows past the positions sent
  past_end.set_tail_end(24);
  auto bad_end = unpack_transfer(*dst, past_end, to, to_tail, got);
  ASSERT_FALSE(bad_end);
  EXPECT_NE(bad_end.status().message().find("tail_end 24 is outside [-1, 23]"), std::string::npos)
      << bad_end.status().message();

  auto copied = unpack_transfer(*dst, parsed, to, to_tail, got);
  ASSERT_TRUE(copied) << copied.status().to_string();
  EXPECT_EQ(*copied, 8 * src->block_bytes());
  for (size_t i = 0; i < from.size(); ++i) EXPECT_TRUE(same_block(*src, from[i], *dst, to[i])) << i;
  for (size_t i = 0; i < from_tail.size(); ++i) EXPECT_TRUE(same_block(*src, from_tail[i], *dst, to_tail[i])) << i;
}

// make-model's tiny `arch` file of `seed`, made in this process's temp folder.
std::string make_tiny(const std::string& arch, unsigned seed) {
  const std::string p = test::temp_dir() + "/kv-transfer-" + arch + ".gguf";
  const std::string cmd = std::string(TANDEM_TANDEM_BIN) + " make-model --arch " + arch + " --preset tiny --seed " +
                          std::to_string(seed) + " --out " + p + " 2>/dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return p;
}

// make-model's tiny gemma3 (window 32; five of its six layers windowed), made once.
model::ModelConfig gemma3_config() {
  static const std::string path = make_tiny("gemma3", 3);
  auto f = model::GgufFile::open(path);
  return model::read_model_config(**f).value();
}

// Block `ba` of `a` equals block `bb` of `b` in the full layers (ring false) or the ring layers.
bool same_part(engine::KvPool& a, uint32_t ba, engine::KvPool& b, uint32_t bb, bool ring) {
  for (uint32_t l = 0; l < a.n_layers(); ++l) {
    if (a.ring_layer(l) != ring) continue;
    for (uint32_t h = 0; h < a.n_kv_heads(); ++h)
      for (uint32_t kv = 0; kv < 2; ++kv)
        if (std::memcmp(a.block_data(l, h, kv, ba), b.block_data(l, h, kv, bb), a.region_block_bytes(l)) != 0)
          return false;
  }
  return true;
}

// Block `block` of `from` copied into `to`, in the full layers (ring false) or the ring layers.
void copy_part(engine::KvPool& from, engine::KvPool& to, int32_t block, bool ring) {
  for (uint32_t l = 0; l < from.n_layers(); ++l) {
    if (from.ring_layer(l) != ring) continue;
    for (uint32_t h = 0; h < from.n_kv_heads(); ++h)
      for (uint32_t kv = 0; kv < 2; ++kv)
        std::memcpy(to.block_data(l, h, kv, static_cast<uint32_t>(block)),
                    from.block_data(l, h, kv, static_cast<uint32_t>(block)), from.region_block_bytes(l));
  }
}

// Every block of both parts of `a` and `b` equal.
bool same_pool(engine::KvPool& a, engine::KvPool& b) {
  for (uint32_t i = 0; i < a.n_blocks(); ++i)
    if (!same_part(a, i, b, i, false)) return false;
  for (uint32_t i = 0; i < a.ring_blocks(); ++i)
    if (!same_part(a, i, b, i, true)) return false;
  return true;
}

// A sequence of `positions` handed over with rings: the sender's ring holds logical blocks
// 14 .. (ids scattered), the receiver's next query at `positions` needs blocks from
// (positions + 1 - 32) / 16 on.
struct RingHandoff {
  uint32_t positions;
  std::vector<int32_t> from, to, from_ring, to_ring;
  uint32_t sender_first, first;
};

RingHandoff ring_handoff(uint32_t positions, uint32_t full_blocks, uint32_t ring_blocks) {
  assert(ring_blocks >= 13);
  RingHandoff h{positions, {}, {}, {}, {}, 0, (positions + 1 - 32) / 16};
  const uint32_t n = transfer_blocks(positions, 16);
  h.sender_first = h.first - 2;  // the sender's last chunk reached back further
  for (uint32_t i = 0; i < n; ++i) {
    h.from.push_back(static_cast<int32_t>(i));
    h.to.push_back(static_cast<int32_t>((i * 7 + 3) % full_blocks));
  }
  for (uint32_t i = 0; i < n - h.sender_first; ++i)  // 10, 11, 12, 1, 2: the part sent is two runs
    h.from_ring.push_back(static_cast<int32_t>(i < 3 ? 10 + i : i - 2));
  for (uint32_t i = 0; i < n - h.first; ++i) h.to_ring.push_back(static_cast<int32_t>(ring_blocks - 1 - i));
  return h;
}

// Rings: a transfer carries the full layers' blocks of every position and, of the windowed
// layers, only the ring's blocks the receiver's next query needs, into the ring reserved there;
// every other block of both pools stays as it was. Printed: the bytes moved against a handoff of
// every layer's blocks, for a 300-token and a 4100-token prompt.
TEST(KvTransferRings, TheFullLayersBlocksAndTheReceiversWindowArriveExactly) {
  const model::ModelConfig config = gemma3_config();
  ASSERT_EQ(config.sliding_window, 32u);
  for (const uint32_t positions : {300u, 4100u}) {
    const uint32_t full = transfer_blocks(positions, 16) + 8, rings = 16;
    auto src = engine::KvPool::create(config, full, 16, {}, rings).value();
    auto dst = engine::KvPool::create(config, full, 16, {}, rings).value();
    auto ref = engine::KvPool::create(config, full, 16, {}, rings).value();
    fill(*src, 1);
    fill(*dst, 2);
    fill(*ref, 2);
    const RingHandoff h = ring_handoff(positions, full, rings);
    v1::KvTransfer header;
    header.set_positions(positions);
    runtime::Frames frames;
    const auto sent = std::span<const int32_t>(h.from_ring).subspan(h.first - h.sender_first);
    pack_transfer(*src, h.from, {}, header, frames, TransferRing{sent, h.first, 32});
    EXPECT_EQ(header.ring_window(), 32u);
    EXPECT_EQ(header.ring_run_blocks_size(), 2) << "12, then 1 and 2";
    EXPECT_EQ(header.ring_first(), h.first);
    runtime::Frames got = round_trip(frames);
    v1::KvTransfer parsed;
    ASSERT_TRUE(runtime::parse_frame(got[0], parsed).is_ok());
    auto copied = unpack_transfer(*dst, parsed, h.to, {}, got, TransferRing{h.to_ring, h.first, 32});
    ASSERT_TRUE(copied) << copied.status().to_string();
    ASSERT_EQ(h.to_ring.size(), 3u) << "blocks (positions - 31) / 16 .. the positions' last";
    EXPECT_EQ(*copied, h.from.size() * src->block_bytes() + h.to_ring.size() * src->ring_block_bytes());
    for (size_t i = 0; i < h.from.size(); ++i) EXPECT_TRUE(same_part(*src, h.from[i], *dst, h.to[i], false)) << i;
    for (size_t i = 0; i < h.to_ring.size(); ++i) EXPECT_TRUE(same_part(*src, sent[i], *dst, h.to_ring[i], true)) << i;
    // Nothing else changed: with the written blocks put back, the pool is the reference.
    for (int32_t b : h.to) copy_part(*ref, *dst, b, false);
    for (int32_t b : h.to_ring) copy_part(*ref, *dst, b, true);
    EXPECT_TRUE(same_pool(*dst, *ref));
    const uint64_t all_layers = uint64_t{h.from.size()} * engine::KvPool::bytes_per_block(config);
    std::printf(
        "rings handoff of %u positions: %llu bytes (full layers %zu blocks + ring %zu blocks), every layer's "
        "blocks %llu bytes: %.1f %%\n",
        positions, (unsigned long long)*copied, h.from.size(), h.to_ring.size(), (unsigned long long)all_layers,
        100.0 * double(*copied) / double(all_layers));
  }
}

// Both sides must keep rings of the same window, and the ring sent must be the ring reserved:
// each mismatch is refused naming it, with the receiving pool untouched.
TEST(KvTransferRings, MismatchesAreRefusedAndThePoolIsUntouched) {
  const model::ModelConfig config = gemma3_config();
  auto src = engine::KvPool::create(config, 32, 16, {}, 16).value();
  auto plain_src = engine::KvPool::create(config, 32, 16).value();
  fill(*src, 3);
  fill(*plain_src, 3);
  const RingHandoff h = ring_handoff(300, 32, 16);
  const auto sent = std::span<const int32_t>(h.from_ring).subspan(h.first - h.sender_first);
  v1::KvTransfer header, plain_header;
  header.set_positions(300);
  plain_header.set_positions(300);
  runtime::Frames frames, plain_frames;
  pack_transfer(*src, h.from, {}, header, frames, TransferRing{sent, h.first, 32});
  pack_transfer(*plain_src, h.from, {}, plain_header, plain_frames);
  struct Case {
    uint32_t ring_blocks, window;
    const v1::KvTransfer* header;
    const runtime::Frames* frames;
    std::vector<int32_t> ring;
    std::string words;
  };
  std::vector<int32_t> short_ring(h.to_ring.begin(), h.to_ring.end() - 1), outside = h.to_ring;
  outside.back() = 16;
  runtime::Frames cut;
  for (size_t i = 0; i < frames.size(); ++i)
    cut.emplace_back(frames[i].data(), frames[i].size() - (i + 1 == frames.size() ? 4 : 0));
  for (const Case& c : std::vector<Case>{
           {0,
            0,
            &header,
            &frames,
            {},
            "KV rings differ: the sending worker keeps rings of window 32, this "
            "worker no rings (--kv-rings on both prefill and decode workers"},
           {16, 32, &plain_header, &plain_frames, h.to_ring,
            "the sending worker keeps no rings, this worker rings of window 32"},
           {16, 48, &header, &frames, h.to_ring, "rings of window 32, this worker rings of window 48"},
           {16, 32, &header, &frames, short_ring,
            "transfer's ring is 3 blocks from logical block 16, the ring reserved here 2 blocks from logical block 16"},
           {16, 32, &header, &frames, outside, "reserved ring block 16 is outside the ring pool of 16"},
           {16, 32, &header, &cut, h.to_ring, "bytes, expected"},
       }) {
    auto dst = engine::KvPool::create(config, 32, 16, {}, c.ring_blocks).value();
    auto ref = engine::KvPool::create(config, 32, 16, {}, c.ring_blocks).value();
    fill(*dst, 4);
    fill(*ref, 4);
    auto r = unpack_transfer(*dst, *c.header, h.to, {}, *c.frames, TransferRing{c.ring, h.first, c.window});
    ASSERT_FALSE(r) << c.words;
    EXPECT_NE(r.status().message().find(c.words), std::string::npos) << r.status().message();
    EXPECT_TRUE(same_pool(*dst, *ref)) << c.words;
  }
}

// The KV socket's bound covers a transfer with rings: every position's full-layer blocks and the
// whole ring pool, none consecutive.
TEST(KvTransferRings, TheLargestTransferFitsTheKvSocketsBound) {
  const model::ModelConfig config = gemma3_config();
  const uint32_t context = config.context_length, blocks = transfer_blocks(context, 16);
  auto pool = engine::KvPool::create(config, 2 * blocks, 16, {}, 16).value();
  std::vector<int32_t> from, ring;
  for (uint32_t i = 0; i < blocks; ++i) from.push_back(static_cast<int32_t>(2 * i));
  for (uint32_t i = 0; i < 16; i += 2) ring.push_back(static_cast<int32_t>(i));
  v1::KvTransfer header;
  header.set_positions(context);
  for (uint32_t i = 0; i < context; ++i) header.add_tokens(static_cast<int32_t>(config.vocab_size - 1));
  runtime::Frames frames;
  pack_transfer(*pool, from, {}, header, frames, TransferRing{ring, blocks - 8, 32});
  uint64_t counted = 0;
  for (const zmq::message_t& f : frames) counted += f.size() + ZMQ_TANDEM_FRAME_OVERHEAD;
  EXPECT_LE(counted, max_transfer_bytes(*pool, context));
}

}  // namespace
}  // namespace tandem::worker

namespace tandem::worker {
namespace {

std::string hybrid_model() {
  static const std::string path = make_tiny("qwen35", 6);
  return path;
}

// Two workers' engines for one hybrid model: a KV pool and a state pool each.
struct HybridSide {
  std::unique_ptr<engine::KvPool> kv;
  std::unique_ptr<engine::StatePool> states;
};
HybridSide hybrid_side(const engine::Engine& e, uint32_t blocks, uint32_t slots, uint32_t rollback = 0) {
  return {engine::KvPool::create(e.config(), blocks).value(),
          engine::StatePool::create(e.config(), slots, rollback).value()};
}

// Feeds tokens [from, to) of `tokens` as one chunk of the sequence in `slot` and `blocks`:
// the logits of its last position.
std::vector<float> feed(engine::Engine& e, HybridSide& side, std::span<const int32_t> tokens, uint32_t from,
                        uint32_t to, std::span<const int32_t> blocks, int32_t slot) {
  engine::SeqStep s{tokens.subspan(from, to - from), from, blocks, 1};
  s.state_slot = slot;
  const Status st = e.forward({&s, 1}, *side.kv, side.states.get());
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return {e.logits(0).begin(), e.logits(0).end()};
}

std::vector<int32_t> ids_from(int32_t first, int32_t n, int32_t step = 1) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) out.push_back(first + i * step);
  return out;
}

// Packs the sequence in `slot`/`blocks` of `side` at `positions` as a prefill worker does.
runtime::Frames pack_hybrid(HybridSide& side, uint32_t slot, std::span<const int32_t> blocks, uint32_t positions,
                            v1::KvTransfer& header) {
  header.set_positions(positions);
  auto state = pack_state(*side.states, slot, header);
  EXPECT_TRUE(state) << state.status().to_string();
  runtime::Frames frames;
  pack_transfer(*side.kv, blocks, {}, header, frames);
  frames.push_back(std::move(*state));
  return frames;
}

// A prompt of 37, 64, 100, 130 or 480 tokens (off, on and across the 64-token grid; 480 near the
// model's 512 positions, where a transfer is its largest and must fit the KV socket's bound)
// prefilled on one side, handed over into other blocks and another slot, and decoded there to
// position 500: each
// decode step's logits are bitwise those of the sequence decoded where it was prefilled (in
// chunks of 7 there: the cut does not matter either), and the slot arrives byte for byte. A
// receiver whose slots keep older conv inputs for speculative rollbacks (a decode worker with
// --spec-tokens 4; the prefill worker keeps none) continues bitwise too.
TEST(KvTransferState, AHandedOverSequenceContinuesBitwiseAsIfItNeverMoved) {
  auto e = engine::Engine::load(hybrid_model(), {1, engine::GemmBackend::kPacked}).value();
  constexpr uint32_t kEnd = 500;
  const std::vector<int32_t> tokens = test::random_tokens(kEnd, e->config().vocab_size, 8);
  HybridSide src = hybrid_side(*e, 128, 3), dst = hybrid_side(*e, 128, 4), dst_spec = hybrid_side(*e, 128, 4, 4);
  const std::vector<int32_t> here = ids_from(0, 32), sent = ids_from(32, 32), there = ids_from(127, 32, -3);
  // Unpacks `got` into slot 2 of `to` and decodes there to kEnd: the logits of every step.
  auto decode_there = [&](HybridSide& to, const runtime::Frames& got, uint32_t prompt) {
    v1::KvTransfer parsed;
    EXPECT_TRUE(runtime::parse_frame(got[0], parsed).is_ok());
    auto state = unpack_state(to.states.get(), 2, parsed, got);
    EXPECT_TRUE(state) << state.status().to_string();
    if (state) EXPECT_EQ(*state, src.states->slot_floats() * sizeof(float));
    EXPECT_TRUE(unpack_transfer(*to.kv, parsed, there, {}, got)) << "prompt " << prompt;
    EXPECT_EQ(to.states->position(2), prompt);
    if (to.states->slot_floats() == src.states->slot_floats())  // the same layout: byte for byte
      EXPECT_EQ(std::memcmp(to.states->slot(2).data(), src.states->slot(1).data(), to.states->slot_floats() * 4), 0)
          << "prompt " << prompt;
    std::vector<float> moved;
    for (uint32_t p = prompt; p < kEnd; ++p) {
      const std::vector<float> row = feed(*e, to, tokens, p, p + 1, there, 2);
      moved.insert(moved.end(), row.begin(), row.end());
    }
    return moved;
  };
  for (uint32_t prompt : {37u, 64u, 100u, 130u, 480u}) {
    std::vector<float> want;  // decoded where it was prefilled, prompt in chunks of 7
    for (uint32_t p = 0; p < prompt; p = std::min(prompt, p + 7))
      (void)feed(*e, src, tokens, p, std::min(prompt, p + 7), here, 0);
    for (uint32_t p = prompt; p < kEnd; ++p) {
      const std::vector<float> row = feed(*e, src, tokens, p, p + 1, here, 0);
      want.insert(want.end(), row.begin(), row.end());
    }
    (void)feed(*e, src, tokens, 0, prompt, sent, 1);
    v1::KvTransfer header;
    runtime::Frames frames = pack_hybrid(src, 1, sent, prompt, header);
    uint64_t counted = 0;
    for (const zmq::message_t& f : frames) counted += f.size() + ZMQ_TANDEM_FRAME_OVERHEAD;
    EXPECT_LE(counted, max_transfer_bytes(*dst.kv, e->config().context_length) + max_state_bytes(dst.states.get()));
    runtime::Frames got = round_trip(frames);
    v1::KvTransfer header_again;  // the same slot packed again (a send empties the frames)
    runtime::Frames frames_again = pack_hybrid(src, 1, sent, prompt, header_again);
    runtime::Frames again = round_trip(frames_again);
    const std::vector<float> moved = decode_there(dst, got, prompt);
    ASSERT_EQ(moved.size(), want.size());
    EXPECT_EQ(std::memcmp(moved.data(), want.data(), want.size() * sizeof(float)), 0) << "prompt " << prompt;
    const std::vector<float> spec = decode_there(dst_spec, again, prompt);
    ASSERT_EQ(spec.size(), want.size());
    EXPECT_EQ(std::memcmp(spec.data(), want.data(), want.size() * sizeof(float)), 0)
        << "prompt " << prompt << ", a receiver keeping 4 older conv inputs";
  }
}

// Every mismatch of the state is refused, naming it, with the receiving slot untouched.
TEST(KvTransferState, MismatchesAreRefusedAndTheSlotIsUntouched) {
  auto e = engine::Engine::load(hybrid_model(), {1, engine::GemmBackend::kPacked}).value();
  const std::vector<int32_t> tokens = test::random_tokens(40, e->config().vocab_size, 9);
  HybridSide src = hybrid_side(*e, 8, 1), dst = hybrid_side(*e, 8, 2);
  const std::vector<int32_t> blocks = ids_from(0, 3);
  (void)feed(*e, src, tokens, 0, 40, blocks, 0);
  v1::KvTransfer header;
  v1::KvTransfer past = header;
  past.set_positions(41);
  auto ahead = pack_state(*src.states, 0, past);
  ASSERT_FALSE(ahead);
  EXPECT_NE(ahead.status().message().find("state is at position 40, the handoff sends 41"), std::string::npos)
      << ahead.status().message();
  const runtime::Frames frames = pack_hybrid(src, 0, blocks, 40, header);
  for (size_t i = 0; i < dst.states->slot_floats(); ++i) dst.states->slot(1)[i] = 0.25f * static_cast<float>(i % 7);
  dst.states->set_position(1, 5);
  const std::vector<float> before(dst.states->slot(1).begin(), dst.states->slot(1).end());
  auto refused = [&](engine::StatePool* states, int32_t slot, const v1::KvTransfer& h, const runtime::Frames& f,
                     const std::string& words) {
    auto r = unpack_state(states, slot, h, f);
    ASSERT_FALSE(r) << words;
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
    EXPECT_TRUE(std::equal(before.begin(), before.end(), dst.states->slot(1).begin())) << words;
    EXPECT_EQ(dst.states->position(1), 5u) << words;
  };
  v1::KvTransfer fewer = header;
  fewer.set_state_floats(header.state_floats() - 1);
  refused(dst.states.get(), 1, fewer, frames, "holds " + std::to_string(header.state_floats() - 1) + " floats");
  v1::KvTransfer layout = header;  // the same floats cut otherwise: 2 V heads of 4 Q/K heads' keys
  layout.set_state_layout(4, header.state_layout(5));
  layout.set_state_layout(5, header.state_layout(4));
  refused(dst.states.get(), 1, layout, frames, "recurrent state layout differs: the transfer's is [3, 3, ");
  v1::KvTransfer position = header;
  position.set_state_position(39);
  refused(dst.states.get(), 1, position, frames, "recurrent state is at position 39, its KV at 40");
  runtime::Frames cut;
  for (const zmq::message_t& f : frames) cut.emplace_back(f.data(), f.size() - (&f == &frames.back() ? 4 : 0));
  refused(dst.states.get(), 1, header, cut, "state frame has");
  v1::KvTransfer none = header;
  none.clear_state_floats();
  refused(dst.states.get(), 1, none, frames, "carries no recurrent state");
  refused(nullptr, -1, header, frames, "this worker keeps none");
  refused(dst.states.get(), -1, header, frames, "no state slot");
  EXPECT_TRUE(unpack_state(dst.states.get(), 1, header, frames)) << "the transfer itself is fine";
}

}  // namespace
}  // namespace tandem::worker
