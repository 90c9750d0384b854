#include "cli/chat_prompt.h"

#include <fstream>
#include <sstream>

namespace tandem::cli {

namespace {

using model::jinja::Dict;
using model::jinja::Value;

Value message(const char* role, const std::string& content) {
  Dict d;
  d.set(Value("role"), Value(role));
  d.set(Value("content"), Value(content));
  return Value::dict(std::move(d));
}

}  // namespace

std::string TextModel::bos_token() const { return model::bos_piece(tokenizer); }
std::string TextModel::eos_token() const { return model::eos_piece(tokenizer); }

Result<model::ChatTemplate> TextModel::chat_template() const {
  auto source = file->get_string("tokenizer.chat_template");
  if (!source) {
    return Status::invalid(file->path() + " has no chat template (tokenizer.chat_template); give one with --template");
  }
  return model::ChatTemplate::parse(*source);
}

Result<TextModel> open_text_model(const std::string& path) {
  auto file = model::GgufFile::open(path);
  if (!file) return file.status();
  auto tok = model::Tokenizer::from_gguf(**file);
  if (!tok) return tok.status();
  return TextModel{std::move(file.value()), std::move(tok.value())};
}

Result<model::ChatTemplate> read_chat_template(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::invalid("cannot read the template " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto tmpl = model::ChatTemplate::parse(ss.str());
  if (!tmpl) return Status::invalid(path + ": " + tmpl.status().message());
  return tmpl;
}

Result<std::vector<int32_t>> chat_prompt_tokens(const TextModel& text, const model::ChatTemplate& tmpl,
                                                const std::optional<std::string>& system, const std::string& prompt,
                                                bool add_bos) {
  model::ChatInput in;
  model::jinja::List messages;
  if (system) messages.push_back(message("system", *system));
  messages.push_back(message("user", prompt));
  in.messages = Value::list(std::move(messages));
  in.add_generation_prompt = true;
  in.bos_token = text.bos_token();
  in.eos_token = text.eos_token();
  auto rendered = tmpl.render(in);
  if (!rendered) return rendered.status();
  return model::encode_rendered_chat(text.tokenizer, *rendered, add_bos);
}

Status check_chat_flags(const Args& args) {
  if (args.has("system") && !args.has("chat")) return Status::invalid("--system needs --chat");
  if (args.has("template") && !args.has("chat")) return Status::invalid("--template needs --chat");
  if (args.has("chat") && !args.has("prompt")) return Status::invalid("--chat needs --prompt TEXT (the user message)");
  return Status::ok();
}

Result<std::vector<int32_t>> chat_prompt_from_flags(const Args& args, const std::string& model_path) {
  TANDEM_RETURN_IF_ERROR(check_chat_flags(args));
  auto text = open_text_model(model_path);
  if (!text) return text.status();
  auto tmpl = args.has("template") ? read_chat_template(*args.str("template")) : text->chat_template();
  if (!tmpl) return tmpl.status();
  return chat_prompt_tokens(*text, *tmpl, args.str("system"), args.str("prompt").value_or(""), !args.has("no-bos"));
}

}  // namespace tandem::cli
