// What a worker keeps per live sequence, and the one place that turns a step plan into the
// engine's step: block tables and F32-window tails as the scheduler gave them, every token fed
// (the sampler's penalty history), the last sampled token, sampling parameters and seeds, and
// the handoffs of disaggregated KV, in and out. Pure: no sockets, no protobuf, no clock; the
// worker's actor moves messages around it (receive -> map -> apply -> forward -> sample ->
// commit -> reply). The scheduler owns everything else.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/sampling_params.h"
#include "runtime/status.h"
#include "runtime/step_plan.h"
#include "workers/draft_model.h"
#include "workers/engine/engine.h"
#include "workers/speculation.h"

namespace tandem::worker {

// The bounds a plan is checked against: the engine's model and the KV pool's shape.
struct TableLimits {
  uint32_t vocab_size = 0;
  uint32_t context_length = 0;
  uint32_t n_blocks = 0;  // pool blocks: ids [0, n_blocks)
  uint32_t block_tokens = 16;
  uint32_t tail_blocks = 0;                      // blocks of a sequence's F32 window (0: the pool keeps none)
  std::string kv_format = "F32";                 // named in errors about tails
  uint64_t max_step_tokens = uint64_t{1} << 20;  // Engine::forward refuses a larger step
  uint32_t spec_tokens = 0;  // drafts per speculating round at most (0: the worker does not speculate)
  // A draft model proposes the drafts (DraftModel), not prompt lookup: a round's drafts are
  // left for it to write (to_draft()) between apply() and the forward.
  bool draft_model = false;
  uint32_t draft_context_length = 0;  // the draft model's: it drafts no position past it
  // A hybrid model's recurrent state slots (engine::StatePool), ids [0, state_slots): each held
  // sequence takes one until it is dropped. 0: the model keeps no recurrent state.
  uint32_t state_slots = 0;
  // Rings (engine::KvPool::ring_blocks): the ring pool's blocks, ids [0, ring_blocks); every
  // plan entry then carries its sequence's whole ring. 0: no rings (a plan's ring is refused).
  uint32_t ring_blocks = 0;
  uint32_t ring_window = 0;  // the ring layers' window (ModelConfig::window); 0: no rings
};

// One live sequence as the worker holds it.
struct Sequence {
  std::vector<int32_t> blocks;  // the block table: position p is in blocks[p / block_tokens]
  std::vector<int32_t> tail;    // F32 window (engine::SeqStep::tail); empty: none
  int64_t tail_end = -1;        // engine::SeqStep::tail_end
  std::vector<int32_t> tokens;  // every position's token: its size is the sequence's position
  int32_t last = -1;            // the token sampled last, fed by a plan entry without tokens
  model::SamplingParams sampling;
  bool logprobs = false;
  uint32_t prompt_len = 0;  // tokens[prompt_len:] were generated (presence/frequency penalties)
  workers::DraftLength draft = workers::DraftLength(0);  // its next rounds' draft length (speculation)
  // With a draft model: positions [0, draft_pos) hold the draft model's KV for these tokens
  // (0 for a sequence new here, received or from the prefix cache: it catches up when it drafts).
  uint32_t draft_pos = 0;
  int32_t state_slot = -1;  // its recurrent state slot (TableLimits::state_slots); -1: none
  // Rings: the windowed layers' blocks of logical blocks ring_first .. (engine::SeqStep::ring),
  // as the last plan gave them (each plan sends the whole ring).
  std::vector<int32_t> ring;
  uint32_t ring_first = 0;
};

// A sampled plan entry of the applied step, in plan order.
struct SampleRequest {
  uint64_t seq_id = 0;
  uint32_t logits_row = 0;  // Engine::logits(row)
  const model::SamplingParams* sampling = nullptr;
  // Every token fed so far, this step's included: its size is the position being sampled.
  std::span<const int32_t> history;
  std::span<const int32_t> generated;  // the tail of history past the prompt
  // A speculating round: the drafts fed after the last sample (the tail of history). Row
  // logits_row + i holds the logits of the position after history's first size() - drafts + i
  // tokens: sampled with that prefix as its history, exactly as plain decoding would sample it.
  std::span<const int32_t> drafts = {};
  bool logprobs = false;  // the request reports each token's logprob
  // With a draft model at temperature > 0: each draft's distribution under the draft model
  // (drafts.size() rows of vocab_size floats), verified by the rejection rule; empty: drafts are
  // accepted while they equal the target's own samples.
  std::span<const float> q = {};
};

// A handoff the scheduler announced to this (decode) worker (v1::KvExpect): the blocks its
// transfer fills and what the transfer must carry.
struct IncomingHandoff {
  uint64_t seq_id = 0, nonce = 0, scheduler_epoch = 0;
  uint32_t positions = 0;
  std::string sender = {};  // the prefill worker's public key (Z85); empty without CurveZMQ
  std::vector<int32_t> blocks = {}, tail = {};
  // Rings: the ring reserved here, the windowed layers' blocks of logical blocks ring_first ..
  // (the window of its next query, at `positions`); the transfer fills them.
  std::vector<int32_t> ring = {};
  uint32_t ring_first = 0;
  int32_t state_slot = -1;  // the recurrent state slot expect() took for it (a hybrid model); -1: none
};

// The worker-side state a handoff carries along with the KV bytes (v1::KvTransfer).
struct HandoffState {
  std::span<const int32_t> tokens;  // every position's token
  int32_t last = -1;
  model::SamplingParams sampling;
  bool logprobs = false;
  uint32_t prompt_len = 0;
  int64_t tail_end = -1;
};

// What a (prefill) worker sends of a sequence: views into the table, valid until it changes.
struct OutgoingHandoff {
  std::span<const int32_t> tokens;  // the first `positions`
  std::span<const int32_t> blocks, tail;
  int32_t last = -1;
  const model::SamplingParams* sampling = nullptr;
  bool logprobs = false;
  int64_t tail_end = -1;
  uint32_t prompt_len = 0;
  // Rings: the windowed layers' blocks of logical blocks ring_first .. the positions' last (the
  // part of its ring the receiver asked for).
  std::span<const int32_t> ring = {};
  uint32_t ring_first = 0;
  int32_t state_slot = -1;  // its recurrent state slot (sent with the KV); -1: none
};

class SequenceTable {
 public:
  // `states`: a hybrid model's state pool (limits.state_slots of its slots), which commit()
  // rolls back past a round's rejected drafts; null without one (a hybrid then never speculates).
  explicit SequenceTable(const TableLimits& limits, engine::StatePool* states = nullptr);

  // Checks every entry of `plan` before changing anything (its `release` list is the caller's:
  // drop() those first). Refused, naming the sequence and the problem, with the table left as
  // it was: an unknown sequence without its first-appearance fields, a tail of the wrong size,
  // a sequence twice, a start past the positions held (a start before them rolls back), with
  // recurrent state slots (a hybrid model) also a rollback (only the worker's own rounds roll a
  // state back), a speculating round without the state pool, a new sequence that does not start
  // at position 0 without a state checkpoint to restore, a restore elsewhere, and more new sequences
  // than free slots, a
  // decode with no sampled token, a token or block id out of range, a block table too short
  // or past the context, a step larger than the engine takes. On success the step is staged
  // (steps(), to_sample()) until commit() or abort(); a staged table refuses another apply.
  // A plan of no entries stages nothing (steps() is empty: nothing to run or commit).
  [[nodiscard]] Status apply(const runtime::StepPlan& plan);
  // Engine::forward's argument for the staged step, in plan order (views into the table).
  std::span<const engine::SeqStep> steps() const { return {steps_.data(), staged_}; }
  // The staged entries that asked for a sample, in plan order.
  std::span<const SampleRequest> to_sample() const { return {samples_.data(), n_samples_}; }
  // With a draft model: the staged speculating rounds whose drafts it must write before the
  // forward (placeholders until then), with room for their q at temperature > 0.
  std::span<const workers::DraftJob> to_draft() const { return {drafting_.data(), n_drafting_}; }
  // The engine ran the staged step: `sampled` holds one token per to_sample() entry, in order
  // (a speculating round's last emitted token), and `accepted` (empty: none) how many of each
  // entry's drafts were accepted. Positions, histories, tails and last tokens advance; a
  // round's rejected drafts leave the history (their KV rows are stale, written over later) and
  // a hybrid's state is rolled back past them (StatePool::roll_back: draft() keeps every round
  // within reach of it); the table takes plans again.
  void commit(std::span<const int32_t> sampled, std::span<const uint32_t> accepted = {});
  // The engine refused the staged step: the table is as it was before apply() (a hybrid's
  // state too, where the step ran and a rollback reaches back to its start).
  void abort();
  bool staged() const { return staged_ > 0; }

  // Forgets a sequence (finished, cancelled, preempted) and any handoff announced for it, and
  // frees its state slot; an unknown id is nothing to do. Not while a step is staged.
  void drop(uint64_t seq_id);
  void drop_all();
  // Keeps `seq_id`'s first `positions` positions only (rejected draft tokens): its history
  // shortens, block-table entries past them are forgotten (the scheduler freed them), and its
  // last sample is forgotten (the next plan feeds tokens). The KV rows past them are stale and
  // never read: the next step writes over them; a hybrid's state is rolled back. Refused for an
  // unknown sequence, more positions than it holds, a hybrid's state that cannot roll back that
  // far (StatePool::roll_back), or while a step is staged.
  [[nodiscard]] Status trim(uint64_t seq_id, uint32_t positions);

  // Disaggregation, decode side. expect(): the scheduler announced a transfer (replacing one
  // under the same id); with recurrent state slots it takes one for the sequence's state (the
  // one it replaces held, if any), refused with the table unchanged when none is free.
  // take_expected(): it arrived; the announcement is consumed whatever the transfer holds, and
  // its state slot is the caller's until receive() succeeds or abandon() gives it back.
  // receive(): its KV is in `handoff.blocks` (its state in handoff.state_slot); the sequence now
  // lives here, replacing one under that id. Refused (the table unchanged) when the state does
  // not fit the announcement: a token count other than its positions, a tail_end outside them,
  // no state slot with recurrent state slots; with rings, a ring of ids outside the ring pool,
  // not reaching the positions' last block or starting after the first key its next query (at
  // `positions`) sees; without, any ring.
  [[nodiscard]] Status expect(uint64_t transfer_id, IncomingHandoff handoff);
  const IncomingHandoff* expected(uint64_t transfer_id) const;
  std::optional<IncomingHandoff> take_expected(uint64_t transfer_id);
  [[nodiscard]] Status receive(const IncomingHandoff& handoff, const HandoffState& state);
  void abandon(const IncomingHandoff& handoff);

  // Disaggregation, prefill side: what to send of `seq_id`'s first `positions` positions, with
  // rings its ring's logical blocks `ring_first` .. the positions' last. Refused when the
  // sequence is not held, holds fewer positions, or fewer blocks than they take, or its ring
  // does not hold those blocks (released already, or not reaching them).
  Result<OutgoingHandoff> handoff_out(uint64_t seq_id, uint32_t positions, uint32_t ring_first = 0) const;

  const Sequence* find(uint64_t seq_id) const;
  const TableLimits& limits() const { return limits_; }
  size_t size() const { return sequences_.size(); }
  // State slots not held by a sequence (TableLimits::state_slots of them when none is held).
  size_t free_state_slots() const { return free_slots_.size(); }
  size_t expected_handoffs() const { return expected_.size(); }

 private:
  // A sequence in the table, with apply()'s scratch mark (not part of its state).
  struct Held : Sequence {
    uint64_t checked = 0;  // the last apply() whose plan named it: a second entry is a duplicate
  };
  // One plan entry between apply and commit or abort: what abort needs to restore.
  struct Staged {
    uint64_t seq_id = 0;
    Held* seq = nullptr;
    bool fresh = false;
    size_t blocks_before = 0;
    uint32_t start_pos = 0;
    std::vector<int32_t> cut;         // tokens [start_pos, end) a rolled-back start overwrote
    std::vector<int32_t> cut_blocks;  // block-table entries keep_blocks dropped
    bool speculate = false;
    uint32_t drafts = 0;  // fed after the last sample
    uint32_t draft_pos_before = 0;
    model::SamplingParams sampling_before;
    bool logprobs_before = false;
    uint32_t prompt_len_before = 0;
  };
  Status check(const runtime::StepPlan& plan);
  Status check_entry(const runtime::SeqPlan& sp, const Sequence* seq, uint64_t& tokens) const;
  Status check_ring(const runtime::SeqPlan& sp, uint64_t end) const;
  Status check_received_ring(const IncomingHandoff& handoff) const;
  void stage(const runtime::SeqPlan& sp, size_t i, Held* held);
  // A speculating entry's drafts (appended to seq.tokens after its last sample): as many as its
  // DraftLength asks, within the plan's max_drafts and max_len, the context, its blocks, and
  // with an F32 window the block of the fed position (a rollback stays in the last written
  // block, which the window keeps exact), and with a recurrent state the rows its rollback
  // reaches (StatePool::rollback, drafts_within_chunk).
  uint32_t draft(const runtime::SeqPlan& sp, Sequence& seq);

  TableLimits limits_;
  engine::StatePool* states_ = nullptr;
  std::unordered_map<uint64_t, Held> sequences_;
  std::unordered_map<uint64_t, IncomingHandoff> expected_;  // by transfer id
  // The staged step; reused from step to step (no allocation once warm).
  std::vector<Staged> stage_;
  std::vector<engine::SeqStep> steps_;
  std::vector<SampleRequest> samples_;
  std::vector<workers::DraftJob> drafting_;
  std::vector<float> q_;  // the draft model's distributions of the staged drafts (temperature > 0)
  size_t n_drafting_ = 0, q_used_ = 0;
  std::vector<Held*> found_;     // check(): each entry's sequence, nullptr for a new one
  std::vector<uint64_t> fresh_;  // check(): the new sequences' ids, sorted
  uint64_t applies_ = 0;         // apply() calls, for Held::checked
  size_t staged_ = 0, n_samples_ = 0;
  uint32_t n_rows_ = 0;              // logits rows of the staged step
  std::vector<int32_t> free_slots_;  // state slots no sequence holds; the next taken is the back
};

}  // namespace tandem::worker
