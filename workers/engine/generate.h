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

// Where speculative drafts come from (generate() verifies them): workers/speculation.h's
// prompt lookup, for one. draft() writes at most out.size() tokens that may follow `history`
// and returns how many; record() learns that a round of `drafted` accepted `accepted`.
class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual uint32_t draft(std::span<const int32_t> history, std::span<int32_t> out) = 0;
  virtual void record(uint32_t drafted, uint32_t accepted) = 0;
  // The distribution draft i of the last draft() was drawn from (vocab_size floats), for the
  // rejection rule at temperature > 0 (verify_sampled); empty: verified by equality with the
  // target's own sample (prompt lookup, greedy drafts).
  virtual std::span<const float> q(uint32_t) const { return {}; }
};

struct GenerateOptions {
  uint32_t max_tokens = 16;
  SamplingParams sampling;
  bool ignore_eos = false;       // else any end-of-generation token ends it (Tokenizer::is_eog)
  uint32_t prefill_chunk = 512;  // prompt tokens per forward pass
  uint32_t penalty_window = 64;  // last tokens the repetition penalty looks at (llama.cpp's default)
  KvFormat kv_format;            // how the sequence's KV is stored
  // Speculative decoding (null: off): each step feeds the last token and up to spec_tokens
  // drafts, samples every position exactly as plain decoding would and keeps the drafts that
  // equal the samples, so the tokens are those of plain decoding. A drafter that gives q at
  // temperature > 0 (a draft model) is verified by the rejection rule instead (verify_sampled):
  // the tokens are distributed as plain decoding's, not equal to them.
  Drafter* drafter = nullptr;
  uint32_t spec_tokens = 0;
  // Rings (docs/WINDOWS.md): a model's windowed layers keep only their window's blocks, a
  // rotating ring of the blocks W - 1 + max(prefill_chunk, 1 + spec_tokens) positions can touch
  // (logical block b in slot b % ring), so their memory stays constant with the context. The
  // tokens are those without rings. Refused for a model without windowed layers and with an
  // F32 window tail (KvPool::create).
  bool rings = false;
};

struct Generation {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  bool stopped_by_eos =
      false;  // an end-of-generation token (eos, eot, ...); else it ran to max_tokens or the context length
  double prefill_seconds = 0, decode_seconds = 0;
  uint32_t decode_steps = 0;  // forward passes after the prompt's (fewer than tokens with drafts accepted)
};

// Prefills `prompt` in chunks, then decodes one token per step (more with a drafter). `on_token` (optional) sees
// each token as it is sampled. Errors: empty prompt, prompt at or past the context length,
// bad token ids, bad sampling parameters.
Result<Generation> generate(Engine& engine, std::span<const int32_t> prompt, const GenerateOptions& options,
                            const std::function<void(int32_t token, float logprob)>& on_token = {});

}  // namespace tandem::engine
