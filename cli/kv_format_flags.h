// The KV cache format flags, shared by `tandem run`, `tandem worker` and `tandem up`.
#pragma once

#include <set>
#include <string>

#include "cli/args.h"
#include "runtime/status.h"
#include "workers/engine/kv_cache.h"

namespace tandem::cli {

// --kv-bits 0|8|4 --kv-group-size 32|64|128 --kv-f32-window 0|1|2 (valued),
// --kv-quant-skip-last-layer (switch).
inline const std::set<std::string> kKvFormatFlags = {"kv-bits", "kv-group-size", "kv-f32-window"};
inline const std::set<std::string> kKvFormatSwitches = {"kv-quant-skip-last-layer"};
inline constexpr const char* kKvFormatHelp =
    "  --kv-bits 0|8|4        KV cache storage: 0 = F32 (default), 8 or 4 bits per element\n"
    "  --kv-group-size N      elements per scale/bias group of a head vector: 32, 64 (default), 128\n"
    "  --kv-quant-skip-last-layer  keep the last layer's KV in F32\n"
    "  --kv-f32-window 0|1|2  with 8 or 4 bits: keep each sequence's N most recent blocks (the open\n"
    "                         one, and the one before) also in F32, read by attention for the nearest\n"
    "                         keys (default 2; costs N F32 blocks per sequence)\n";

// The format the flags ask for; errors name the bad value. Whether the group divides the
// model's head dimension is checked when the pool is made.
Result<engine::KvFormat> kv_format_from_flags(const Args& args);

}  // namespace tandem::cli
