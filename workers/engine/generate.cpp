#include "workers/engine/generate.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace tandem::engine {

namespace {

// Drafts the next round may carry at `at` (the position the last token is fed at): what the
// drafter offers, no more than the room left (the accepted drafts plus the correction never
// pass `total`), with an F32 window none past the block `at` is in (a rollback stays within
// the last written block, which the window keeps exact), and with a recurrent state none that
// would complete a grid chunk (the state rolls back within the open one).
uint32_t draft_room(const GenerateOptions& options, uint32_t at, uint32_t total, uint32_t emitted_room, bool hybrid) {
  if (options.drafter == nullptr) return 0;
  uint32_t k = std::min(options.spec_tokens, emitted_room > 0 ? emitted_room - 1 : 0u);
  if (options.kv_format.bits > 0 && options.kv_format.f32_window > 0) k = std::min(k, 15 - at % 16);
  if (hybrid) k = std::min(k, StatePool::drafts_within_chunk(at));
  return at + 1 + k <= total ? k : 0;
}

// Blocks of 16 that `span` consecutive positions can touch (the first at a block's last slot).
uint32_t ring_blocks(uint32_t span) { return (span + 30) / 16; }

// A single sequence's rotating ring (GenerateOptions::rings): logical block b in slot b % size.
// The ring of a step starts at the block of its first query's first key.
struct Ring {
  std::vector<int32_t> slots;  // this step's ring (size(): the ring's blocks; empty: no rings)
  void place(SeqStep& s, uint32_t window) {
    if (slots.empty()) return;
    const uint32_t n = static_cast<uint32_t>(slots.size());
    s.ring_first = s.start_pos + 1 > window ? (s.start_pos + 1 - window) / 16 : 0;
    for (uint32_t i = 0; i < n; ++i) slots[i] = static_cast<int32_t>((s.ring_first + i) % n);
    s.ring = slots;
  }
};

// One row of a round: the token plain decoding samples there, or, for draft `draft` (>= 0)
// that came with a distribution q at temperature > 0, the rejection rule's token (the
// draft itself when accepted).
Sample sample_row(Sampler& sampler, std::span<const float> logits, const GenerateOptions& options,
                  std::span<const int32_t> seq, size_t prompt_len, int32_t draft, std::span<const float> q,
                  std::vector<float>& p) {
  const size_t from = seq.size() > options.penalty_window ? seq.size() - options.penalty_window : 0;
  const std::span<const int32_t> history = seq.subspan(from), generated = seq.subspan(prompt_len);
  if (draft < 0 || q.empty() || options.sampling.temperature <= 0.0f)
    return sampler.sample(logits, options.sampling, seq.size(), history, generated);
  sampler.distribution(logits, options.sampling, seq.size(), history, generated, p);
  const Verdict v = verify_sampled(p, q, draft, options.sampling.seed, seq.size());
  Sample smp;
  smp.token = v.token;
  smp.logprob = sampler.last_logprob(logits, v.token);
  return smp;
}

// The decode loop after the prompt: samples the rows of the last forward in order, keeps the
// drafts equal to their samples, feeds the last token and the next drafts.
Status decode(Engine& engine, KvPool& pool, StatePool* states, std::span<const int32_t> blocks,
              std::span<const int32_t> tail, size_t prompt_len, uint32_t total, const GenerateOptions& options,
              std::vector<int32_t>& seq, Generation& gen, const std::function<void(int32_t, float)>& on_token,
              Ring& ring) {
  if (options.max_tokens == 0) return Status::ok();
  Sampler sampler(engine.config().vocab_size);
  std::vector<float> p(engine.config().vocab_size);
  std::vector<int32_t> feed(1 + options.spec_tokens);
  uint32_t drafted = 0;                                 // drafts fed by the last forward
  int64_t tail_end = static_cast<int64_t>(prompt_len);  // the end of the last write
  for (;;) {
    uint32_t accepted = 0;
    bool done = false;
    for (uint32_t row = 0; row <= drafted; ++row) {
      const int32_t draft = row < drafted ? feed[row + 1] : -1;
      const Sample smp = sample_row(sampler, engine.logits(row), options, seq, prompt_len, draft,
                                    draft >= 0 ? options.drafter->q(row) : std::span<const float>(), p);
      gen.tokens.push_back(smp.token);
      gen.logprobs.push_back(smp.logprob);
      if (on_token) on_token(smp.token, smp.logprob);
      seq.push_back(smp.token);
      if (engine.tokenizer().is_eog(smp.token) && !options.ignore_eos) {  // eos, eot, eom, <|im_end|>, ...
        gen.stopped_by_eos = done = true;
        break;
      }
      if (gen.tokens.size() == options.max_tokens || seq.size() >= total) {
        done = true;
        break;
      }
      if (row == drafted || smp.token != draft) break;
      ++accepted;
    }
    if (options.drafter) options.drafter->record(drafted, accepted);
    if (done) return Status::ok();
    const uint32_t at = static_cast<uint32_t>(seq.size() - 1);
    const uint32_t room = std::min<uint32_t>(total - static_cast<uint32_t>(seq.size()),
                                             options.max_tokens - static_cast<uint32_t>(gen.tokens.size()));
    const uint32_t k = draft_room(options, at, total, room, states != nullptr);
    // The last round's rejected drafts out of the recurrent state (positions [0, at) stay).
    if (states != nullptr && states->position(0) > at) TANDEM_RETURN_IF_ERROR(states->roll_back(0, at));
    feed[0] = seq.back();
    drafted = k > 0 ? options.drafter->draft(seq, std::span<int32_t>(feed).subspan(1, k)) : 0;
    SeqStep s{std::span<const int32_t>(feed).first(1 + drafted), at, blocks, 1 + drafted, tail, tail_end, 0};
    ring.place(s, engine.config().sliding_window);
    TANDEM_RETURN_IF_ERROR(engine.forward({&s, 1}, pool, states));
    tail_end = at + 1 + drafted;
    ++gen.decode_steps;
  }
}

}  // namespace

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
  if (options.rings && c.sliding_window == 0)
    return Status::invalid("KV rings need a model with sliding-window layers; this one has none");
  Ring ring;
  if (options.rings)
    ring.slots.resize(ring_blocks(c.sliding_window - 1 + std::max(options.prefill_chunk, 1 + options.spec_tokens)));
  auto pool = KvPool::create(c, n_blocks + n_tail, 16, options.kv_format, static_cast<uint32_t>(ring.slots.size()));
  if (!pool) return pool.status();
  // A hybrid's recurrent state: one slot, this sequence's.
  std::unique_ptr<StatePool> states;
  if (c.arch->hybrid()) {  // speculating, it keeps the conv inputs a round's rollback needs
    auto made = StatePool::create(c, 1, options.drafter != nullptr ? options.spec_tokens : 0);
    if (!made) return made.status();
    states = std::move(*made);
  }
  std::vector<int32_t> blocks, tail;  // the tail: the F32 open block's own blocks, after the positions'
  for (uint32_t b = 0; b < n_blocks + n_tail; ++b) (b < n_blocks ? blocks : tail).push_back(static_cast<int32_t>(b));

  Generation gen;
  std::vector<int32_t> seq(prompt.begin(), prompt.end());
  seq.reserve(total);
  auto now = [] { return std::chrono::steady_clock::now(); };
  auto t0 = now();
  uint32_t pos = 0;
  while (pos < prompt.size()) {
    const uint32_t n = std::min<uint32_t>(options.prefill_chunk, static_cast<uint32_t>(prompt.size()) - pos);
    const bool last = pos + n == prompt.size();
    SeqStep s{prompt.subspan(pos, n), pos, blocks, last ? 1u : 0u, tail, pos, 0};
    ring.place(s, c.sliding_window);
    TANDEM_RETURN_IF_ERROR(engine.forward({&s, 1}, **pool, states.get()));
    pos += n;
  }
  auto t1 = now();
  gen.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  TANDEM_RETURN_IF_ERROR(
      decode(engine, **pool, states.get(), blocks, tail, prompt.size(), total, options, seq, gen, on_token, ring));
  gen.decode_seconds = std::chrono::duration<double>(now() - t1).count();
  return gen;
}

}  // namespace tandem::engine
