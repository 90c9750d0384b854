#include "workers/engine/generate.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace tandem::engine {

Result<Generation> generate(Engine& engine, std::span<const int32_t> prompt, const GenerateOptions& options,
                            const std::function<void(int32_t, float)>& on_token) {
  const ModelConfig& c = engine.config();
  if (prompt.empty()) return Status::invalid("empty prompt");
  if (prompt.size() >= c.context_length)
    return Status::invalid("prompt of " + std::to_string(prompt.size()) + " tokens does not fit the context length " +
                           std::to_string(c.context_length));
  TANDEM_RETURN_IF_ERROR(validate(options.sampling));
  if (options.prefill_chunk == 0) return Status::invalid("prefill chunk must be at least 1 token");

  const uint32_t total =
      std::min<uint32_t>(c.context_length, static_cast<uint32_t>(prompt.size()) + options.max_tokens);
  const uint32_t n_blocks = (total + 15) / 16, n_tail = KvPool::tail_blocks_for(c, 16, options.kv_format);
  auto pool = KvPool::create(c, n_blocks + n_tail, 16, options.kv_format);
  if (!pool) return pool.status();
  std::vector<int32_t> blocks, tail;  // the tail: the F32 open block's own blocks, after the positions'
  for (uint32_t b = 0; b < n_blocks + n_tail; ++b) (b < n_blocks ? blocks : tail).push_back(static_cast<int32_t>(b));

  Generation gen;
  Sampler sampler(c.vocab_size);
  std::vector<int32_t> seq(prompt.begin(), prompt.end());
  seq.reserve(total);
  auto now = [] { return std::chrono::steady_clock::now(); };
  auto t0 = now();
  uint32_t pos = 0;
  while (pos < prompt.size()) {
    const uint32_t n = std::min<uint32_t>(options.prefill_chunk, static_cast<uint32_t>(prompt.size()) - pos);
    const bool last = pos + n == prompt.size();
    SeqStep s{prompt.subspan(pos, n), pos, blocks, last ? 1u : 0u, tail, pos};
    TANDEM_RETURN_IF_ERROR(engine.forward({&s, 1}, **pool));
    pos += n;
  }
  auto t1 = now();
  gen.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  for (uint32_t i = 0; i < options.max_tokens && seq.size() < total + 1; ++i) {
    const size_t from = seq.size() > options.penalty_window ? seq.size() - options.penalty_window : 0;
    const std::span<const int32_t> tokens(seq);
    const Sample smp = sampler.sample(engine.logits(0), options.sampling, seq.size(), tokens.subspan(from),
                                      tokens.subspan(prompt.size()));
    gen.tokens.push_back(smp.token);
    gen.logprobs.push_back(smp.logprob);
    if (on_token) on_token(smp.token, smp.logprob);
    seq.push_back(smp.token);
    if (engine.tokenizer().is_eog(smp.token) && !options.ignore_eos) {  // eos, eot, eom, <|im_end|>, ...
      gen.stopped_by_eos = true;
      break;
    }
    if (i + 1 == options.max_tokens || seq.size() >= total) break;
    const uint32_t at = static_cast<uint32_t>(seq.size() - 1);
    SeqStep s{std::span<const int32_t>(&seq.back(), 1), at, blocks, 1, tail, at};
    TANDEM_RETURN_IF_ERROR(engine.forward({&s, 1}, **pool));
  }
  gen.decode_seconds = std::chrono::duration<double>(now() - t1).count();
  return gen;
}

}  // namespace tandem::engine
