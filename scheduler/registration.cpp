#include "scheduler/registration.h"

#include <fstream>
#include <sstream>

namespace tandem::scheduler {

namespace {

constexpr uint32_t kMaxBlocks = 1u << 24;  // block ids travel as int32_t; beyond, not a worker

// "tcp://HOST:PORT" -> HOST (brackets of an IPv6 literal removed); nullopt for another form.
std::optional<std::string> tcp_host(const std::string& endpoint) {
  if (endpoint.rfind("tcp://", 0) != 0) return std::nullopt;
  const std::string rest = endpoint.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) return std::nullopt;
  std::string host = rest.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

bool loopback(const std::string& host) { return host.rfind("127.", 0) == 0 || host == "::1" || host == "localhost"; }

}  // namespace

uint64_t min_kv_bytes_per_token(const model::ModelConfig& config) {
  // K and V of every attention layer's KV heads, 3 bits per element at the least (rotated 3-bit codes).
  return uint64_t{config.attention_layers()} * 2 * config.n_kv_heads * config.head_dim() * 3 / 8;
}

std::optional<Refusal> check_kv_scheme(const v1::Register& reg) {
  switch (reg.kv_quant_scheme()) {
    case v1::KV_QUANT_SCHEME_UNSPECIFIED:
    case v1::KV_QUANT_SCHEME_UNIFORM:
      if (reg.kv_bits() == 0 || reg.kv_bits() == 8 || reg.kv_bits() == 4) return std::nullopt;
      return Refusal{v1::REFUSAL_REASON_KV_FORMAT, "uniform KV codes of " + std::to_string(reg.kv_bits()) +
                                                       " bits: this scheduler knows 0 (F32), 8 and 4"};
    case v1::KV_QUANT_SCHEME_ROTATED:
      if (reg.kv_bits() == 4 || reg.kv_bits() == 3) return std::nullopt;
      return Refusal{v1::REFUSAL_REASON_KV_FORMAT,
                     "rotated KV codes of " + std::to_string(reg.kv_bits()) + " bits: the rotated scheme takes 4 or 3"};
    default:
      return Refusal{v1::REFUSAL_REASON_KV_FORMAT, "KV quantization scheme " + std::to_string(reg.kv_quant_scheme()) +
                                                       " is not one this scheduler knows (uniform, rotated)"};
  }
}

std::optional<Refusal> check_kv_pool(const v1::Register& reg, const RegistrationLimits& limits) {
  const uint32_t bt = reg.block_tokens();
  if (reg.kv_blocks() == 0 || reg.kv_blocks() > kMaxBlocks || bt == 0 || bt % 16 != 0 || bt > 4096)
    return Refusal{v1::REFUSAL_REASON_KV_POOL, "invalid KV pool: " + std::to_string(reg.kv_blocks()) + " blocks of " +
                                                   std::to_string(bt) +
                                                   " tokens (1 to 2^24 blocks of 16 to 4096 tokens, a multiple of 16)"};
  if (reg.block_bytes() < uint64_t{bt} * limits.min_kv_bytes_per_token)
    return Refusal{v1::REFUSAL_REASON_KV_POOL, "invalid KV pool: " + std::to_string(reg.block_bytes()) +
                                                   " bytes per block of " + std::to_string(bt) +
                                                   " tokens is less than this model's KV takes in any format"};
  const uint32_t every = reg.checkpoint_interval();
  if (reg.state_checkpoints() > 0 && (every == 0 || every % bt != 0 || every % 64 != 0))
    return Refusal{v1::REFUSAL_REASON_KV_POOL, "invalid state checkpoints: every " + std::to_string(every) +
                                                   " tokens is not a multiple of the 64-token grid and of its " +
                                                   std::to_string(bt) + "-token blocks"};
  // Each below 2^64, times at most 2^24: the product does not wrap. A draft model's layers
  // (draft_block_bytes) share the blocks.
  const unsigned __int128 bytes = static_cast<unsigned __int128>(reg.kv_blocks()) * reg.block_bytes() +
                                  static_cast<unsigned __int128>(reg.kv_blocks()) * reg.draft_block_bytes();
  if (limits.max_worker_kv_bytes && bytes > limits.max_worker_kv_bytes)
    return Refusal{v1::REFUSAL_REASON_KV_POOL,
                   "KV pool too large: " + std::to_string(reg.kv_blocks()) + " blocks of " +
                       std::to_string(reg.block_bytes() + reg.draft_block_bytes()) +
                       " bytes is more than a worker may hold (the scheduler's --max-worker-kv-bytes)"};
  return std::nullopt;
}

std::optional<Refusal> check_kv_endpoint(const std::string& endpoint, const RegisteringPeer& peer,
                                         const std::vector<std::string>& allow) {
  const std::optional<std::string> host = tcp_host(endpoint);
  for (const std::string& a : allow)
    if (a == endpoint || (host && a == *host)) return std::nullopt;
  if (endpoint.rfind("ipc://", 0) == 0) {
    if (peer.local) return std::nullopt;
    return Refusal{v1::REFUSAL_REASON_KV_ENDPOINT,
                   "kv_endpoint: an ipc:// endpoint is taken only from a worker connected over ipc:// (list it in "
                   "[scheduler] kv_endpoint_allow otherwise)"};
  }
  if (!host)
    return Refusal{v1::REFUSAL_REASON_KV_ENDPOINT,
                   "kv_endpoint: must be ipc://PATH or tcp://HOST:PORT (or listed in [scheduler] kv_endpoint_allow)"};
  if ((!peer.address.empty() && *host == peer.address) || (peer.local && loopback(*host))) return std::nullopt;
  return Refusal{v1::REFUSAL_REASON_KV_ENDPOINT,
                 "kv_endpoint: its host must be the address the worker registers from (or listed in [scheduler] "
                 "kv_endpoint_allow)"};
}

std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

Result<std::vector<std::string>> read_allow_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::invalid("--kv-endpoint-allow-file " + path + ": cannot read it");
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    for (const std::string& entry : split_list(line.substr(0, line.find('#')))) out.push_back(entry);
  }
  if (in.bad()) return Status::invalid("--kv-endpoint-allow-file " + path + ": read error");
  return out;
}

uint64_t host_mem_total(const std::string& meminfo) {
  std::ifstream in(meminfo);
  std::string key;
  uint64_t kb = 0;
  while (in >> key) {
    if (key == "MemTotal:" && in >> kb) return kb * 1024;
    in.ignore(1 << 16, '\n');
  }
  return 0;
}

}  // namespace tandem::scheduler
