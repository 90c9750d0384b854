#include "model/vocab_import.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "model/pretokenizer.h"
#include "runtime/json_value.h"

namespace tandem::model {

namespace {

using runtime::JsonValue;

// GGUF token types (gguf-py's TokenType).
enum TokenType : int64_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

GgufValue string_value(std::string s) { return GgufValue{GgufValueType::kString, GgufValueType::kU8, std::move(s)}; }
GgufValue u32_value(uint64_t v) { return GgufValue{GgufValueType::kU32, GgufValueType::kU8, v}; }
GgufValue bool_value(bool v) { return GgufValue{GgufValueType::kBool, GgufValueType::kU8, v}; }
GgufValue strings_value(std::vector<std::string> v) {
  return GgufValue{GgufValueType::kArray, GgufValueType::kString, std::move(v)};
}
GgufValue ints_value(std::vector<int64_t> v) {
  return GgufValue{GgufValueType::kArray, GgufValueType::kI32, std::move(v)};
}
GgufValue floats_value(std::vector<double> v) {
  return GgufValue{GgufValueType::kArray, GgufValueType::kF32, std::move(v)};
}

Result<JsonValue> read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::model_file(path + ": cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  auto json = runtime::parse_json(ss.str());
  if (!json) return Status::model_file(path + ": " + json.status().message());
  return json;
}

Result<VocabularyKeys> from_gguf(const std::string& path) {
  auto file = GgufFile::open(path);
  if (!file) return file.status();
  VocabularyKeys v;
  for (const std::string& key : (*file)->keys_in_file_order()) {
    if (key.rfind("tokenizer.", 0) == 0) v.keys.emplace_back(key, *(*file)->find(key));
  }
  const GgufValue* tokens = (*file)->find("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->array_type != GgufValueType::kString)
    return Status::model_file(path + ": no tokenizer.ggml.tokens: not a vocabulary");
  v.size = static_cast<uint32_t>(std::get<std::vector<std::string>>(tokens->value).size());
  return v;
}

// gguf-py's does_token_look_special: added tokens some models leave "not special" that are.
bool looks_special(const std::string& t) {
  auto wrapped = [&](std::string_view open, std::string_view close) {
    return t.size() >= open.size() + close.size() && t.compare(0, open.size(), open) == 0 &&
           t.compare(t.size() - close.size(), close.size(), close) == 0;
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wrapped("<|", "|>") ||
         wrapped("<\xEF\xBD\x9C", "\xEF\xBD\x9C>") || wrapped("<unused", ">");
}

bool is_byte_piece(const std::string& p) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f'); };
  return p.size() == 6 && p.compare(0, 3, "<0x") == 0 && hex(p[3]) && hex(p[4]) && p[5] == '>';
}

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

// The merges as "left right", from either format (strings, or pairs since transformers 4.45,
// whose parts may hold spaces: those become U+0120 as gguf-py writes them).
Result<std::vector<std::string>> read_merges(const JsonValue& merges, const std::string& path) {
  std::vector<std::string> out;
  if (!merges.is_array()) return out;
  out.reserve(merges.as_array().size());
  for (const JsonValue& m : merges.as_array()) {
    if (m.is_string()) {
      out.push_back(m.as_string());
    } else if (m.is_array() && m.as_array().size() == 2 && m[0].is_string() && m[1].is_string()) {
      out.push_back(replace_all(m[0].as_string(), " ", "\xC4\xA0") + " " +
                    replace_all(m[1].as_string(), " ", "\xC4\xA0"));
    } else {
      return Status::model_file(path + ": model.merges holds an entry that is neither \"a b\" nor [a, b]");
    }
  }
  return out;
}

struct Tokens {
  std::vector<std::string> pieces;
  std::vector<int64_t> types;
};

// Tokens by id as convert_hf_to_gguf's get_vocab_base (gpt2) or LlamaHfVocab (byte_fallback).
Result<Tokens> read_tokens(const JsonValue& json, bool spm, const std::string& path) {
  const JsonValue& vocab = json["model"]["vocab"];
  if (!vocab.is_object()) return Status::model_file(path + ": model.vocab is not an object of token -> id");
  std::map<int64_t, std::pair<std::string, int64_t>> by_id;
  const std::string unk = json["model"]["unk_token"].is_string() ? json["model"]["unk_token"].as_string() : "";
  for (const auto& [piece, id] : vocab.as_object()) {
    if (!id.is_integer() || id.kind() != JsonValue::Kind::kInt || id.as_int() < 0 || id.as_int() >= (1 << 24))
      return Status::model_file(path + ": model.vocab['" + piece + "'] is not a token id");
    int64_t type = kNormal;
    if (spm && is_byte_piece(piece)) type = kByte;
    if (spm && piece == unk) type = kUnknown;
    by_id[id.as_int()] = {piece, type};
  }
  for (const JsonValue& t : json["added_tokens"].is_array() ? json["added_tokens"].as_array() : JsonValue::Array{}) {
    if (!t["content"].is_string() || t["id"].kind() != JsonValue::Kind::kInt || t["id"].as_int() < 0 ||
        t["id"].as_int() >= (1 << 24))
      return Status::model_file(path + ": an added_tokens entry has no content or id");
    const std::string& content = t["content"].as_string();
    const bool special = t["special"].is_bool() && t["special"].as_bool();
    if (special || looks_special(content)) {
      by_id[t["id"].as_int()] = {content, content == unk ? kUnknown : kControl};
    } else {
      by_id[t["id"].as_int()] = {replace_all(content, "\xE2\x96\x81", " "), kUserDefined};
    }
  }
  if (by_id.empty()) return Status::model_file(path + ": model.vocab is empty");
  Tokens out;
  const int64_t n = by_id.rbegin()->first + 1;
  for (int64_t i = 0; i < n; ++i) {
    auto it = by_id.find(i);
    out.pieces.push_back(it == by_id.end() ? "[PAD" + std::to_string(i) + "]" : it->second.first);
    out.types.push_back(it == by_id.end() ? kUnused : it->second.second);
  }
  return out;
}

// Appends the regexes a pre-tokenizer splits by; false for a kind that is not a regex split.
bool collect_patterns(const JsonValue& pre, std::vector<std::string>& patterns, std::string& kinds) {
  const std::string type = pre["type"].is_string() ? pre["type"].as_string() : "?";
  if (type == "Sequence") {
    bool ok = true;
    for (const JsonValue& p : pre["pretokenizers"].is_array() ? pre["pretokenizers"].as_array() : JsonValue::Array{})
      ok &= collect_patterns(p, patterns, kinds);
    return ok;
  }
  kinds += kinds.empty() ? type : ", " + type;
  if (type == "Split" && pre["pattern"]["Regex"].is_string() && pre["behavior"].is_string() &&
      pre["behavior"].as_string() == "Isolated" && !(pre["invert"].is_bool() && pre["invert"].as_bool())) {
    kinds += " '" + pre["pattern"]["Regex"].as_string() + "'";
    patterns.push_back(pre["pattern"]["Regex"].as_string());
    return true;
  }
  if (type == "ByteLevel") {
    if (!pre["use_regex"].is_bool() || pre["use_regex"].as_bool()) patterns.emplace_back(gpt2_pattern());
    return true;
  }
  if (type == "Digits") {
    patterns.emplace_back(pre["individual_digits"].is_bool() && pre["individual_digits"].as_bool() ? R"(\p{N})"
                                                                                                   : R"(\p{N}+)");
    return true;
  }
  return false;
}

// tokenizer.ggml.pre: `wanted` when given (and known), else the name of the file's regexes.
Result<std::string> pre_name(const JsonValue& json, const std::string& wanted, const std::string& path) {
  if (!wanted.empty()) {
    auto known = PreTokenizer::for_name(wanted);
    if (!known) return Status::invalid("--pre: " + known.status().message());
    return wanted;
  }
  std::vector<std::string> patterns;
  std::string kinds;
  const bool regexes = collect_patterns(json["pre_tokenizer"], patterns, kinds);
  const std::string name = regexes ? pre_name_of_patterns(patterns) : "";
  if (!name.empty()) return name;
  return Status::invalid(path + ": the pre-tokenizer (" + (kinds.empty() ? "none" : kinds) +
                         ") is not one tandem can name from the file: pass --pre NAME (e.g. llama-bpe, qwen2, "
                         "gpt-2, deepseek-llm, starcoder)");
}

// SentencePiece scores that order merges as Hugging Face's merge ranks do: the token made by
// merge r (from 0) scores -(r + 1); tokens no merge makes (characters, bytes, specials) score
// below every merge, so the SentencePiece encoder prefers every real merge to them.
std::vector<double> scores_from_merges(const Tokens& tokens, const std::vector<std::string>& merges) {
  std::unordered_map<std::string, size_t> id;
  for (size_t i = 0; i < tokens.pieces.size(); ++i) id.emplace(tokens.pieces[i], i);
  std::vector<double> scores(tokens.pieces.size(), -static_cast<double>(merges.size() + 1));
  std::vector<bool> seen(tokens.pieces.size(), false);
  for (size_t r = 0; r < merges.size(); ++r) {
    const size_t space = merges[r].find(' ');
    if (space == std::string::npos) continue;
    auto it = id.find(merges[r].substr(0, space) + merges[r].substr(space + 1));
    if (it == id.end() || seen[it->second]) continue;
    seen[it->second] = true;
    scores[it->second] = -static_cast<double>(r + 1);
  }
  return scores;
}

}  // namespace

namespace {

// gguf-py's SpecialVocab (tokenizer.json + tokenizer_config.json): special ids, add_* flags,
// chat templates, appended to `v` in its order.
class SpecialTokens {
 public:
  SpecialTokens(const JsonValue& tokenizer, JsonValue::Object config, bool has_config, uint32_t n)
      : tokenizer_(tokenizer), config_(std::move(config)), has_config_(has_config), n_(n) {}

  void append_to(VocabularyKeys& v) {
    read_post_processor();
    static const char* const kTypes[] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
    static const std::map<std::string, std::string> kKey = {{"bos", "bos_token_id"},     {"eos", "eos_token_id"},
                                                            {"unk", "unknown_token_id"}, {"sep", "seperator_token_id"},
                                                            {"pad", "padding_token_id"}, {"cls", "cls_token_id"},
                                                            {"mask", "mask_token_id"}};
    std::vector<std::pair<std::string, bool>> adds;
    for (const char* typ : kTypes) {
      if (!has_config_) break;  // gguf-py then takes the ids from config.json, which is not read here
      const JsonValue* add = config(std::string("add_") + typ + "_token");
      if (add != nullptr && add->is_bool()) add_[typ] = add->as_bool();
      if (auto id = token_id(content(typ))) v.keys.emplace_back("tokenizer.ggml." + kKey.at(typ), u32_value(*id));
    }
    for (const char* typ : kTypes) {
      if (auto it = add_.find(typ); it != add_.end())
        v.keys.emplace_back(std::string("tokenizer.ggml.add_") + typ + "_token", bool_value(it->second));
    }
    append_chat_templates(v);
  }

 private:
  const JsonValue* config(const std::string& key) const {
    for (auto it = config_.rbegin(); it != config_.rend(); ++it)
      if (it->first == key) return &it->second;
    return nullptr;
  }
  void set_config(const std::string& key, const std::string& value) { config_.emplace_back(key, JsonValue(value)); }
  // The text of tokenizer_config.json's `typ`_token (a string or {"content": ...}).
  std::string content(const std::string& typ) const {
    const JsonValue* e = config(typ + "_token");
    if (e == nullptr) return "";
    if (e->is_string()) return e->as_string();
    return (*e)["content"].is_string() ? (*e)["content"].as_string() : "";
  }
  // Special ids are looked up among the added tokens only, as gguf-py does.
  std::optional<uint64_t> token_id(const std::string& text) const {
    if (text.empty() || !tokenizer_["added_tokens"].is_array()) return std::nullopt;
    for (const JsonValue& t : tokenizer_["added_tokens"].as_array()) {
      if (t["content"].is_string() && t["content"].as_string() == text && t["id"].kind() == JsonValue::Kind::kInt &&
          t["id"].as_int() >= 0 && static_cast<uint64_t>(t["id"].as_int()) < n_)
        return static_cast<uint64_t>(t["id"].as_int());
    }
    return std::nullopt;
  }
  void read_post_processor();
  void read_template(const JsonValue& single);
  void append_chat_templates(VocabularyKeys& v) const;

  const JsonValue& tokenizer_;
  JsonValue::Object config_;
  bool has_config_;
  uint32_t n_;
  std::map<std::string, bool> add_;
};

// The post-processor's crude reading (gguf-py): RobertaProcessing adds bos/eos/sep; a
// TemplateProcessing's single template starting/ending with a special token adds bos/eos.
void SpecialTokens::read_post_processor() {
  if (content("bos").empty() && !content("cls").empty()) set_config("bos_token", content("cls"));
  if (content("eos").empty() && !content("sep").empty()) set_config("eos_token", content("sep"));
  const JsonValue& post = tokenizer_["post_processor"];
  if (!post.is_object()) return;
  JsonValue::Array one{post};
  const JsonValue::Array& processors = post["processors"].is_array() ? post["processors"].as_array() : one;
  for (const JsonValue& p : processors) {
    const std::string type = p["type"].is_string() ? p["type"].as_string() : "";
    if (type == "RobertaProcessing") {
      add_["bos"] = add_["eos"] = add_["sep"] = true;
      if (content("cls").empty() && p["cls"][0].is_string()) set_config("cls_token", p["cls"][0].as_string());
      if (content("sep").empty() && p["sep"][0].is_string()) set_config("sep_token", p["sep"][0].as_string());
    } else if (type == "TemplateProcessing" && p["single"].is_array() && p["single"].as_array().size() > 1) {
      read_template(p["single"]);
    }
  }
}

void SpecialTokens::read_template(const JsonValue& single) {
  const JsonValue& first = single[0]["SpecialToken"]["id"];
  if (first.is_string()) {
    if (!has_config_) set_config("bos_token", first.as_string());
    add_["bos"] = first.as_string() == content("bos") || first.as_string() == content("cls");
  }
  const JsonValue& last = single[single.as_array().size() - 1]["SpecialToken"]["id"];
  if (last.is_string()) {
    if (!has_config_) {
      set_config("eos_token", last.as_string());
    } else if (last.as_string() != content("eos")) {
      set_config("eot_token", content("eos"));
      set_config("eos_token", last.as_string());
    }
    add_["eos"] = true;
  }
}

// tokenizer.chat_template from a string; a list of {name, template} gives the "default" one
// that name and every other tokenizer.chat_template.NAME.
void SpecialTokens::append_chat_templates(VocabularyKeys& v) const {
  const JsonValue* t = config("chat_template");
  if (t == nullptr) return;
  if (t->is_string()) {
    v.keys.emplace_back("tokenizer.chat_template", string_value(t->as_string()));
    return;
  }
  if (!t->is_array()) return;
  for (const JsonValue& e : t->as_array()) {
    if (!e["name"].is_string() || !e["template"].is_string()) continue;
    const std::string& name = e["name"].as_string();
    v.keys.emplace_back(name == "default" ? "tokenizer.chat_template" : "tokenizer.chat_template." + name,
                        string_value(e["template"].as_string()));
  }
}

Result<VocabularyKeys> from_tokenizer_json(const VocabularySource& src) {
  auto json = read_json(src.path);
  if (!json) return json.status();
  const JsonValue& model = (*json)["model"];
  const std::string type = model["type"].is_string() ? model["type"].as_string() : "BPE";
  if (type != "BPE" || !model["merges"].is_array())
    return Status::model_file(src.path + ": tokenizer model '" + type + "' is not supported (only BPE with merges)");
  const bool spm = model["byte_fallback"].is_bool() && model["byte_fallback"].as_bool();
  auto tokens = read_tokens(*json, spm, src.path);
  if (!tokens) return tokens.status();
  auto merges = read_merges(model["merges"], src.path);
  if (!merges) return merges.status();
  auto pre = spm ? Result<std::string>(src.pre.empty() ? "default" : src.pre) : pre_name(*json, src.pre, src.path);
  if (!pre) return pre.status();

  std::string config_path = src.tokenizer_config;
  if (config_path.empty()) {
    const auto beside = std::filesystem::path(src.path).parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(beside)) config_path = beside.string();
  }
  JsonValue::Object config;
  if (!config_path.empty()) {
    auto c = read_json(config_path);
    if (!c) return c.status();
    if (!c->is_object()) return Status::model_file(config_path + ": not a JSON object");
    config = c->as_object();
  }

  VocabularyKeys v;
  v.keys.reserve(16);  // the keys below and SpecialTokens'; also spares GCC 12 a false -Warray-bounds
  v.size = static_cast<uint32_t>(tokens->pieces.size());
  v.keys.emplace_back("tokenizer.ggml.model", string_value(spm ? "llama" : "gpt2"));
  v.keys.emplace_back("tokenizer.ggml.pre", string_value(*pre));
  v.keys.emplace_back("tokenizer.ggml.tokens", strings_value(tokens->pieces));
  if (spm) v.keys.emplace_back("tokenizer.ggml.scores", floats_value(scores_from_merges(*tokens, *merges)));
  v.keys.emplace_back("tokenizer.ggml.token_type", ints_value(tokens->types));
  if (!spm) v.keys.emplace_back("tokenizer.ggml.merges", strings_value(std::move(*merges)));
  SpecialTokens(*json, std::move(config), !config_path.empty(), v.size).append_to(v);
  return v;
}

}  // namespace

Result<VocabularyKeys> read_vocabulary(const VocabularySource& source) {
  std::ifstream in(source.path, std::ios::binary);
  if (!in) return Status::model_file(source.path + ": cannot be read");
  char magic[4] = {};
  in.read(magic, 4);
  if (in.gcount() == 4 && std::string_view(magic, 4) == "GGUF") {
    if (!source.tokenizer_config.empty() || !source.pre.empty())
      return Status::invalid(source.path +
                             " is a GGUF file: its vocabulary is copied as is (no --pre or "
                             "--tokenizer-config)");
    return from_gguf(source.path);
  }
  return from_tokenizer_json(source);
}

}  // namespace tandem::model
