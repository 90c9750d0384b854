// What the scheduler checks in a worker's Register beyond the model and role: that its KV pool
// is one a worker could hold, and that its kv_endpoint is its own (#18 item 1). Pure: the
// actor gives it the peer's address as ZeroMQ reports it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "runtime/status.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::scheduler {

struct RegistrationLimits {
  // kv_blocks x block_bytes at most: what one worker could hold (--max-worker-kv-bytes,
  // default this host's MemTotal). 0: no bound.
  uint64_t max_worker_kv_bytes = 0;
  // Bytes of KV per token below which no format stores this model (3 bits per element of
  // every layer's K and V, scales and norms not counted): a block_bytes under block_tokens x this is a
  // lie that would make the bound above meaningless. 0: not checked.
  uint64_t min_kv_bytes_per_token = 0;
  // [scheduler] kv_endpoint_allow: endpoints ("tcp://10.0.0.7:5600") or hosts ("10.0.0.7")
  // a worker may name as its kv_endpoint whatever address it registers from.
  std::vector<std::string> kv_endpoint_allow;
};

// The smallest KV a token of `config` can take (see min_kv_bytes_per_token).
uint64_t min_kv_bytes_per_token(const model::ModelConfig& config);

// Where a Register came from. `local`: over ipc:// (or inproc://), so on this host, from a
// process that could open the scheduler's private folder. `address`: ZeroMQ's Peer-Address
// of a tcp:// peer ("10.0.0.7", "::1"); empty otherwise.
struct RegisteringPeer {
  bool local = false;
  std::string address;
};

struct Refusal {
  v1::RefusalReason reason;
  std::string message;  // names the rule, never an expected value
};

// A KV pool of 1 to 2^24 blocks of 16 to 4096 tokens (a multiple of 16), of at least the
// model's smallest block, and at most max_worker_kv_bytes in all.
std::optional<Refusal> check_kv_pool(const v1::Register& reg, const RegistrationLimits& limits);

// A KV code scheme this scheduler knows with a width it takes: uniform 0 (F32), 8 or 4 bits;
// rotated 4 or 3. Refused otherwise (REFUSAL_REASON_KV_FORMAT): a worker of a newer build
// whose scheme this scheduler could not account for.
std::optional<Refusal> check_kv_scheme(const v1::Register& reg);

// A kv_endpoint (prefill workers will push other sequences' KV to it) must be the peer's own:
// ipc:// only from a local peer; tcp://HOST:PORT where HOST is the peer's address (or, from a
// local peer, a loopback address); or the endpoint or its host is in kv_endpoint_allow.
std::optional<Refusal> check_kv_endpoint(const std::string& endpoint, const RegisteringPeer& peer,
                                         const std::vector<std::string>& allow);

// "a, b ,c" -> {"a", "b", "c"} (the flag's and the TOML key's form).
std::vector<std::string> split_list(const std::string& list);

// The entries of a --kv-endpoint-allow-file: each line a list as split_list takes it, text
// after '#' ignored. kInvalidArgument naming the file when it cannot be read.
Result<std::vector<std::string>> read_allow_file(const std::string& path);

// /proc/meminfo's MemTotal in bytes; 0 when it cannot be read.
uint64_t host_mem_total(const std::string& meminfo = "/proc/meminfo");

}  // namespace tandem::scheduler
