#include "workers/sequence_table.h"

#include <algorithm>
#include <cassert>

#include "workers/kv_transfer.h"

namespace tandem::worker {

namespace {

std::string str(uint64_t v) { return std::to_string(v); }

}  // namespace

SequenceTable::SequenceTable(const TableLimits& limits, engine::StatePool* states) : limits_(limits), states_(states) {
  for (uint32_t s = limits.state_slots; s-- > 0;) free_slots_.push_back(static_cast<int32_t>(s));
}

// Messages are built only on failure: a valid plan allocates nothing here.
Status SequenceTable::check_entry(const runtime::SeqPlan& sp, const Sequence* seq, uint64_t& tokens) const {
  auto bad = [&sp](const std::string& what) { return Status::invalid("sequence " + str(sp.seq_id) + " " + what); };
  if (seq == nullptr && !sp.first)
    return bad("is not held here, and its plan entry is not a first appearance (no sampling parameters)");
  if (seq == nullptr && sp.tail_blocks.size() != limits_.tail_blocks)
    return bad("comes with " + str(sp.tail_blocks.size()) + " tail blocks; this worker's KV format (" +
               limits_.kv_format + ") needs " + str(limits_.tail_blocks));
  const size_t held = seq != nullptr ? seq->tokens.size() : sp.history.size();
  if (sp.speculate && (!sp.tokens.empty() || !sp.sample))
    return bad(
        "is a speculating round with tokens or without a sample (it continues from the worker's own last sample)");
  if (sp.speculate && limits_.spec_tokens == 0)
    return bad("is a speculating round, but this worker does not speculate");
  if (sp.speculate && limits_.state_slots > 0 && states_ == nullptr)
    return bad("is a speculating round, but no state pool is here to roll its recurrent state back");
  const uint64_t start = sp.speculate ? held : sp.start_pos;
  if (start > held) return bad("plan starts at " + str(start) + " but " + str(held) + " positions are cached");
  if (limits_.state_slots > 0 && seq != nullptr && start < held)
    return bad("rolls back from position " + str(held) + " to " + str(start) +
               "; a hybrid model's recurrent state cannot roll back");
  if (limits_.state_slots > 0 && seq == nullptr && start > 0 && sp.restore_checkpoint < 0)
    return bad("starts at position " + str(start) +
               " from cached blocks without a state checkpoint to restore (a hybrid model's recurrent state)");
  if (sp.restore_checkpoint >= 0 && (seq != nullptr || start == 0))
    return bad("restores a state checkpoint, which only a new sequence starting from a cached prefix does");
  const int32_t last = seq != nullptr ? seq->last : -1;
  if (sp.tokens.empty() && last < 0) return bad("has no sampled token to continue from");
  const std::span<const int32_t> feed = sp.tokens.empty() ? std::span<const int32_t>(&last, 1) : sp.tokens;
  for (int32_t t : feed)
    if (t < 0 || static_cast<uint32_t>(t) >= limits_.vocab_size)
      return bad("feeds token id " + std::to_string(t) + ", outside the vocabulary of " + str(limits_.vocab_size));
  const uint64_t end = start + feed.size();
  if (end > limits_.context_length)
    return bad("reaches position " + str(end) + ", past the context length " + str(limits_.context_length));
  const size_t table = seq != nullptr ? seq->blocks.size() : 0;
  if (sp.keep_blocks > table) return bad("keeps " + str(sp.keep_blocks) + " blocks of a block table of " + str(table));
  const uint64_t covered =
      ((sp.keep_blocks > 0 ? sp.keep_blocks : table) + sp.new_blocks.size()) * limits_.block_tokens;
  if (covered < end) return bad("has blocks for " + str(covered) + " positions, needs " + str(end));
  const std::span<const int32_t> tail =
      seq == nullptr ? std::span<const int32_t>(sp.tail_blocks) : std::span<const int32_t>();
  for (std::span<const int32_t> ids : {std::span<const int32_t>(sp.new_blocks), tail})
    for (int32_t b : ids)
      if (b < 0 || static_cast<uint32_t>(b) >= limits_.n_blocks)
        return bad("names block " + std::to_string(b) + ", outside the pool of " + str(limits_.n_blocks));
  TANDEM_RETURN_IF_ERROR(check_ring(sp, end));
  tokens += feed.size() + (sp.speculate ? sp.max_drafts : 0);
  return Status::ok();
}

// Rings: the entry's ring must be in the ring pool and reach its last block (the engine checks
// that it starts early enough for the step's first query).
Status SequenceTable::check_ring(const runtime::SeqPlan& sp, uint64_t end) const {
  auto bad = [&sp](const std::string& what) { return Status::invalid("sequence " + str(sp.seq_id) + " " + what); };
  if (limits_.ring_blocks == 0)
    return sp.ring.empty() ? Status::ok() : bad("comes with a ring, but this worker's KV pool has no rings");
  const uint64_t need = (end + limits_.block_tokens - 1) / limits_.block_tokens;
  if (sp.ring_first + sp.ring.size() < need)
    return bad("has a ring of blocks " + str(sp.ring_first) + " .. " + str(sp.ring_first + sp.ring.size()) +
               ", needs up to block " + str(need));
  for (int32_t b : sp.ring)
    if (b < 0 || static_cast<uint32_t>(b) >= limits_.ring_blocks)
      return bad("names ring block " + std::to_string(b) + ", outside the ring pool of " + str(limits_.ring_blocks));
  return Status::ok();
}

Status SequenceTable::check(const runtime::StepPlan& plan) {
  if (staged()) return Status::error(Code::kInternal, "a step is already staged (commit or abort it first)");
  auto twice = [](uint64_t id) { return Status::invalid("sequence " + str(id) + " appears twice in the plan"); };
  ++applies_;
  found_.clear();
  fresh_.clear();
  uint64_t tokens = 0;
  for (const runtime::SeqPlan& sp : plan.seqs()) {
    auto it = sequences_.find(sp.seq_id);
    Held* held = it == sequences_.end() ? nullptr : &it->second;
    found_.push_back(held);
    if (held == nullptr) fresh_.push_back(sp.seq_id);
    if (held != nullptr && held->checked == applies_) return twice(sp.seq_id);
    if (held != nullptr) held->checked = applies_;
    TANDEM_RETURN_IF_ERROR(check_entry(sp, held, tokens));
  }
  std::sort(fresh_.begin(), fresh_.end());
  if (auto dup = std::adjacent_find(fresh_.begin(), fresh_.end()); dup != fresh_.end()) return twice(*dup);
  if (limits_.state_slots > 0 && fresh_.size() > free_slots_.size())
    return Status::invalid("the plan starts " + str(fresh_.size()) + " sequences but only " + str(free_slots_.size()) +
                           " of " + str(limits_.state_slots) + " recurrent state slots are free (raise --state-slots)");
  if (tokens > limits_.max_step_tokens)
    return Status::invalid("step of " + str(tokens) + " tokens is larger than the engine takes (" +
                           str(limits_.max_step_tokens) + ")");
  return Status::ok();
}

uint32_t SequenceTable::draft(const runtime::SeqPlan& sp, Sequence& seq) {
  const auto at = static_cast<uint32_t>(seq.tokens.size() - 1);  // where the last sample is fed
  const uint32_t bt = limits_.block_tokens;
  uint32_t k = std::min({seq.draft.next(), sp.max_drafts, limits_.spec_tokens});
  if (seq.sampling.top_logprobs > 0) k = 0;  // a round reports top logprobs for one token only
  const uint32_t remaining = sp.max_len > at + 1 ? sp.max_len - (at + 1) : 0;
  k = workers::draft_budget(k, remaining, limits_.context_length - at);
  k = static_cast<uint32_t>(std::min<uint64_t>(k, seq.blocks.size() * uint64_t{bt} - (at + 1)));
  if (!seq.tail.empty()) k = std::min(k, bt - 1 - at % bt);
  if (seq.state_slot >= 0) k = std::min({k, states_->rollback(), engine::StatePool::drafts_within_chunk(at)});
  // A draft model writes positions up to at + k - 1: within its own context.
  if (limits_.draft_model) k = std::min(k, limits_.draft_context_length > at ? limits_.draft_context_length - at : 0);
  if (k == 0) return 0;
  const size_t from = seq.tokens.size();
  seq.tokens.resize(from + k);
  if (limits_.draft_model) {  // the draft model writes them (to_draft()) before the forward
    const size_t q_floats = seq.sampling.temperature > 0.0f ? size_t{k} * limits_.vocab_size : 0;
    drafting_[n_drafting_++] = workers::DraftJob{seq.tokens,
                                                 k,
                                                 seq.blocks,
                                                 &seq.draft_pos,
                                                 &seq.sampling,
                                                 seq.prompt_len,
                                                 std::span<float>(q_).subspan(q_used_, q_floats)};
    q_used_ += q_floats;
    return k;
  }
  const std::span<int32_t> all(seq.tokens);
  const uint32_t n =
      workers::ngram_draft(all.first(from), workers::NgramConfig{.max_k = limits_.spec_tokens}, all.subspan(from, k));
  seq.tokens.resize(from + n);
  return n;
}

void SequenceTable::stage(const runtime::SeqPlan& sp, size_t i, Held* held) {
  const bool fresh = held == nullptr;
  if (fresh) held = &sequences_.try_emplace(sp.seq_id).first->second;
  Held& seq = *held;
  Staged& st = stage_[i];
  st.seq_id = sp.seq_id;
  st.seq = &seq;
  st.fresh = fresh;
  st.cut_blocks.clear();
  if (sp.keep_blocks > 0 && sp.keep_blocks < seq.blocks.size()) {
    st.cut_blocks.assign(seq.blocks.begin() + sp.keep_blocks, seq.blocks.end());
    seq.blocks.resize(sp.keep_blocks);
  }
  st.blocks_before = seq.blocks.size();
  st.start_pos = sp.speculate ? static_cast<uint32_t>(seq.tokens.size()) : sp.start_pos;
  st.speculate = sp.speculate;
  st.sampling_before = seq.sampling;
  st.logprobs_before = seq.logprobs;
  st.prompt_len_before = seq.prompt_len;
  if (sp.first) {
    seq.sampling = sp.sampling;
    seq.logprobs = sp.logprobs;
    seq.prompt_len = sp.prompt_len;
  }
  if (fresh) {  // a prompt whose prefix is in shared cached blocks: its tokens come as history
    seq.tokens.assign(sp.history.begin(), sp.history.end());
    seq.tail.assign(sp.tail_blocks.begin(), sp.tail_blocks.end());
    seq.draft = workers::DraftLength(limits_.spec_tokens);
    if (limits_.state_slots > 0) {
      seq.state_slot = free_slots_.back();
      free_slots_.pop_back();
    }
  }
  seq.blocks.insert(seq.blocks.end(), sp.new_blocks.begin(), sp.new_blocks.end());
  seq.ring.assign(sp.ring.begin(), sp.ring.end());  // the whole ring each plan: abort keeps the new one
  seq.ring_first = sp.ring_first;
  // A start before the positions held rolls back to it (what it overwrites is kept for abort).
  st.cut.assign(seq.tokens.begin() + st.start_pos, seq.tokens.end());
  seq.tokens.resize(st.start_pos);
  st.draft_pos_before = seq.draft_pos;
  seq.draft_pos = std::min(seq.draft_pos, st.start_pos);
  if (sp.tokens.empty())
    seq.tokens.push_back(seq.last);
  else
    seq.tokens.insert(seq.tokens.end(), sp.tokens.begin(), sp.tokens.end());
  st.drafts = sp.speculate ? draft(sp, seq) : 0;
  // A draft model also reads each prompt chunk as the target does (no drafts: catching up
  // only), so its work is in the step the plan's tokens pay for, not in a first round's spike.
  if (limits_.draft_model && !sp.speculate && sp.tokens.size() > 1)
    drafting_[n_drafting_++] =
        workers::DraftJob{seq.tokens, 0, seq.blocks, &seq.draft_pos, &seq.sampling, seq.prompt_len, {}};
  const auto fed = std::span<const int32_t>(seq.tokens).subspan(st.start_pos);
  const uint32_t rows = sp.sample ? 1 + st.drafts : 0;
  steps_[i] = engine::SeqStep{fed,          st.start_pos,   seq.blocks, rows,          seq.tail,
                              seq.tail_end, seq.state_slot, seq.ring,   seq.ring_first};
  if (sp.sample) {
    const std::span<const int32_t> history(seq.tokens);
    samples_[n_samples_] =
        SampleRequest{sp.seq_id,
                      n_rows_,
                      &seq.sampling,
                      history,
                      history.subspan(std::min<size_t>(seq.prompt_len, history.size())),
                      history.last(st.drafts),
                      seq.logprobs,
                      limits_.draft_model && st.drafts > 0 ? drafting_[n_drafting_ - 1].q : std::span<const float>()};
    ++n_samples_;
  }
  n_rows_ += rows;
}

Status SequenceTable::apply(const runtime::StepPlan& plan) {
  TANDEM_RETURN_IF_ERROR(check(plan));
  const size_t n = plan.seqs().size();
  if (stage_.size() < n) stage_.resize(n), steps_.resize(n), samples_.resize(n), drafting_.resize(n);
  if (limits_.draft_model) {  // room for every round's q before any view of it is taken
    size_t rows = 0;
    for (const runtime::SeqPlan& sp : plan.seqs())
      if (sp.speculate) rows += std::min(sp.max_drafts, limits_.spec_tokens);
    if (q_.size() < rows * limits_.vocab_size) q_.resize(rows * limits_.vocab_size);
  }
  n_samples_ = n_drafting_ = q_used_ = 0;
  n_rows_ = 0;
  for (size_t i = 0; i < n; ++i) stage(plan.seqs()[i], i, found_[i]);
  staged_ = n;
  return Status::ok();
}

void SequenceTable::commit(std::span<const int32_t> sampled, std::span<const uint32_t> accepted) {
  assert(sampled.size() == n_samples_);
  size_t k = 0;
  for (size_t i = 0; i < staged_; ++i) {
    Staged& st = stage_[i];
    Sequence& seq = *st.seq;
    // The end of the last write, rejected drafts' included: the tail holds the window as of it.
    seq.tail_end = int64_t{steps_[i].start_pos} + static_cast<int64_t>(steps_[i].tokens.size());
    if (steps_[i].n_logits == 0 || k >= sampled.size()) continue;
    const uint32_t kept = std::min(st.drafts, k < accepted.size() ? accepted[k] : 0u);
    seq.last = sampled[k++];
    if (!st.speculate) continue;
    seq.tokens.resize(st.start_pos + 1 + kept);  // the fed sample and the accepted drafts
    seq.draft_pos = std::min<uint32_t>(seq.draft_pos, static_cast<uint32_t>(seq.tokens.size()));
    if (seq.state_slot >= 0) {  // within reach by draft(); else the engine refuses its next step
      [[maybe_unused]] const Status back =
          states_->roll_back(static_cast<uint32_t>(seq.state_slot), static_cast<uint32_t>(seq.tokens.size()));
      assert(back.is_ok());
    }
    seq.draft.record(st.drafts, kept);
  }
  staged_ = n_samples_ = n_drafting_ = 0;
}

void SequenceTable::abort() {
  for (size_t i = staged_; i-- > 0;) {
    Staged& st = stage_[i];
    if (st.fresh) {
      if (st.seq->state_slot >= 0) free_slots_.push_back(st.seq->state_slot);
      sequences_.erase(st.seq_id);
      continue;
    }
    Sequence& seq = *st.seq;
    if (seq.state_slot >= 0 && states_ != nullptr &&
        states_->position(static_cast<uint32_t>(seq.state_slot)) > st.start_pos)
      (void)states_->roll_back(static_cast<uint32_t>(seq.state_slot), st.start_pos);  // out of reach: refused later
    seq.blocks.resize(st.blocks_before);
    seq.blocks.insert(seq.blocks.end(), st.cut_blocks.begin(), st.cut_blocks.end());
    seq.tokens.resize(st.start_pos);
    seq.tokens.insert(seq.tokens.end(), st.cut.begin(), st.cut.end());
    seq.sampling = st.sampling_before;
    seq.logprobs = st.logprobs_before;
    seq.prompt_len = st.prompt_len_before;
    seq.draft_pos = st.draft_pos_before;
  }
  staged_ = n_samples_ = n_drafting_ = 0;
}

void SequenceTable::drop(uint64_t seq_id) {
  if (auto it = sequences_.find(seq_id); it != sequences_.end() && it->second.state_slot >= 0)
    free_slots_.push_back(it->second.state_slot);
  sequences_.erase(seq_id);
  // A handoff abandoned before its KV arrived: what arrives later is dropped.
  std::erase_if(expected_, [&](const auto& e) {
    if (e.second.seq_id != seq_id) return false;
    abandon(e.second);
    return true;
  });
}

void SequenceTable::abandon(const IncomingHandoff& handoff) {
  if (handoff.state_slot >= 0) free_slots_.push_back(handoff.state_slot);
}

void SequenceTable::drop_all() {
  sequences_.clear();
  free_slots_.clear();
  for (uint32_t s = limits_.state_slots; s-- > 0;) free_slots_.push_back(static_cast<int32_t>(s));
  expected_.clear();
}

Status SequenceTable::trim(uint64_t seq_id, uint32_t positions) {
  if (staged()) return Status::error(Code::kInternal, "trim: a step is staged (commit or abort it first)");
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return Status::invalid("trim: sequence " + str(seq_id) + " is not held here");
  Sequence& seq = it->second;
  if (positions > seq.tokens.size())
    return Status::invalid("trim: sequence " + str(seq_id) + " holds " + str(seq.tokens.size()) +
                           " positions, cannot keep " + str(positions));
  if (positions == seq.tokens.size()) return Status::ok();
  if (seq.state_slot >= 0 && states_ == nullptr)
    return Status::invalid("trim: sequence " + str(seq_id) + " has a recurrent state and no pool to roll it back");
  if (seq.state_slot >= 0) TANDEM_RETURN_IF_ERROR(states_->roll_back(static_cast<uint32_t>(seq.state_slot), positions));
  seq.tokens.resize(positions);
  seq.draft_pos = std::min(seq.draft_pos, positions);
  seq.blocks.resize(std::min<size_t>(seq.blocks.size(), transfer_blocks(positions, limits_.block_tokens)));
  seq.last = -1;
  // tail_end stays: the engine reads back from the codes the window positions a rollback leaves.
  return Status::ok();
}

Status SequenceTable::expect(uint64_t transfer_id, IncomingHandoff handoff) {
  auto replaced = expected_.find(transfer_id);
  handoff.state_slot = replaced != expected_.end() ? replaced->second.state_slot : -1;
  if (limits_.state_slots > 0 && handoff.state_slot < 0) {
    if (free_slots_.empty())
      return Status::invalid("handoff of sequence " + str(handoff.seq_id) + ": no free recurrent state slot (all " +
                             str(limits_.state_slots) + " are held; raise --state-slots)");
    handoff.state_slot = free_slots_.back();
    free_slots_.pop_back();
  }
  expected_[transfer_id] = std::move(handoff);
  return Status::ok();
}

const IncomingHandoff* SequenceTable::expected(uint64_t transfer_id) const {
  auto it = expected_.find(transfer_id);
  return it == expected_.end() ? nullptr : &it->second;
}

std::optional<IncomingHandoff> SequenceTable::take_expected(uint64_t transfer_id) {
  auto it = expected_.find(transfer_id);
  if (it == expected_.end()) return std::nullopt;
  IncomingHandoff h = std::move(it->second);
  expected_.erase(it);
  return h;
}

// A received ring: the ring pool's ids, reaching the positions' last block and starting no later
// than the first key the next query (at handoff.positions) sees.
Status SequenceTable::check_received_ring(const IncomingHandoff& handoff) const {
  auto bad = [&handoff](const std::string& what) {
    return Status::invalid("transfer for sequence " + str(handoff.seq_id) + " " + what);
  };
  if (limits_.ring_blocks == 0)
    return handoff.ring.empty() ? Status::ok() : bad("comes with a ring, but this worker's KV pool has no rings");
  const uint64_t need = transfer_blocks(handoff.positions, limits_.block_tokens);
  const uint64_t end = handoff.ring_first + uint64_t{handoff.ring.size()};
  const uint64_t first_key =
      handoff.positions + 1 > limits_.ring_window ? handoff.positions + 1 - limits_.ring_window : 0;
  if (end < need || uint64_t{handoff.ring_first} * limits_.block_tokens > first_key)
    return bad("has a ring of blocks " + str(handoff.ring_first) + " .. " + str(end) + "; its next query at " +
               str(handoff.positions) + " needs blocks " + str(first_key / limits_.block_tokens) + " .. " + str(need));
  for (int32_t b : handoff.ring)
    if (b < 0 || static_cast<uint32_t>(b) >= limits_.ring_blocks)
      return bad("names ring block " + std::to_string(b) + ", outside the ring pool of " + str(limits_.ring_blocks));
  return Status::ok();
}

Status SequenceTable::receive(const IncomingHandoff& handoff, const HandoffState& state) {
  if (limits_.state_slots > 0 &&
      (handoff.state_slot < 0 || static_cast<uint32_t>(handoff.state_slot) >= limits_.state_slots))
    return Status::invalid("transfer for sequence " + str(handoff.seq_id) + " has no recurrent state slot");
  if (state.tokens.size() != handoff.positions)
    return Status::invalid("transfer for sequence " + str(handoff.seq_id) + " carries " + str(state.tokens.size()) +
                           " tokens for " + str(handoff.positions) + " positions");
  if (state.tail_end < -1 || state.tail_end > int64_t{handoff.positions})
    return Status::invalid("transfer for sequence " + str(handoff.seq_id) + " has tail_end " +
                           std::to_string(state.tail_end) + ", outside [-1, " + str(handoff.positions) + "]");
  if (uint64_t{handoff.blocks.size()} * limits_.block_tokens < handoff.positions)
    return Status::invalid("transfer for sequence " + str(handoff.seq_id) + " has " + str(handoff.blocks.size()) +
                           " blocks for " + str(handoff.positions) + " positions");
  TANDEM_RETURN_IF_ERROR(check_received_ring(handoff));
  Sequence& seq = sequences_[handoff.seq_id];
  if (seq.state_slot >= 0) free_slots_.push_back(seq.state_slot);  // a sequence it replaces
  seq.state_slot = handoff.state_slot;
  seq.blocks = handoff.blocks;
  seq.tail = handoff.tail;
  seq.tail_end = state.tail_end;
  seq.tokens.assign(state.tokens.begin(), state.tokens.end());
  seq.last = state.last;
  seq.sampling = state.sampling;
  seq.logprobs = state.logprobs;
  seq.prompt_len = state.prompt_len;
  seq.draft = workers::DraftLength(limits_.spec_tokens);
  seq.draft_pos = 0;  // the draft model's layers are not sent: it catches up here
  seq.ring = handoff.ring;
  seq.ring_first = handoff.ring_first;
  return Status::ok();
}

Result<OutgoingHandoff> SequenceTable::handoff_out(uint64_t seq_id, uint32_t positions, uint32_t ring_first) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return Status::invalid("sequence " + str(seq_id) + " is not held here");
  const Sequence& seq = it->second;
  if (positions > seq.tokens.size())
    return Status::invalid("sequence " + str(seq_id) + " holds " + str(seq.tokens.size()) + " positions, not " +
                           str(positions));
  if (seq.blocks.size() < transfer_blocks(positions, limits_.block_tokens))
    return Status::invalid("sequence " + str(seq_id) + " holds " + str(seq.blocks.size()) + " blocks, fewer than " +
                           str(positions) + " positions take");
  std::span<const int32_t> ring;
  if (limits_.ring_blocks > 0) {
    const uint64_t need = transfer_blocks(positions, limits_.block_tokens), end = seq.ring_first + seq.ring.size();
    if (ring_first < seq.ring_first || end < need || ring_first > need)
      return Status::invalid("sequence " + str(seq_id) + " holds ring blocks " + str(seq.ring_first) + " .. " +
                             str(end) + ", not the blocks " + str(ring_first) + " .. " + str(need) + " to send");
    ring = std::span<const int32_t>(seq.ring).subspan(ring_first - seq.ring_first, need - ring_first);
  }
  return OutgoingHandoff{std::span<const int32_t>(seq.tokens).first(positions),
                         seq.blocks,
                         seq.tail,
                         seq.last,
                         &seq.sampling,
                         seq.logprobs,
                         seq.tail_end,
                         seq.prompt_len,
                         ring,
                         ring_first,
                         seq.state_slot};
}

const Sequence* SequenceTable::find(uint64_t seq_id) const {
  auto it = sequences_.find(seq_id);
  return it == sequences_.end() ? nullptr : &it->second;
}

}  // namespace tandem::worker
