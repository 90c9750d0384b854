#include "workers/engine/kv_cache.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "workers/engine/kernels_scalar.h"

namespace tandem::engine {

Status KvFormat::validate_values() const {
  if (rotated() && bits != 4 && bits != 3)
    return Status::invalid("the rotated KV scheme needs 4 or 3 bits per element, got " + std::to_string(bits) +
                           (bits == 0 ? " (F32 KV has no scheme: use the uniform one)" : ""));
  if (!rotated() && bits != 0 && bits != 8 && bits != 4)
    return Status::invalid("KV bits must be 0 (f32), 8 or 4, got " + std::to_string(bits) +
                           (bits == 3 ? " (3 bits only with the rotated scheme)" : ""));
  if (group_size != 32 && group_size != 64 && group_size != 128)
    return Status::invalid("KV group size must be 32, 64 or 128, got " + std::to_string(group_size));
  if (f32_window > 2)
    return Status::invalid("KV F32 window must be 0, 1 or 2 blocks, got " + std::to_string(f32_window));
  return Status::ok();
}

Status KvFormat::validate(const ModelConfig& config) const {
  TANDEM_RETURN_IF_ERROR(validate_values());
  const uint32_t hd = config.head_dim();
  if (rotated()) return kv_rotation::check_head_dim(hd);
  if (bits != 0 && hd % effective_group(hd) != 0)
    return Status::invalid("KV group size " + std::to_string(group_size) + " does not divide the head dimension " +
                           std::to_string(hd));
  return Status::ok();
}

std::string KvFormat::to_string() const {
  if (bits == 0) return "f32";
  if (rotated())
    return "rot" + std::to_string(bits) + (skip_last_layer ? "+f32-last" : "") +
           (f32_window == 2 ? "" : "+w" + std::to_string(f32_window));
  return "q" + std::to_string(bits) + "/g" + std::to_string(group_size) + (skip_last_layer ? "+f32-last" : "") +
         (f32_window == 2 ? "" : "+w" + std::to_string(f32_window));
}

QuantParams quantize_group(const float* x, uint32_t n, uint32_t bits, uint8_t* codes) {
  float mn = x[0], mx = x[0];
  for (uint32_t i = 1; i < n; ++i) mn = std::min(mn, x[i]), mx = std::max(mx, x[i]);
  const uint32_t levels = (1u << bits) - 1;
  // In double: max - min of two floats can overflow float.
  const double range = static_cast<double>(mx) - mn;
  QuantParams p{0.0f, mn};
  if (range == 0) {  // constant group: exact with every code 0, no division
    std::memset(codes, 0, n);
    return p;
  }
  p.scale = std::max(static_cast<float>(range / levels), std::numeric_limits<float>::denorm_min());
  for (uint32_t i = 0; i < n; ++i) {
    const double c = std::nearbyint((static_cast<double>(x[i]) - mn) / p.scale);
    codes[i] = c >= 0 ? static_cast<uint8_t>(std::min(c, static_cast<double>(levels))) : 0;  // NaN: 0
  }
  return p;
}

size_t region_block_bytes(uint32_t head_dim, uint32_t block_tokens, uint32_t bits, uint32_t group, KvScheme scheme) {
  const size_t cells = size_t{head_dim} * block_tokens;
  if (bits == 0) return cells * sizeof(float);
  if (scheme == KvScheme::kRotated) return cells * bits / 8 + size_t{block_tokens} * sizeof(float);
  return cells * bits / 8 + 2 * size_t{head_dim / group} * block_tokens * sizeof(float);
}

Result<std::unique_ptr<KvPool>> KvPool::create(const ModelConfig& config, uint32_t n_blocks, uint32_t block_tokens,
                                               const KvFormat& format, uint32_t ring_blocks) {
  if (block_tokens == 0 || block_tokens % 16 != 0)
    return Status::invalid("KV block size " + std::to_string(block_tokens) +
                           " tokens is not a positive multiple of 16");
  if (n_blocks == 0) return Status::invalid("KV pool needs at least one block");
  TANDEM_RETURN_IF_ERROR(format.validate(config));
  auto pool = std::unique_ptr<KvPool>(new KvPool());
  pool->format_ = format;
  pool->n_blocks_ = n_blocks;
  pool->block_tokens_ = block_tokens;
  pool->n_layers_ = config.n_layers;
  pool->n_kv_heads_ = config.n_kv_heads;
  pool->head_dim_ = config.head_dim();
  pool->f32_region_block_ = engine::region_block_bytes(pool->head_dim_, block_tokens, 0, 1);
  pool->quant_region_block_ = format.bits ? engine::region_block_bytes(pool->head_dim_, block_tokens, format.bits,
                                                                       pool->group_size(), format.scheme)
                                          : 0;
  if (format.rotated()) {
    pool->levels_ = kv_rotation::levels(pool->head_dim_, format.bits);
    if (!pool->levels_)
      return Status::invalid("no rotated KV level table for head dimension " + std::to_string(pool->head_dim_) +
                             " and " + std::to_string(format.bits) + " bits");
    pool->signs_.resize(size_t{config.n_layers} * 2 * pool->head_dim_);
    for (uint32_t l = 0; l < config.n_layers; ++l)
      for (uint32_t kv = 0; kv < 2; ++kv)
        kv_rotation::signs(format.rotation_seed, l, kv,
                           std::span(pool->signs_).subspan((size_t{l} * 2 + kv) * pool->head_dim_, pool->head_dim_));
  }
  pool->tail_blocks_ = tail_blocks_for(config, block_tokens, format);
  if (pool->tail_blocks_)
    pool->tail_rows_ = static_cast<uint32_t>(pool->quant_region_block_ / (pool->head_dim_ * sizeof(float)));
  TANDEM_RETURN_IF_ERROR(pool->lay_out_rings(config, ring_blocks));
  size_t offset = 0;
  pool->recurrent_.assign(config.n_layers, 0);
  for (uint32_t l = 0; l < config.n_layers; ++l) {
    pool->layer_offset_.push_back(offset);
    pool->recurrent_[l] = config.is_recurrent(l) ? 1 : 0;
    if (config.is_recurrent(l)) continue;  // a hybrid's recurrent layer keeps its state in a StatePool
    const size_t region = 2 * size_t{config.n_kv_heads} * pool->region_block_bytes(l);
    offset += pool->layer_blocks_[l] * region;
    (pool->ring_layer_[l] ? pool->ring_block_bytes_ : pool->block_bytes_) += region;
  }
  const size_t bytes = offset;
  // Huge pages where the kernel offers them (huge_pages.h): attention walks this memory in
  // long runs. Anonymous pages come zeroed, so lanes past a sequence's last key hold finite
  // values (codes 0, scale 0, bias 0) without a memset of the whole pool.
  const auto cannot = [&](const char* what) {
    return Status::error(Code::kUnavailable, "cannot " + std::string(what) + " " + std::to_string(bytes) +
                                                 " bytes of KV cache: " + std::strerror(errno));
  };
  pool->data_ = map_huge(bytes);
  if (!pool->data_) return cannot("map");
  uint8_t* p = pool->data_.get();
  const size_t rounded = pool->data_.get_deleter().bytes;
  // Committed now, not by the first steps that touch it: a worker whose KV does not fit
  // fails at start with this error, not later by the OOM killer, and no step pays the faults.
  if (madvise(p, rounded, MADV_POPULATE_WRITE) != 0) {
    if (errno != EINVAL) return cannot("commit");
    for (size_t i = 0; i < rounded; i += 4096) reinterpret_cast<volatile uint8_t*>(p)[i] = 0;  // kernels before 5.14
  }
  return pool;
}

Status KvPool::lay_out_rings(const ModelConfig& config, uint32_t ring_blocks) {
  ring_blocks_ = ring_blocks;
  layer_blocks_.assign(config.n_layers, n_blocks_);
  ring_layer_.assign(config.n_layers, 0);
  if (ring_blocks == 0) return Status::ok();
  if (tail_blocks_ != 0)
    return Status::invalid("KV rings cannot keep the F32 window tail: use --kv-f32-window 0 or F32 KV");
  bool windowed = false;
  for (uint32_t l = 0; l < config.n_layers; ++l) {
    if (config.window(l) == 0 || config.is_recurrent(l)) continue;
    ring_layer_[l] = 1;
    layer_blocks_[l] = ring_blocks;
    windowed = true;
  }
  if (!windowed) return Status::invalid("KV rings need a model with sliding-window layers; this one has none");
  return Status::ok();
}

size_t KvPool::bytes_per_block(const ModelConfig& config, uint32_t block_tokens, const KvFormat& format,
                               bool windowed_only) {
  const uint32_t hd = config.head_dim();
  size_t total = 0;
  for (uint32_t l = 0; l < config.n_layers; ++l)
    if (!config.is_recurrent(l) && (!windowed_only || config.window(l) > 0))
      total += 2 * size_t{config.n_kv_heads} *
               engine::region_block_bytes(hd, block_tokens, format.layer_bits(l, config.n_layers),
                                          format.effective_group(hd), format.scheme);
  return total;
}

uint32_t KvPool::tail_blocks_for(const ModelConfig& config, uint32_t block_tokens, const KvFormat& format) {
  bool quantized = false;
  for (uint32_t l = 0; l < config.n_layers; ++l) quantized |= format.layer_bits(l, config.n_layers) != 0;
  if (!quantized || format.f32_window == 0) return 0;
  const uint32_t hd = config.head_dim();
  // A quantized region block holds at least 3 block_tokens / 32 rows (bits >= 3: codes alone
  // take 3 hd * block_tokens / 8 bytes), so a tail is at most a few blocks.
  const size_t rows =
      engine::region_block_bytes(hd, block_tokens, format.bits, format.effective_group(hd), format.scheme) /
      (size_t{hd} * sizeof(float));
  return static_cast<uint32_t>((size_t{format.f32_window} * block_tokens + rows - 1) / rows);
}

uint32_t KvPool::blocks_for_bytes(const ModelConfig& config, size_t bytes, uint32_t block_tokens,
                                  const KvFormat& format) {
  const size_t per_block = bytes_per_block(config, block_tokens, format);
  return per_block == 0 ? 0 : static_cast<uint32_t>(std::min<size_t>(bytes / per_block, UINT32_MAX));
}

namespace {

void put_code(uint8_t* row, uint32_t i, uint32_t bits, uint8_t code) {
  if (bits == 8) {
    row[i] = code;
  } else {
    uint8_t& b = row[i / 2];
    b = (i % 2) ? static_cast<uint8_t>((b & 0x0F) | (code << 4)) : static_cast<uint8_t>((b & 0xF0) | code);
  }
}

// Code i of a rotated row of n codes (kv_cache.h: 4 bits as put_code, 3 bits as bit planes).
void put_rotated_code(uint8_t* row, uint32_t i, uint32_t n, uint32_t bits, uint8_t code) {
  if (bits == 4) return put_code(row, i, 4, code);
  for (uint32_t b = 0; b < 3; ++b) {
    uint8_t& byte = row[size_t{b} * n / 8 + i / 8];
    const auto bit = static_cast<uint8_t>(1u << (i % 8));
    byte = (code >> b) & 1 ? static_cast<uint8_t>(byte | bit) : static_cast<uint8_t>(byte & ~bit);
  }
}

}  // namespace

void KvPool::write(uint32_t layer, uint32_t kv_head, uint32_t block, uint32_t slot, const float* k, const float* v) {
  const uint32_t hd = head_dim_, bt = block_tokens_, bits = layer_bits(layer);
  uint8_t* kb = block_data(layer, kv_head, 0, block);
  uint8_t* vb = block_data(layer, kv_head, 1, block);
  if (bits == 0) {
    float* kd = reinterpret_cast<float*>(kb);
    for (uint32_t d = 0; d < hd; ++d) kd[size_t{d} * bt + slot] = k[d];
    std::memcpy(reinterpret_cast<float*>(vb) + size_t{slot} * hd, v, hd * sizeof(float));
    return;
  }
  if (format_.rotated()) return write_rotated(layer, kb, vb, slot, bits, k, v);
  write_uniform(kb, vb, slot, bits, k, v);
}

void KvPool::write_rotated(uint32_t layer, uint8_t* kb, uint8_t* vb, uint32_t slot, uint32_t bits, const float* k,
                           const float* v) {
  const uint32_t hd = head_dim_, bt = block_tokens_;
  const size_t code_bytes = size_t{hd} * bt * bits / 8;
  uint8_t codes[256];  // head_dim <= 256 (kv_rotation::check_head_dim)
  float scratch[256];
  const float norm_k = kv_rotation::quantize({k, hd}, {rotation_signs(layer, 0), hd}, *levels_, codes, scratch);
  for (uint32_t d = 0; d < hd; ++d) put_rotated_code(kb + size_t{d} * bt * bits / 8, slot, bt, bits, codes[d]);
  reinterpret_cast<float*>(kb + code_bytes)[slot] = norm_k;
  const float norm_v = kv_rotation::quantize({v, hd}, {rotation_signs(layer, 1), hd}, *levels_, codes, scratch);
  uint8_t* row = vb + size_t{slot} * hd * bits / 8;
  for (uint32_t d = 0; d < hd; ++d) put_rotated_code(row, d, hd, bits, codes[d]);
  reinterpret_cast<float*>(vb + code_bytes)[slot] = norm_v;
}

void KvPool::write_uniform(uint8_t* kb, uint8_t* vb, uint32_t slot, uint32_t bits, const float* k, const float* v) {
  const uint32_t hd = head_dim_, bt = block_tokens_;
  const uint32_t g_size = group_size(), groups = hd / g_size;
  const size_t code_bytes = size_t{hd} * bt * bits / 8;
  uint8_t codes[256];  // head_dim <= 256 (Engine::load)
  // K: codes transposed, parameters [group][token].
  float* ks = reinterpret_cast<float*>(kb + code_bytes);
  float* kbias = ks + size_t{groups} * bt;
  for (uint32_t g = 0; g < groups; ++g) {
    const QuantParams p = quantize_group(k + g * g_size, g_size, bits, codes);
    for (uint32_t i = 0; i < g_size; ++i) put_code(kb + size_t{g * g_size + i} * bt * bits / 8, slot, bits, codes[i]);
    ks[size_t{g} * bt + slot] = p.scale;
    kbias[size_t{g} * bt + slot] = p.bias;
  }
  // V: one row of codes per token, parameters [token][group].
  uint8_t* row = vb + size_t{slot} * hd * bits / 8;
  float* vs = reinterpret_cast<float*>(vb + code_bytes);
  float* vbias = vs + size_t{bt} * groups;
  for (uint32_t g = 0; g < groups; ++g) {
    const QuantParams p = quantize_group(v + g * g_size, g_size, bits, codes);
    for (uint32_t i = 0; i < g_size; ++i) put_code(row, g * g_size + i, bits, codes[i]);
    vs[size_t{slot} * groups + g] = p.scale;
    vbias[size_t{slot} * groups + g] = p.bias;
  }
}

void KvPool::read(uint32_t layer, uint32_t kv_head, uint32_t block, uint32_t slot, float* k, float* v) const {
  const uint32_t hd = head_dim_, bt = block_tokens_, bits = layer_bits(layer);
  const uint8_t* kb = block_data(layer, kv_head, 0, block);
  const uint8_t* vb = block_data(layer, kv_head, 1, block);
  if (bits == 0) {
    const float* kd = reinterpret_cast<const float*>(kb);
    for (uint32_t d = 0; d < hd; ++d) k[d] = kd[size_t{d} * bt + slot];
    std::memcpy(v, reinterpret_cast<const float*>(vb) + size_t{slot} * hd, hd * sizeof(float));
    return;
  }
  if (format_.rotated()) return read_rotated(layer, kb, vb, slot, bits, k, v);
  const uint32_t g_size = group_size(), groups = hd / g_size;
  const size_t code_bytes = size_t{hd} * bt * bits / 8;
  auto code = [bits](const uint8_t* row, uint32_t i) { return static_cast<float>(kernels::code_at(row, i, bits)); };
  const float* ks = reinterpret_cast<const float*>(kb + code_bytes);
  const float* kbias = ks + size_t{groups} * bt;
  for (uint32_t d = 0; d < hd; ++d) {
    const uint32_t g = d / g_size;
    k[d] =
        std::fma(ks[size_t{g} * bt + slot], code(kb + size_t{d} * bt * bits / 8, slot), kbias[size_t{g} * bt + slot]);
  }
  const uint8_t* row = vb + size_t{slot} * hd * bits / 8;
  const float* vs = reinterpret_cast<const float*>(vb + code_bytes);
  const float* vbias = vs + size_t{bt} * groups;
  for (uint32_t d = 0; d < hd; ++d) {
    const uint32_t g = d / g_size;
    v[d] = std::fma(vs[size_t{slot} * groups + g], code(row, d), vbias[size_t{slot} * groups + g]);
  }
}

void KvPool::read_rotated(uint32_t layer, const uint8_t* kb, const uint8_t* vb, uint32_t slot, uint32_t bits, float* k,
                          float* v) const {
  const uint32_t hd = head_dim_, bt = block_tokens_;
  const size_t code_bytes = size_t{hd} * bt * bits / 8;
  uint8_t codes[256];
  float y[256];
  for (uint32_t d = 0; d < hd; ++d)
    codes[d] = static_cast<uint8_t>(kernels::rotated_code_at(kb + size_t{d} * bt * bits / 8, slot, bt, bits));
  kv_rotation::dequantize({codes, hd}, reinterpret_cast<const float*>(kb + code_bytes)[slot], *levels_, {y, hd});
  kv_rotation::unrotate_row({y, hd}, {rotation_signs(layer, 0), hd}, {k, hd});
  const uint8_t* row = vb + size_t{slot} * hd * bits / 8;
  for (uint32_t d = 0; d < hd; ++d) codes[d] = static_cast<uint8_t>(kernels::rotated_code_at(row, d, hd, bits));
  kv_rotation::dequantize({codes, hd}, reinterpret_cast<const float*>(vb + code_bytes)[slot], *levels_, {y, hd});
  kv_rotation::unrotate_row({y, hd}, {rotation_signs(layer, 1), hd}, {v, hd});
}

BlockAllocator::BlockAllocator(uint32_t n_blocks) : used_(n_blocks, 0), n_free_(n_blocks) {}

bool BlockAllocator::ensure(std::vector<int32_t>& table, uint32_t tokens, uint32_t block_tokens) {
  const size_t need = (tokens + block_tokens - 1) / block_tokens;
  if (need <= table.size()) return true;
  if (need - table.size() > n_free_) return false;
  while (table.size() < need) {
    uint32_t id;
    const int64_t after = table.empty() ? -1 : int64_t{table.back()} + 1;
    if (after >= 0 && after < static_cast<int64_t>(used_.size()) && !used_[after]) {
      id = static_cast<uint32_t>(after);
    } else {
      while (used_[lowest_free_]) ++lowest_free_;
      id = lowest_free_;
    }
    used_[id] = 1;
    --n_free_;
    table.push_back(static_cast<int32_t>(id));
  }
  return true;
}

void BlockAllocator::release(std::vector<int32_t>& table) {
  for (int32_t id : table) {
    used_[id] = 0;
    lowest_free_ = std::min(lowest_free_, static_cast<uint32_t>(id));
  }
  n_free_ += static_cast<uint32_t>(table.size());
  table.clear();
}

}  // namespace tandem::engine
