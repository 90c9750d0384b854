#include "gateway/served_model.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/gguf.h"
#include "runtime/wire.h"

namespace tandem::gateway {

Result<ServedModel> load_served_model(const std::string& path, const std::string& name) {
  auto file = model::GgufFile::open(path);
  if (!file) return file.status();
  auto tokenizer = model::Tokenizer::from_gguf(**file);
  if (!tokenizer) return tokenizer.status();
  ServedModel out{ModelLimits{}, std::move(tokenizer.value()), {}};
  if (auto chat_template = (*file)->get_string("tokenizer.chat_template")) {
    out.chat_output = model::detect_chat_output_format(*chat_template);
    model::bind_control_markers(out.tokenizer, out.chat_output);
  }
  const std::string arch = (*file)->get_string("general.architecture").value_or("llama");
  const auto context = (*file)->get_uint(arch + ".context_length");
  if (!context || *context == 0 || *context > UINT32_MAX)
    return Status::model_file(path + ": no usable " + arch + ".context_length");
  out.limits.context_length = static_cast<uint32_t>(*context);
  out.limits.vocab_size = out.tokenizer.vocab_size();
  out.limits.name = name;
  if (out.limits.name.empty()) out.limits.name = (*file)->get_string("general.name").value_or("");
  if (out.limits.name.empty()) out.limits.name = std::filesystem::path(path).stem().string();
  return out;
}

Result<ApiKeys> ApiKeys::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::invalid("--api-key-file: cannot read " + path);
  ApiKeys keys;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string key, name;
    if (!(words >> key)) continue;
    words >> name;
    const std::string where = "--api-key-file " + path + ":" + std::to_string(line_no);
    if (key.size() < 16) return Status::invalid(where + ": a key must have at least 16 characters");
    // The name is the scheduler's principal for the key's requests (Submit.principal).
    if (name.size() > runtime::kMaxPrincipalBytes ||
        !std::all_of(name.begin(), name.end(), [](unsigned char c) { return c > ' ' && c <= '~'; }))
      return Status::invalid(where + ": a key's name must be at most " + std::to_string(runtime::kMaxPrincipalBytes) +
                             " bytes of printable ASCII (it is the scheduler's principal for the key's requests)");
    for (const auto& [k, n] : keys.keys_)
      if (k == key) return Status::invalid(where + ": the key of " + n + " again");
    keys.keys_.emplace_back(key, name.empty() ? "key-" + std::to_string(line_no) : name);
  }
  if (keys.keys_.empty()) return Status::invalid("--api-key-file " + path + ": no key");
  return keys;
}

const std::string* ApiKeys::find(std::string_view authorization) const {
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.substr(0, kBearer.size()) != kBearer) return nullptr;
  const std::string_view given = authorization.substr(kBearer.size());
  const std::string* found = nullptr;
  for (const auto& [key, name] : keys_) {
    // Every key is compared whole, whatever matched before.
    unsigned diff = key.size() != given.size();
    for (size_t i = 0; i < key.size(); ++i) diff |= key[i] ^ (i < given.size() ? given[i] : 0);
    if (!diff) found = &name;
  }
  return found;
}

}  // namespace tandem::gateway
