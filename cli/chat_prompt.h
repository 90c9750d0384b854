// Text in and out for the commands that take a model file: its vocabulary and chat template
// read from the GGUF metadata alone (tokenizer.ggml.*, tokenizer.chat_template), so they work
// on vocabulary-only files; and a chat turn (--chat, --system) made into prompt token ids.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/args.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "runtime/status.h"

namespace tandem::cli {

// A model file's text side. No tensor is read, no model config is checked.
struct TextModel {
  std::unique_ptr<model::GgufFile> file;
  model::Tokenizer tokenizer;

  // The pieces of BOS and EOS ("<s>", "<|endoftext|>"), "" when the vocabulary has none: what a
  // template sees as bos_token and eos_token unless told otherwise.
  std::string bos_token() const;
  std::string eos_token() const;
  // tokenizer.chat_template. Errors: the file has none (naming it), or the template does not parse.
  Result<model::ChatTemplate> chat_template() const;
};

// Errors: the file's (Code::kModelFile, naming it).
Result<TextModel> open_text_model(const std::string& path);

// A template from a .jinja file. Errors: unreadable file, a template that does not parse.
Result<model::ChatTemplate> read_chat_template(const std::string& path);

// What --chat sends: an optional system message, then the prompt as one user message, rendered
// with add_generation_prompt and tokenized with the vocabulary's special tokens recognised (the
// template writes them; user text goes through the template, as with any chat server). BOS is
// added when the vocabulary asks for it and `add_bos`, unless the rendered text already starts
// with it (templates that write {{ bos_token }}), so it appears once.
Result<std::vector<int32_t>> chat_prompt_tokens(const TextModel& text, const model::ChatTemplate& tmpl,
                                                const std::optional<std::string>& system, const std::string& prompt,
                                                bool add_bos);

// The prompt of run and generate --chat: --prompt as the user message, --system, the template of
// --template or else of the model file at `model_path`, BOS unless --no-bos. Errors: --chat
// with --tokens, --system without --chat, no template, a template that fails to render, text
// the vocabulary cannot encode.
Result<std::vector<int32_t>> chat_prompt_from_flags(const Args& args, const std::string& model_path);
// Usage errors of --chat and --system alone (before anything is loaded).
[[nodiscard]] Status check_chat_flags(const Args& args);

}  // namespace tandem::cli
