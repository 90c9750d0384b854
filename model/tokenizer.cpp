#include "model/tokenizer.h"

#include <algorithm>

#include "runtime/utf8.h"
#include "model/special_tokens.h"
#include "model/text_encoder.h"
#include "model/vocabulary.h"

namespace tandem::model {

struct Tokenizer::State {
  Vocabulary vocab;
  std::unique_ptr<TextEncoder> encoder;  // null when tandem cannot encode this vocabulary
  std::string refusal;                   // why, then
  SpecialTokenSplitter specials;
  std::vector<std::string> text;  // what each token reads as (DecodeOptions::special off)
};

namespace {

const std::vector<int32_t> kNoIds;
const std::string kNoName;

bool is_byte_level(const Vocabulary& v) {
  if (v.model != "llama") return false;
  for (int32_t t : v.byte_token)
    if (t < 0) return false;
  for (uint8_t a : v.attrs)
    if (a & (kAttrNormal | kAttrUserDefined)) return false;
  return true;
}

// The encoder for the vocabulary's model, or (null, the reason) when there is none; an error
// only for a malformed file.
Result<std::unique_ptr<TextEncoder>> choose_encoder(const Vocabulary& v, std::string& refusal) {
  const std::string prefix = "text prompts need the '" + v.model + "' tokenizer";
  const std::string suffix = ", which tandem does not support; pass token ids";
  if (v.model == "llama") return is_byte_level(v) ? make_byte_level_encoder(v) : make_spm_encoder(v);
  if (v.model == "gpt2" || v.model == "gemma4") {
    if (!v.has_merges) {
      refusal = prefix + ", but the file has no tokenizer.ggml.merges; pass token ids";
      return std::unique_ptr<TextEncoder>();
    }
    auto encoder = v.model == "gpt2" ? make_gpt2_encoder(v) : make_gemma4_encoder(v);
    if (encoder || encoder.status().code() == Code::kModelFile) return encoder;
    refusal = prefix + " with pre-tokenizer '" + v.pre + "' (tokenizer.ggml.pre)" + suffix;
    return std::unique_ptr<TextEncoder>();
  }
  refusal = prefix + suffix;
  return std::unique_ptr<TextEncoder>();
}

std::string token_text(const Vocabulary& v, size_t id) {
  const uint8_t a = v.attrs[id];
  if (a & (kAttrControl | kAttrUnknown)) return "";
  if (a & kAttrUserDefined) return v.pieces[id];
  if (a & kAttrNormal) return v.model == "gpt2" ? byte_level_piece_text(v.pieces[id]) : spm_piece_text(v.pieces[id]);
  if (a & kAttrByte) return std::string(1, static_cast<char>(static_cast<unsigned char>(v.byte_of_token[id])));
  return "";  // unused, undefined
}

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  auto state = std::make_shared<State>();
  auto vocab = Vocabulary::from_gguf(file);
  if (!vocab) return vocab.status();
  state->vocab = std::move(*vocab);
  const Vocabulary& v = state->vocab;
  auto encoder = choose_encoder(v, state->refusal);
  if (!encoder) return Status::model_file(file.path() + ": " + encoder.status().message());
  state->encoder = std::move(*encoder);
  state->specials = SpecialTokenSplitter(v);
  state->text.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) state->text[i] = token_text(v, i);
  Tokenizer tok;
  tok.state_ = std::move(state);
  return tok;
}

uint32_t Tokenizer::vocab_size() const { return static_cast<uint32_t>(state_ ? state_->vocab.size() : 0); }
int32_t Tokenizer::bos_id() const { return state_ ? state_->vocab.bos : -1; }
int32_t Tokenizer::eos_id() const { return state_ ? state_->vocab.eos : -1; }
int32_t Tokenizer::eot_id() const { return state_ ? state_->vocab.eot : -1; }
int32_t Tokenizer::eom_id() const { return state_ ? state_->vocab.eom : -1; }
const std::vector<int32_t>& Tokenizer::eog_ids() const { return state_ ? state_->vocab.eog : kNoIds; }
bool Tokenizer::is_eog(int32_t token) const {
  const auto& eog = eog_ids();
  return std::binary_search(eog.begin(), eog.end(), token);
}
bool Tokenizer::can_encode() const { return state_ && state_->encoder; }
const std::string& Tokenizer::kind() const { return state_ ? state_->vocab.model : kNoName; }
const std::string& Tokenizer::pre() const { return state_ ? state_->vocab.pre : kNoName; }
const std::string& Tokenizer::piece(int32_t token) const { return state_->vocab.pieces[token]; }
bool Tokenizer::strips_space_prefix() const {
  return state_ && state_->encoder && state_->encoder->adds_space_prefix();
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, EncodeOptions options) const {
  if (!can_encode()) return Status::invalid(state_ ? state_->refusal : "no vocabulary loaded");
  const State& s = *state_;
  const Vocabulary& v = s.vocab;
  if (!s.encoder->takes_any_bytes()) {
    for (size_t i = 0; i < text.size();) {
      const size_t len = runtime::utf8_sequence_length(text, i);
      if (len == 0) return Status::invalid("text is not valid UTF-8 (byte " + std::to_string(i) + ")");
      i += len;
    }
  }
  std::vector<Fragment> fragments;
  s.specials.split(v, text, options.parse_special, fragments);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (options.add_special && v.add_bos && v.bos >= 0) ids.push_back(v.bos);
  TANDEM_RETURN_IF_ERROR(s.encoder->encode(text, fragments, ids));
  if (options.add_special && v.add_eos && v.eos >= 0) ids.push_back(v.eos);
  return ids;
}

void Tokenizer::append_token_text(int32_t token, bool special, std::string& out) const {
  if (!state_ || !state_->vocab.has(token)) return;
  const std::string& text = state_->text[token];
  if (special && text.empty() && (state_->vocab.attrs[token] & (kAttrControl | kAttrUnknown))) {
    out += state_->vocab.pieces[token];
    return;
  }
  out += text;
}

std::string Tokenizer::decode(std::span<const int32_t> tokens) const { return decode(tokens, DecodeOptions{}); }

std::string Tokenizer::decode(std::span<const int32_t> tokens, DecodeOptions options) const {
  std::string out;
  StreamDecoder stream(*this, options);
  for (int32_t t : tokens) stream.push(t, out);
  stream.flush(out);
  return out;
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, DecodeOptions options) : tok_(&tokenizer), options_(options) {
  options_.strip_space_prefix = options.strip_space_prefix && tokenizer.strips_space_prefix();
  pending_.reserve(64);
}

void StreamDecoder::push(int32_t token, std::string& out) {
  const size_t before = pending_.size();
  tok_->append_token_text(token, options_.special, pending_);
  if (options_.strip_space_prefix && pending_.size() > before) {
    if (pending_[before] == ' ') pending_.erase(before, 1);
    options_.strip_space_prefix = false;
  }
  const size_t n = runtime::utf8_releasable_prefix(pending_);
  if (n == 0) return;
  out.append(pending_, 0, n);
  pending_.erase(0, n);
}

void StreamDecoder::flush(std::string& out) {
  out += pending_;
  pending_.clear();
}

}  // namespace tandem::model
