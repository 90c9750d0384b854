// Single-sequence generation in-process: the reference every served stream is compared with.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/status.h"
#include "workers/engine/engine.h"
#include "workers/engine/sampler.h"

namespace tandem::engine {

struct GenerateOptions {
  uint32_t max_tokens = 16;
  SamplingParams sampling;
  bool ignore_eos = false;       // else any end-of-generation token ends it (Tokenizer::is_eog)
  uint32_t prefill_chunk = 512;  // prompt tokens per forward pass
  uint32_t penalty_window = 64;  // last tokens the repetition penalty looks at (llama.cpp's default)
  KvFormat kv_format;            // how the sequence's KV is stored
};

struct Generation {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  bool stopped_by_eos =
      false;  // an end-of-generation token (eos, eot, ...); else it ran to max_tokens or the context length
  double prefill_seconds = 0, decode_seconds = 0;
};

// Prefills `prompt` in chunks, then decodes one token per step. `on_token` (optional) sees
// each token as it is sampled. Errors: empty prompt, prompt at or past the context length,
// bad token ids, bad sampling parameters.
Result<Generation> generate(Engine& engine, std::span<const int32_t> prompt, const GenerateOptions& options,
                            const std::function<void(int32_t token, float logprob)>& on_token = {});

}  // namespace tandem::engine
