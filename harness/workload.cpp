// Workloads: synthetic prompts (token ids or words, optional shared prefixes) or a JSONL dataset,
// each request made deterministically from (seed, index).
#include <algorithm>
#include <fstream>
#include <random>

#include "runtime/json_value.h"
#include "tandem/bench.h"

namespace tandem::bench {

namespace {

constexpr int32_t kFirstTokenId = 3, kTokenIdEnd = 259;  // byte tokens exist in every byte-level vocabulary

const char* const kWords[] = {"the",  "of",   "and",  "to",  "in",   "is",   "you", "that", "it",    "he",
                              "was",  "for",  "on",   "are", "as",   "with", "his", "they", "at",    "be",
                              "this", "have", "from", "or",  "one",  "had",  "by",  "word", "but",   "not",
                              "what", "all",  "were", "we",  "when", "your", "can", "said", "there", "use"};

uint32_t pick(const LengthRange& r, std::mt19937_64& rng) {
  if (r.hi <= r.lo) return r.lo;
  return std::uniform_int_distribution<uint32_t>(r.lo, r.hi)(rng);
}

}  // namespace

Result<LengthRange> parse_length_range(const std::string& text) {
  auto parse_one = [](const std::string& s, uint32_t& out) {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return false;
    out = static_cast<uint32_t>(std::stoul(s));
    return true;
  };
  LengthRange r;
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    if (!parse_one(text, r.lo)) return Status::invalid("length must be N or A:B, got '" + text + "'");
    r.hi = r.lo;
  } else if (!parse_one(text.substr(0, colon), r.lo) || !parse_one(text.substr(colon + 1), r.hi) || r.lo > r.hi) {
    return Status::invalid("length range must be A:B with A <= B, got '" + text + "'");
  }
  return r;
}

// {"prompt": "..."} or {"prompt_tokens": [...]}, and "output_len"; other keys are ignored.
Result<Workload::Entry> Workload::parse_entry(const std::string& line) {
  auto json = runtime::parse_json(line);
  if (!json) return json.status();
  if (!json->is_object()) return Status::invalid("not a JSON object");
  Entry out;
  if (const auto* prompt = json->find("prompt")) {
    if (!prompt->is_string()) return Status::invalid("\"prompt\" must be a string");
    out.text = prompt->as_string();
  }
  if (const auto* tokens = json->find("prompt_tokens")) {
    if (!tokens->is_array()) return Status::invalid("\"prompt_tokens\" must be an array of token ids");
    for (const auto& t : tokens->as_array()) {
      if (!t.is_number() || t.as_double() < 0 || t.as_double() > INT32_MAX)
        return Status::invalid("bad token id in \"prompt_tokens\"");
      out.tokens.push_back(static_cast<int32_t>(t.as_double()));
    }
  }
  if (const auto* len = json->find("output_len")) {
    if (!len->is_number() || len->as_double() < 1 || len->as_double() > 1e7)
      return Status::invalid("\"output_len\" must be a positive integer");
    out.output_len = static_cast<uint32_t>(len->as_double());
  }
  return out;
}

Result<Workload> Workload::create(WorkloadOptions options) {
  if (options.cancel_fraction < 0 || options.cancel_fraction > 1)
    return Status::invalid("--cancel-fraction must be in [0, 1]");
  if (options.prefix_groups == 0) return Status::invalid("--prefix-groups must be >= 1");
  if (options.shared_prefix > 0 && options.dataset.empty() && options.input_len.lo <= options.shared_prefix)
    return Status::invalid("--input-len (" + std::to_string(options.input_len.lo) + ") must exceed --shared-prefix (" +
                           std::to_string(options.shared_prefix) +
                           "): a prompt is its shared prefix plus unique tokens");
  if (options.output_len.lo == 0 && options.dataset.empty()) return Status::invalid("--output-len must be >= 1");
  Workload w;
  w.options_ = options;
  if (!options.dataset.empty()) {
    std::ifstream in(options.dataset);
    if (!in) return Status::invalid("cannot read --dataset " + options.dataset);
    std::string line;
    size_t lineno = 0;
    while (std::getline(in, line)) {
      const std::string where = options.dataset + ":" + std::to_string(++lineno) + ": ";
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      auto entry = parse_entry(line);
      if (!entry) return Status::invalid(where + entry.status().message());
      if (entry->text.empty() && entry->tokens.empty())
        return Status::invalid(where + "needs \"prompt\" or \"prompt_tokens\"");
      if (options.text_prompts && entry->text.empty())
        return Status::invalid(where + "needs a text \"prompt\": this target sends text (chat, or no --token-prompts)");
      w.dataset_.push_back(std::move(entry.value()));
    }
    if (w.dataset_.empty()) return Status::invalid("--dataset " + options.dataset + " has no requests");
  }
  std::mt19937_64 rng(options.seed ^ 0x5eedf00dULL);
  std::uniform_int_distribution<int32_t> id(kFirstTokenId, kTokenIdEnd - 1);
  for (uint32_t g = 0; options.shared_prefix > 0 && g < options.prefix_groups; ++g) {
    std::vector<int32_t> p(options.shared_prefix);
    for (auto& t : p) t = id(rng);
    w.prefixes_.push_back(std::move(p));
  }
  return w;
}

BenchRequest Workload::make(uint64_t index) const {
  std::mt19937_64 rng(options_.seed * 0x9E3779B97F4A7C15ULL + index * 0xBF58476D1CE4E5B9ULL + 1);
  BenchRequest r;
  r.index = index;
  r.ignore_eos = options_.ignore_eos;
  r.temperature = options_.temperature;
  r.logit_bias = options_.logit_bias;
  r.seed = options_.seed * 1'000'003 + index;
  std::vector<int32_t> tokens;
  if (!dataset_.empty()) {
    const Entry& e = dataset_[index % dataset_.size()];
    r.prompt_text = e.text;
    r.prompt_tokens = e.tokens;
    r.max_tokens = e.output_len > 0 ? e.output_len : std::max<uint32_t>(1, pick(options_.output_len, rng));
    r.input_tokens = !e.tokens.empty() ? static_cast<uint32_t>(e.tokens.size()) : 0;
  } else {
    const uint32_t len = pick(options_.input_len, rng);
    r.max_tokens = std::max<uint32_t>(1, pick(options_.output_len, rng));
    std::uniform_int_distribution<int32_t> id(kFirstTokenId, kTokenIdEnd - 1);
    if (!prefixes_.empty()) {  // the prompt's first shared_prefix tokens; len counts them
      const auto& p = prefixes_[index % prefixes_.size()];
      tokens.insert(tokens.end(), p.begin(), p.end());
    }
    while (tokens.size() < len) tokens.push_back(id(rng));
    r.input_tokens = static_cast<uint32_t>(tokens.size());
    if (!options_.text_prompts) {
      r.prompt_tokens = std::move(tokens);
    } else {  // one common English word per token id (about one token each in BPE vocabularies)
      for (size_t i = 0; i < tokens.size(); ++i) {
        if (i) r.prompt_text += ' ';
        r.prompt_text += kWords[static_cast<size_t>(tokens[i]) % (sizeof kWords / sizeof kWords[0])];
      }
    }
  }
  if (options_.cancel_fraction > 0 && std::uniform_real_distribution<double>(0, 1)(rng) < options_.cancel_fraction)
    r.cancel_after = std::max<uint32_t>(1, options_.cancel_after);
  return r;
}

}  // namespace tandem::bench
