// What the gateway knows of the model and of its callers: the model file's metadata (its
// name, context length, vocabulary and chat template; no tensor is read) and the API keys it
// accepts.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "gateway/api.h"
#include "model/chat_output.h"
#include "model/tokenizer.h"
#include "tandem/status.h"

namespace tandem::gateway {

struct ServedModel {
  ModelLimits limits;
  model::Tokenizer tokenizer;  // detokenize and the logprobs' token pieces
  // How chat output is split (model/chat_output.h), detected from tokenizer.chat_template:
  // tools kNone and no reasoning (no template, or one without markers) = the text is content.
  model::ChatOutputFormat chat_output;
};

// `name`: the served name; "" = general.name, else the file's stem. Errors: the file's
// (naming it), no <arch>.context_length.
[[nodiscard]] Result<ServedModel> load_served_model(const std::string& path, const std::string& name);

// Bearer keys: a file of lines "KEY [NAME]" ('#' starts a comment); NAME (default key-N, N its
// line) is the caller's identity in the access log and the scheduler's principal for its
// requests (per-principal limits and priority ranges).
class ApiKeys {
 public:
  // Errors: an unreadable file, a key shorter than 16 characters, a name longer than
  // kMaxPrincipalBytes or not printable ASCII, a key listed twice, no key.
  [[nodiscard]] static Result<ApiKeys> load(const std::string& path);
  bool empty() const { return keys_.empty(); }
  // The name of the key in an Authorization header value ("Bearer KEY"); nullptr when the
  // header holds no listed key. Compares in time independent of where keys differ.
  const std::string* find(std::string_view authorization) const;

 private:
  std::vector<std::pair<std::string, std::string>> keys_;  // key, name
};

}  // namespace tandem::gateway
