// The model engine: a decoder of any architecture of model/architecture.h (llama, qwen2,
// qwen3) loaded from GGUF, run one ragged batch per step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/status.h"
#include "workers/engine/model_file.h"
#include "workers/engine/huge_pages.h"
#include "workers/engine/greedy_screen.h"
#include "workers/engine/kernels.h"
#include "workers/engine/kv_cache.h"
#include "workers/engine/state_pool.h"
#include "workers/engine/thread_pool.h"

namespace tandem::engine {

enum class GemmBackend {
  kPacked,    // tandem's packed kernels: bitwise batch-invariant, fast at every M (default)
  kOpenBlas,  // cblas_sgemm over all rows of the step
};

// How a hybrid's Gated DeltaNet layers run the delta rule (docs/HYBRID.md). Both are bitwise
// the same for any batch and chunking; they differ from each other in rounding.
enum class DeltaForm {
  kChunked,       // the WY form on the 64-token grid: a prompt's grid chunks are GEMMs (default)
  kTokenByToken,  // one recurrent step per token (benchmarks and cross-checks)
};

// Which logit rows a forward pass computes. kAll: every row of every sequence. kFirstPerSequence:
// only each sequence's first logit row; the others wait for compute_logit_rows, so a
// speculating round whose first draft is rejected never pays the output matrix for the rows after
// it (the head is most of a row's cost on a small model with a large vocabulary).
// kNone: none; each row is computed (compute_logit_rows) or screened for its greedy token
// (screen_rows) when its caller needs it.
enum class LogitRows : uint8_t { kAll, kFirstPerSequence, kNone };

struct EngineOptions {
  uint32_t threads = 2;
  GemmBackend gemm = GemmBackend::kPacked;
  DeltaForm delta = DeltaForm::kChunked;
  // Build a greedy screen (greedy_screen.h) where it pays: a head of F32, F16 or BF16 weights
  // that outweighs the layers (head_outweighs_layers), K a multiple of 32, no final soft cap.
  // TANDEM_GREEDY_SCREEN=0 in the environment turns it off too (benchmarks: with and without).
  bool greedy_screen = true;
};

// Whether one row through the output matrix takes more multiply-adds than through the layers
// (a large vocabulary on small layers: the trained test models, Gemma 3 270M; not Llama or Qwen
// at 0.5B and up).
bool head_outweighs_layers(const ModelConfig& config);

// One sequence's part of a step: process `tokens` at positions [start_pos, start_pos+n).
// The cache must already hold positions [0, start_pos) in `blocks`, and `blocks` must cover
// start_pos + n positions. K/V of the new tokens are written into those blocks.
struct SeqStep {
  std::span<const int32_t> tokens;
  uint32_t start_pos = 0;
  std::span<const int32_t> blocks;
  // Logits are produced for the last `n_logits` tokens of this chunk (0: none, e.g. a
  // prompt chunk that is not the last; 1: next-token; more: speculative verification).
  uint32_t n_logits = 1;
  // The sequence's tail (KvPool::tail_blocks ids) when the pool keeps an F32 window;
  // empty: attention reads every key from the codes. tail_end: the end position of the last
  // step that wrote this tail (-1: nothing written yet, e.g. a new sequence, or one whose
  // first blocks came from the prefix cache). The tail holds the F32 K/V of the window as of
  // tail_end: the f32_window blocks up to the last position written, positions
  // [block_tokens * ((tail_end - 1) / block_tokens + 1 - f32_window), tail_end). Window
  // positions it does not hold (a new tail, or a rollback past that) are read back from the
  // codes. Set tail_end = start_pos + tokens.size() after each successful forward; it must be
  // -1 or within [0, context length].
  std::span<const int32_t> tail = {};
  int64_t tail_end = -1;
  // A hybrid model's recurrent state slot (StatePool): at start_pos 0 the engine zeroes it,
  // otherwise it must hold exactly start_pos positions (a speculating round's rejected drafts are
  // taken out by StatePool::roll_back). -1: none (models without recurrent layers).
  int32_t state_slot = -1;
  // A pool with rings (KvPool::ring_blocks): the windowed layers' blocks of logical blocks
  // ring_first .. ceil(end / block_tokens) - 1 (ids in the ring region). Blocks before
  // ring_first were released: the step's first query must not see them
  // (ring_first * block_tokens <= start_pos + 1 - W). Ignored without rings.
  std::span<const int32_t> ring = {};
  uint32_t ring_first = 0;
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> load(const std::string& path, const EngineOptions& options = {});
  ~Engine();

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const EngineOptions& options() const { return options_; }
  // Bytes of weights one forward pass streams (all matrices + norms; the embedding rows
  // read are negligible): the batch-1 decode floor is this over memory bandwidth.
  size_t weight_bytes_per_step() const { return weight_bytes_; }
  // FLOPs of the weight GEMMs for `tokens` rows of which `logit_rows` go through the head.
  double gemm_flops(uint64_t tokens, uint64_t logit_rows) const;

  // One ragged forward pass over every sequence in `step`. Errors (nothing written to the
  // cache on error): empty step or chunk, token id out of range, a chunk running past the
  // context length, a block table too short or naming a block outside the pool; for a hybrid
  // model (config().arch->hybrid()) also no `states`, a slot outside it or named twice, or a
  // slot whose state is not at the chunk's start_pos (to go back, StatePool::roll_back first).
  Status forward(std::span<const SeqStep> step, KvPool& pool, StatePool* states = nullptr,
                 LogitRows logit_rows = LogitRows::kAll);
  // Computes the logits of `rows`, rows of the previous forward that it left out
  // (LogitRows::kFirstPerSequence), in one pass over the output matrix. The packed kernels are
  // batch-invariant, so a row's logits are bitwise what forward(kAll) gives it. Errors: a row
  // outside the step, or one already computed.
  Status compute_logit_rows(std::span<const uint32_t> rows);

  // Greedy rows without their logits (greedy_screen.h): screens_greedy() when this engine built a
  // screen. screen_rows screens `rows` of the previous forward (one pass over the screen's 8-bit
  // head, on the pool); greedy_token(row, thread) is then that row's greedy token, bitwise what
  // the argmax of its logits gives (the lowest id holding the largest; Kernels::argmax), from
  // the few candidates the screen's bound leaves. greedy_token may run on the compute threads at
  // once, each with its own `thread`. Errors: a row outside the step, or one screened already.
  bool screens_greedy() const { return screen_ != nullptr; }
  Status screen_rows(std::span<const uint32_t> rows);
  int32_t greedy_token(uint32_t row, uint32_t thread);
  uint32_t logit_rows_screened() const { return screened_; }  // of logit_rows(), so far

  // Logits of the previous forward: rows in step order, n_logits rows per sequence. A row is
  // readable once computed (every row after forward(kAll)).
  uint32_t logit_rows() const { return n_logit_rows_; }
  uint32_t logit_rows_computed() const { return logits_filled_; }  // of logit_rows(), so far
  std::span<const float> logits(uint32_t row) const { return {logit_at_[row], config_.vocab_size}; }

  // Called on the forward pass's thread after every layer: a long step (a prompt chunk on a
  // loaded machine) lets its caller do what must not wait for the whole step, such as a
  // worker's heartbeat. Empty: nothing is called.
  void set_between_layers(std::function<void()> hook) { between_layers_ = std::move(hook); }

  // The caller has no step to run right away (e.g. a worker waiting for its next plan):
  // the compute threads sleep instead of spinning, leaving the cores to other threads.
  void rest() { pool_->rest(); }

  // The compute threads, for work between forward passes (sampling a step's rows): fn(begin,
  // end, thread) over [0, n), thread in [0, threads()).
  uint32_t threads() const { return pool_->size(); }
  void parallel_for(uint32_t n, FunctionRef<void(uint32_t, uint32_t, uint32_t)> fn) { pool_->parallel_for(n, fn); }

  // Benchmark hook: run only the weight GEMMs of a step of `tokens` rows (same shapes,
  // same threads), to measure what the rest of the forward pass costs on top.
  void run_gemms_only(uint32_t tokens, uint32_t logit_rows);

 private:
  struct Matrix;  // a weight matrix in the backend's layout
  struct Layer;
  Engine() = default;
  Status load_weights(const GgufFile& file);
  void matmul(const Matrix& w, const float* a, size_t lda, uint32_t m, float* c);
  void quantize_activations(const Matrix& w, const float* a, size_t lda, uint32_t m);
  void reserve_scratch(uint32_t tokens, uint32_t logit_rows, uint32_t max_keys);
  // What a step needs, from its checks: rows, logit rows, the longest sequence, F32 window rows.
  struct StepShape {
    uint64_t tokens = 0, logit_rows = 0;
    uint32_t max_keys = 0;
    uint64_t window_rows = 0, read_back_rows = 0;  // F32 window: row pointers, rows it may read back
    uint64_t ring_entries = 0;                     // rings: logical table entries of the step
  };
  Status check_ring(const SeqStep& q, const KvPool& pool, uint64_t end) const;
  // The block table layer l reads sequence s from: its blocks, or (a ring layer) its logical
  // ring table, whose released entries repeat ring[0] (masked keys: their probability is 0).
  const int32_t* layer_table(std::span<const SeqStep> step, const KvPool& pool, uint32_t l, size_t s) const {
    return pool.ring_layer(l) ? ring_tables_.data() + seq_ring_at_[s] : step[s].blocks.data();
  }
  void lay_out_rings(std::span<const SeqStep> step, const KvPool& pool, const StepShape& shape);
  // The stages of forward(): every check before anything is written; scratch, embeddings and
  // window geometry; then per layer the attention block (norm, QKV, RoPE + KV store,
  // attention, output projection, residual) and the feed-forward block; then the logits.
  Result<StepShape> check_step(std::span<const SeqStep> step, const KvPool& pool, const StatePool* states) const;
  void lay_out_step(std::span<const SeqStep> step, const KvPool& pool, const StepShape& shape);
  void position_qk(const Layer& layer, float* qkv_row, uint32_t pos) const;
  void rope_and_store(std::span<const SeqStep> step, KvPool& pool, uint32_t layer, uint32_t tokens);
  // The most consecutive rows of one sequence a work item of attend() hands the kernel at once.
  static constexpr uint32_t kAttentionRows = 8;
  void attend(std::span<const SeqStep> step, const KvPool& pool, uint32_t layer, uint32_t tokens, bool window_layer,
              uint32_t max_keys);
  void attention_block(std::span<const SeqStep> step, KvPool& pool, uint32_t layer, const StepShape& shape);
  void feed_forward(const Layer& layer, uint32_t tokens);
  void add_residual(const std::vector<float>& post_norm, uint32_t tokens);
  // Hybrid (qwen35) layers: a Gated DeltaNet block; the gated query's split and output gate.
  Status check_states(std::span<const SeqStep> step, const StatePool* states) const;
  void recurrent_block(std::span<const SeqStep> step, StatePool& states, uint32_t layer, uint32_t tokens);
  void conv_inputs(std::span<const SeqStep> step, const Layer& layer, StatePool& states, uint32_t tokens);
  void store_chunk_keys(std::span<const SeqStep> step, StatePool& states, const Layer& layer, bool first);
  void delta_heads(std::span<const SeqStep> step, StatePool& states, const Layer& layer);
  void split_gated_query(uint32_t tokens);
  void apply_output_gate(uint32_t tokens);
  void compute_logits(std::span<const SeqStep> step, LogitRows which);
  void head_rows(std::span<const uint32_t> rows);  // the output matrix over logit_in_'s `rows`
  void point_windows(std::span<const SeqStep> step, KvPool& pool, uint32_t layer);
  void save_tails(std::span<const SeqStep> step, KvPool& pool, uint32_t layer);
  // The first block of the F32 window of a query at `pos`.
  static uint32_t window_first(uint32_t pos, uint32_t bt, uint32_t window) {
    return pos / bt + 1 >= window ? pos / bt + 1 - window : 0;
  }
  // Positions [tail_held_from, start_pos) of the window are in the tail (SeqStep::tail_end:
  // it holds the window of the last position written, [window_first(tail_end - 1) * bt,
  // tail_end), which also covers the window of any position up to tail_end, so a rollback
  // within the last written block is exact); INT64_MAX when it holds none.
  static int64_t tail_held_from(const SeqStep& q, uint32_t bt, uint32_t window) {
    if (q.tail_end <= 0 || q.tail_end < q.start_pos) return INT64_MAX;  // also -1: a new tail
    return int64_t{window_first(static_cast<uint32_t>(q.tail_end - 1), bt, window)} * bt;
  }

  EngineOptions options_;
  ModelConfig config_;
  Tokenizer tokenizer_;
  std::unique_ptr<ThreadPool> pool_;
  const kernels::Kernels* kernels_ = nullptr;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<Matrix> output_;
  std::unique_ptr<GreedyScreen> screen_;    // null: no greedy screen (EngineOptions::greedy_screen)
  WeightArena arena_;                       // the packed matrices (F32, F16/BF16 panels); quantized ones stay in file_
  std::unique_ptr<GgufFile> file_;          // mapped: quantized matrices and the embedding point into it
  const GgufTensor* embeddings_ = nullptr;  // token_embd.weight [vocab][dim], any accepted type
  std::vector<float> output_norm_;
  std::vector<float> rope_;      // [context][head_dim]: cos, sin of each pair (scaling and magnitude included)
  std::vector<float> rope_swa_;  // the windowed layers' table (docs/WINDOWS.md); empty: no windows
  float embed_scale_ = 1.0f;     // Gemma: sqrtf(dim) on the token embeddings
  std::function<void()> between_layers_;
  size_t weight_bytes_ = 0;

  // Scratch, grown to the largest step seen; never per token.
  uint32_t cap_tokens_ = 0, cap_logit_rows_ = 0, cap_keys_ = 0;
  // A matmul's activations quantized for its quantized parts (32- and 256-element blocks).
  struct ActBuffer {
    std::vector<int8_t> qs;
    std::vector<float> d;
    std::vector<int16_t> sums;
    kernels::QuantRows rows;
    uint32_t m = 0;
    const float* source = nullptr;
  };
  ActBuffer act32_, act256_;
  std::vector<uint16_t> act_bf16_;  // activation rows rounded to BF16 for kBf16Pairs parts
  const float* act_bf16_source_ = nullptr;
  std::vector<float> x_, xn_, qkv_, attn_, ffn_, logit_in_, logits_;
  // Where each logit row of the step is in logits_ (nullptr: not computed yet); rows are
  // computed in any order, filling logits_ from the front: logits_filled_ rows so far.
  std::vector<const float*> logit_at_;
  std::vector<float> head_in_;        // the rows compute_logit_rows gathers from logit_in_
  std::vector<uint32_t> first_rows_;  // each sequence's first logit row (kFirstPerSequence)
  uint32_t logits_filled_ = 0;
  // The greedy screen's rows (screen_rows): screen_slot_[row] its slot (-1: not screened), slot i's
  // screening logits at screen_out_[i * vocab] and bound factors screen_he_[2 i], [2 i + 1]
  // (NaN: the row is not finite, greedy_token takes the full row); per thread, the chunks'
  // upper bounds and a full row of logits. The activations quantized: screen_qs_, screen_d_.
  std::vector<int32_t> screen_slot_;
  std::vector<float> screen_out_, screen_he_, screen_upper_, screen_full_, screen_d_;
  std::vector<int8_t> screen_qs_;
  std::vector<int16_t> screen_sums_;
  uint32_t screened_ = 0;
  void build_screen();
  void exact_panel(const float* x, uint32_t panel, float* out) const;  // the head's logits of one panel
  // Hybrid: a layer's first GEMM output, rows of its width (gated q|k|v, or delta-net q|k|v|z|beta|alpha), the
  // conv outputs [T][channels] and the gates [T][2 * V heads] (g, then beta).
  std::vector<float> mix_, conv_out_, gates_;
  uint32_t mix_width_ = 0;            // the widest layer's row: mix_'s capacity per token
  uint32_t mix_stride_ = 0;           // this layer's row (its fused matrix's n)
  std::vector<float> attn_scratch_;   // per thread scores
  std::vector<uint32_t> attn_runs_;   // attend(): the first row of each run, then the row count
  std::vector<float> delta_scratch_;  // per thread, hybrid::chunk_scratch_floats each (hybrids)
  std::vector<uint32_t> row_seq_, row_pos_;
  // F32 windows of the step (sequences with a tail, quantized layers): per sequence, row
  // pointers for its positions [window_first(start) * bt, end), [kv head]{K rows, V rows};
  // seq_window_ says where each sequence's are. read_back_: rows the tails do not hold,
  // dequantized (K then V, head_dim floats each).
  struct SeqWindow {
    int64_t at = -1;     // index of its first pointer in window_rows_ (-1: no tail)
    uint32_t first = 0;  // its first window position, window_first(start_pos) * bt
    uint32_t n = 0;      // positions [first, end): pointers per KV head for K, then as many for V
    const float** rows(std::vector<const float*>& all, uint32_t h) const {
      return &all[static_cast<size_t>(at) + size_t{h} * 2 * n];
    }
  };
  std::vector<const float*> window_rows_;
  std::vector<float> read_back_;
  std::vector<SeqWindow> seq_window_;
  std::vector<uint32_t> seq_row0_;    // first row of each sequence in the step
  std::vector<int32_t> ring_tables_;  // rings: each sequence's logical table (grows only)
  std::vector<size_t> seq_ring_at_;
  uint32_t n_logit_rows_ = 0;
};

}  // namespace tandem::engine
