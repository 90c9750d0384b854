// tandem tokenize / detokenize / chat-template: a model's vocabulary and chat template as
// scripts call them. They read the GGUF metadata only (cli/chat_prompt.h), so vocabulary-only
// files work, and print exactly the result on stdout: nothing else, no trailing newline where
// the output is text.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "cli/args.h"
#include "cli/chat_prompt.h"
#include "cli/commands.h"

namespace tandem::cli {

namespace {

constexpr const char* kTokenizeUsage = "usage: tandem tokenize --model FILE (--text T | --file F) [flags]";
constexpr const char* kTokenizeNotes =
    "prints the ids separated by spaces and a newline; with --json {\"ids\":[...]}\n";
constexpr const char* kDetokenizeUsage = "usage: tandem detokenize --model FILE --ids 1,2,3 [--special]";
constexpr const char* kDetokenizeNotes =
    "prints the text exactly (no newline added); detokenize(tokenize(s)) == s for text the vocabulary can hold\n";
constexpr const char* kChatTemplateUsage =
    "usage: tandem chat-template (--model FILE | --template FILE.jinja) --messages JSON [flags]";
constexpr const char* kChatTemplateNotes =
    "--messages: a JSON array of {\"role\", \"content\", ...} or an object {\"messages\", \"tools\", "
    "\"add_generation_prompt\",\n\"bos_token\", \"eos_token\"}; prints exactly the rendered prompt "
    "(flags override the object's fields, which\noverride the model's BOS/EOS pieces)\n";

void write_exactly(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::invalid("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The common start of the three: --help, then the parsed flags; nullopt when done (help printed).
Result<std::optional<Args>> parse_or_help(int argc, char** argv, Command command, const char* usage,
                                          const char* notes) {
  auto args = Args::parse(argc, argv, command);
  if (!args) return args.status();
  if (args->has("help")) {
    std::fputs(help_text(command, usage, notes).c_str(), stdout);
    return std::optional<Args>();
  }
  return std::optional<Args>(std::move(args.value()));
}

Result<TextModel> model_from(const Args& args) {
  auto path = args.str("model");
  if (!path) return Status::invalid("--model FILE is required");
  return open_text_model(*path);
}

Result<std::string> tokenize(const Args& args) {
  if (args.has("text") == args.has("file")) return Status::invalid("give exactly one of --text or --file");
  auto text = model_from(args);
  if (!text) return text.status();
  auto input = args.has("text") ? Result<std::string>(*args.str("text")) : read_file(*args.str("file"));
  if (!input) return input.status();
  const model::EncodeOptions options{.add_special = !args.has("no-bos"), .parse_special = args.has("special")};
  auto ids = text->tokenizer.encode(*input, options);
  if (!ids) return ids.status();
  const bool json = args.has("json");
  std::string out = json ? "{\"ids\":[" : "";
  for (size_t i = 0; i < ids->size(); ++i) out += (i ? (json ? "," : " ") : "") + std::to_string((*ids)[i]);
  return out + (json ? "]}\n" : "\n");
}

Result<std::string> detokenize(const Args& args) {
  auto ids = args.int_list("ids");
  if (!ids) return ids.status();
  if (!args.has("ids")) return Status::invalid("--ids 1,2,3 is required");
  auto text = model_from(args);
  if (!text) return text.status();
  const uint32_t n = text->tokenizer.vocab_size();
  for (size_t i = 0; i < ids->size(); ++i) {
    const int32_t id = (*ids)[i];
    if (id < 0 || static_cast<uint32_t>(id) >= n)
      return Status::invalid("--ids: id " + std::to_string(id) + " (position " + std::to_string(i) +
                             ") is out of range: the vocabulary has " + std::to_string(n) + " tokens");
  }
  const model::DecodeOptions options{.special = args.has("special"), .strip_space_prefix = true};
  return text->tokenizer.decode(*ids, options);
}

// The template and the BOS/EOS defaults of --model or --template.
Result<model::ChatTemplate> template_from(const Args& args, std::string& bos, std::string& eos) {
  if (args.has("model") == args.has("template")) return Status::invalid("give exactly one of --model or --template");
  if (auto path = args.str("template")) return read_chat_template(*path);
  auto text = model_from(args);
  if (!text) return text.status();
  bos = text->bos_token();
  eos = text->eos_token();
  return text->chat_template();
}

Result<std::string> chat_template(const Args& args) {
  auto messages = args.str("messages");
  if (!messages) return Status::invalid("--messages JSON is required");
  std::string bos, eos;
  auto tmpl = template_from(args, bos, eos);
  if (!tmpl) return tmpl.status();
  auto in = model::parse_chat_input(*messages);
  if (!in) return Status::invalid("--messages: " + in.status().message());
  TANDEM_RETURN_IF_ERROR(model::check_roles(*in));
  if (args.has("add-generation-prompt")) in->add_generation_prompt = true;
  if (in->bos_token.empty()) in->bos_token = bos;
  if (in->eos_token.empty()) in->eos_token = eos;
  if (auto s = args.str("bos-token")) in->bos_token = *s;
  if (auto s = args.str("eos-token")) in->eos_token = *s;
  return tmpl->render(*in);
}

int run_text_command(int argc, char** argv, Command command, const char* name, const char* usage, const char* notes,
                     Result<std::string> (*body)(const Args&)) {
  auto args = parse_or_help(argc, argv, command, usage, notes);
  if (!args) return fail(name, args.status());
  if (!*args) return 0;
  auto out = body(**args);
  if (!out) return fail(name, out.status());
  write_exactly(*out);
  return 0;
}

}  // namespace

int tokenize_command(int argc, char** argv) {
  return run_text_command(argc, argv, kTokenize, "tokenize", kTokenizeUsage, kTokenizeNotes, tokenize);
}

int detokenize_command(int argc, char** argv) {
  return run_text_command(argc, argv, kDetokenize, "detokenize", kDetokenizeUsage, kDetokenizeNotes, detokenize);
}

int chat_template_command(int argc, char** argv) {
  return run_text_command(argc, argv, kChatTemplate, "chat-template", kChatTemplateUsage, kChatTemplateNotes,
                          chat_template);
}

}  // namespace tandem::cli
