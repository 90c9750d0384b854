#include "workers/draft_model.h"

#include <algorithm>

namespace tandem::workers {

namespace {

// The first difference between the two vocabularies, or empty.
std::string vocabulary_difference(const engine::Tokenizer& target, const engine::Tokenizer& draft) {
  if (target.vocab_size() != draft.vocab_size())
    return "its vocabulary has " + std::to_string(draft.vocab_size()) + " tokens, the target's " +
           std::to_string(target.vocab_size());
  for (uint32_t t = 0; t < target.vocab_size(); ++t) {
    const auto id = static_cast<int32_t>(t);
    if (target.piece(id) != draft.piece(id))
      return "token " + std::to_string(t) + " is '" + draft.piece(id) + "' there and '" + target.piece(id) +
             "' in the target's vocabulary";
  }
  return {};
}

Result<engine::Tokenizer> vocabulary_of(const std::string& path) {
  auto file = model::GgufFile::open(path);
  if (!file) return file.status();
  return engine::Tokenizer::from_gguf(**file);
}

// A hybrid draft model would need a state pool of its own, rolled back with draft_pos.
const char* const kHybridDraft = ": a hybrid (recurrent) draft model is not built (draft with an attention model)";

// The draft file's architecture, from its metadata: refused when it is a hybrid.
Status check_draft_architecture(const std::string& path) {
  auto file = model::GgufFile::open(path);
  if (!file) return file.status();
  auto config = model::read_model_config(**file);
  if (config && config->arch->hybrid()) return Status::invalid("--draft-model " + path + kHybridDraft);
  return Status::ok();
}

}  // namespace

Status check_draft_model_file(const std::string& model_path, const std::string& draft_path) {
  auto target = vocabulary_of(model_path);
  if (!target) return target.status();
  auto draft = vocabulary_of(draft_path);
  if (!draft) return Status::invalid("--draft-model " + draft_path + ": " + draft.status().message());
  const std::string diff = vocabulary_difference(*target, *draft);
  if (!diff.empty())
    return Status::invalid("--draft-model " + draft_path + " does not share the target model's vocabulary: " + diff);
  return check_draft_architecture(draft_path);
}

DraftModel::DraftModel(std::unique_ptr<engine::Engine> engine)
    : engine_(std::move(engine)), sampler_(engine_->config().vocab_size) {}

Result<std::unique_ptr<DraftModel>> DraftModel::load(const std::string& path, const engine::EngineOptions& options,
                                                     const engine::Engine& target) {
  auto eng = engine::Engine::load(path, options);
  if (!eng) return Status::invalid("--draft-model " + path + ": " + eng.status().message());
  if ((*eng)->config().arch->hybrid()) return Status::invalid("--draft-model " + path + kHybridDraft);
  const std::string diff = vocabulary_difference(target.tokenizer(), (*eng)->tokenizer());
  if (!diff.empty())
    return Status::invalid("--draft-model " + path + " does not share the target model's vocabulary: " + diff);
  if ((*eng)->config().vocab_size != target.config().vocab_size)
    return Status::invalid("--draft-model " + path + ": its logits have " +
                           std::to_string((*eng)->config().vocab_size) + " entries, the target's " +
                           std::to_string(target.config().vocab_size));
  return std::unique_ptr<DraftModel>(new DraftModel(std::move(eng.value())));
}

size_t DraftModel::block_bytes(uint32_t block_tokens) const {
  return engine::KvPool::bytes_per_block(engine_->config(), block_tokens);
}

Status DraftModel::make_pool(uint32_t n_blocks, uint32_t block_tokens) {
  auto pool = engine::KvPool::create(engine_->config(), n_blocks, block_tokens);
  if (!pool) return pool.status();
  pool_ = std::move(pool.value());
  return Status::ok();
}

void DraftModel::sample_row(const DraftJob& job, uint32_t row, uint32_t r, uint32_t penalty_window) {
  const size_t at = job.tokens.size() - job.k - 1, pos = at + 1 + r;
  const std::span<const int32_t> before = std::span<const int32_t>(job.tokens).first(pos);
  const std::span<const int32_t> history = before.subspan(pos > penalty_window ? pos - penalty_window : 0);
  const std::span<const int32_t> generated = before.subspan(std::min<size_t>(job.prompt_len, pos));
  const std::span<const float> logits = engine_->logits(row);
  const size_t vocab = engine_->config().vocab_size;
  const engine::Sample smp =
      job.q.empty() ? sampler_.sample(logits, *job.sampling, pos + engine::kDraftStream, history, generated)
                    : sampler_.distribution(logits, *job.sampling, pos + engine::kDraftStream, history, generated,
                                            job.q.subspan(size_t{r} * vocab, vocab));
  job.tokens[pos] = smp.token;
}

Status DraftModel::draft(std::span<const DraftJob> jobs, uint32_t penalty_window) {
  if (!pool_) return Status::error(Code::kInternal, "the draft model has no KV pool");
  uint32_t rounds = jobs.empty() ? 0 : 1;
  for (const DraftJob& j : jobs) rounds = std::max(rounds, j.k);
  // Round 0 feeds each sequence from its valid draft KV through its last known token (a job of
  // no drafts only catches up); round r > 0 feeds draft r - 1 (at position at + r). Each
  // round's logits give draft r.
  for (uint32_t r = 0; r < rounds; ++r) {
    steps_.clear();
    job_of_.clear();
    for (uint32_t i = 0; i < jobs.size(); ++i) {
      const DraftJob& j = jobs[i];
      if (r > 0 && j.k <= r) continue;
      const auto at = static_cast<uint32_t>(j.tokens.size() - j.k - 1);
      const uint32_t from = r == 0 ? std::min(*j.draft_pos, at) : at + r;
      const std::span<const int32_t> feed = std::span<const int32_t>(j.tokens).subspan(from, at + r + 1 - from);
      steps_.push_back(engine::SeqStep{feed, from, j.blocks, j.k > 0 ? 1u : 0u});
      job_of_.push_back(i);
    }
    TANDEM_RETURN_IF_ERROR(engine_->forward(steps_, *pool_));
    uint32_t row = 0;  // logits rows: one per step that drafts
    for (uint32_t s = 0; s < steps_.size(); ++s)
      if (steps_[s].n_logits > 0) sample_row(jobs[job_of_[s]], row++, r, penalty_window);
  }
  // Written: through at, and drafts 0 .. k - 2 at at + 1 .. at + k - 1.
  for (const DraftJob& j : jobs) *j.draft_pos = static_cast<uint32_t>(j.tokens.size() - (j.k > 0 ? 1 : 0));
  engine_->rest();  // its threads sleep while the target's run the verification
  return Status::ok();
}

ModelDrafter::ModelDrafter(DraftModel& model, uint32_t max_k, uint32_t context)
    : model_(model), max_k_(max_k), length_(max_k) {
  const uint32_t n = (context + 15) / 16;
  for (uint32_t b = 0; b < n; ++b) blocks_.push_back(static_cast<int32_t>(b));
}

uint32_t ModelDrafter::draft(std::span<const int32_t> history, std::span<int32_t> out) {
  at_ = static_cast<uint32_t>(history.size() - 1);
  const uint32_t context = model_.engine().config().context_length;  // it writes up to at + k - 1
  const auto k =
      static_cast<uint32_t>(std::min<size_t>({out.size(), max_k_, length_.next(), context > at_ ? context - at_ : 0}));
  if (k == 0 || sampling_ == nullptr) return 0;
  tokens_.assign(history.begin(), history.end());
  tokens_.resize(history.size() + k);
  const size_t vocab = model_.engine().config().vocab_size;
  q_.resize(sampling_->temperature > 0.0f ? k * vocab : 0);
  const DraftJob job{tokens_, k, blocks_, &draft_pos_, sampling_, prompt_len_, q_};
  if (!model_.draft({&job, 1}, 64)) return 0;
  std::copy(tokens_.end() - k, tokens_.end(), out.begin());
  return k;
}

void ModelDrafter::record(uint32_t drafted, uint32_t accepted) {
  length_.record(drafted, accepted);
  if (drafted > 0) draft_pos_ = std::min(draft_pos_, at_ + 1 + accepted);
}

std::span<const float> ModelDrafter::q(uint32_t i) const {
  const size_t vocab = model_.engine().config().vocab_size;
  if (q_.size() < (size_t{i} + 1) * vocab) return {};
  return std::span<const float>(q_).subspan(size_t{i} * vocab, vocab);
}

}  // namespace tandem::workers
