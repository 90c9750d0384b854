// How a model is computed, from the flags `tandem run`, `tandem worker` and `tandem up`
// share (their rows of the flag table): the KV cache format, the GEMM backend and speculation.
#pragma once

#include <string>

#include "cli/args.h"
#include "runtime/status.h"
#include "workers/engine/engine.h"
#include "workers/engine/kv_cache.h"

namespace tandem::cli {

// The format --kv-bits, --kv-quant-scheme, --kv-group-size, --kv-f32-window and
// --kv-quant-skip-last-layer ask for; errors name the bad value (rotated without --kv-bits 4
// or 3, uniform with 3). Whether the group divides the model's head dimension
// is checked when the pool is made.
Result<engine::KvFormat> kv_format_from_flags(const Args& args);

// --gemm packed|openblas.
Result<engine::GemmBackend> gemm_from_flags(const Args& args);

// --spec, --spec-tokens and --draft-model: the most drafts a speculating sequence carries per
// round (0 for --spec off) and, for --spec draft, the draft model's file. Refused: --spec draft
// without --draft-model, --draft-model without --spec draft.
struct SpecFlags {
  uint32_t spec_tokens = 0;
  std::string draft_model;
};
Result<SpecFlags> spec_from_flags(const Args& args);

}  // namespace tandem::cli
