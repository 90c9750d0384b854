// How much memory a worker may give its KV pool: what the host has left (MemAvailable, capped
// by the tightest memory cgroup the process is in), minus the weights still to be resident,
// minus a reserve, split between the workers that share the host.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/status.h"

namespace tandem::worker {

struct CgroupMemory {
  std::string path;  // the cgroup whose limit binds, as in /proc/self/cgroup ("/" for the root)
  uint64_t limit = 0;
  uint64_t used = 0;
  uint64_t left() const { return used < limit ? limit - used : 0; }
};

struct HostMemory {
  uint64_t available = 0;              // /proc/meminfo MemAvailable, bytes
  std::optional<CgroupMemory> cgroup;  // absent: no limit on the process's cgroup or its ancestors
  uint64_t usable() const { return cgroup && cgroup->left() < available ? cgroup->left() : available; }
  std::string to_string() const;  // "MemAvailable 23.1 GiB; cgroup /a/b: 3.0 GiB of 8.0 GiB used"
};

// Reads MemAvailable from `proc`/meminfo and the process's memory cgroup from `proc`/self/cgroup
// under `cgroup_root` (v2: memory.max and memory.current; v1: the memory controller's
// memory.limit_in_bytes and memory.usage_in_bytes), walking up to the root and keeping the
// level with the least left. A limit file that is absent, "max" or v1's unlimited value means no
// limit there. Errors (Code::kInternal) name the file: no MemAvailable in meminfo, a number
// that does not parse.
Result<HostMemory> read_host_memory(const std::string& proc = "/proc",
                                    const std::string& cgroup_root = "/sys/fs/cgroup");

struct KvBudget {
  uint64_t usable = 0;   // HostMemory::usable() when measured
  uint64_t weights = 0;  // subtracted: weight bytes not yet resident when measured
  uint64_t reserve = 0;  // subtracted: left for the process, the OS and the page cache
  uint32_t share = 1;    // workers on this host splitting what is left
  uint64_t states = 0;   // subtracted from this worker's share: its recurrent state slots (hybrid models)
  uint64_t kv_bytes() const {
    const uint64_t taken = weights + reserve;
    const uint64_t mine = usable > taken ? (usable - taken) / share : 0;
    return mine > states ? mine - states : 0;
  }
  // "KV 10.2 GiB = (21.0 usable - 0.5 weights - 1.0 reserve) / 2 workers", and " - 0.4 GiB state slots" when any.
  std::string to_string() const;
};

// "1.5 GiB", "512.0 MiB", "64.0 KiB", "12 B".
std::string human_bytes(uint64_t bytes);

}  // namespace tandem::worker
