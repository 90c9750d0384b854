// tandem tokenize / detokenize / chat-template and run --chat as scripts call them: the real
// binary on real vocabularies (../shared/data/vocab, skipped with the reason when absent) and
// real chat templates (../shared/data/templates, against python3-jinja2's bytes checked in as
// tests/data/chat-golden/).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using test::read_file;
using test::shell_quote;

const std::string kShared = std::string(TANDEM_SOURCE_DIR) + "/../shared/data";
const std::string kQwen = kShared + "/templates/Qwen-Qwen2.5-7B-Instruct.jinja";
const std::string kGolden = std::string(TANDEM_SOURCE_DIR) + "/tests/data/chat-golden/";

test::CommandOutput tandem(const std::string& args) {
  return test::run_command(std::string(TANDEM_TANDEM_BIN) + " " + args);
}

std::string write_temp(const std::string& bytes) {
  static int n = 0;
  const std::string path = test::temp_dir() + "/in" + std::to_string(n++);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string ids_text(const std::vector<int32_t>& ids, const char* sep) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? sep : "") + std::to_string(ids[i]);
  return s;
}

class Vocab : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    path_ = kShared + "/vocab/ggml-vocab-" + GetParam() + ".gguf";
    if (!fs::exists(path_) || !fs::exists(path_ + ".inp") || !fs::exists(path_ + ".out"))
      GTEST_SKIP() << path_ << " with .inp/.out not found: the shared reference data is not beside the repository";
    size_t out_lines = 0;
    cases_ = test::read_vocab_cases(path_, out_lines);
    ASSERT_EQ(out_lines, cases_.size());
    cases_.resize(std::min<size_t>(cases_.size(), 12));  // each case is a process or two
  }
  std::string path_;
  std::vector<test::VocabCase> cases_;
};

TEST_P(Vocab, TokenizeEqualsHuggingFace) {
  for (const test::VocabCase& c : cases_) {
    auto r = tandem("tokenize --model " + path_ + " --file " + write_temp(c.text) + " --no-bos --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "{\"ids\":[" + ids_text(c.ids, ",") + "]}\n") << "text '" << c.text << "'";
  }
  auto plain = tandem("tokenize --model " + path_ + " --text " + shell_quote(cases_.back().text) + " --no-bos");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(plain.out, ids_text(cases_.back().ids, " ") + "\n");
}

TEST_P(Vocab, DetokenizeOfTokenizeIsTheText) {
  for (const test::VocabCase& c : cases_) {
    if (c.text.empty()) continue;
    auto ids = tandem("tokenize --model " + path_ + " --file " + write_temp(c.text));  // with BOS where asked
    ASSERT_EQ(ids.exit_code, 0) << ids.err;
    std::string list = ids.out.substr(0, ids.out.size() - 1);
    std::replace(list.begin(), list.end(), ' ', ',');
    auto text = tandem("detokenize --model " + path_ + " --ids " + list);
    ASSERT_EQ(text.exit_code, 0) << text.err;
    EXPECT_EQ(text.out, c.text) << "ids " << list;
  }
}

INSTANTIATE_TEST_SUITE_P(Shared, Vocab, ::testing::Values("llama-spm", "gpt-2", "falcon"));

TEST(TextCommands, BadInputIsAnErrorNamingIt) {
  const std::string vocab = kShared + "/vocab/ggml-vocab-gpt-2.gguf";
  if (!fs::exists(vocab)) GTEST_SKIP() << vocab << " not found: the shared reference data is not beside the repository";
  auto range = tandem("detokenize --model " + vocab + " --ids 1,50257");
  EXPECT_EQ(range.exit_code, 2);
  EXPECT_NE(range.err.find("id 50257 (position 1) is out of range"), std::string::npos) << range.err;
  EXPECT_EQ(range.out, "");
  auto utf8 = tandem("tokenize --model " + vocab + " --file " + write_temp("ok \xff\xfe"));
  EXPECT_NE(utf8.exit_code, 0);
  EXPECT_NE(utf8.err.find("UTF-8"), std::string::npos) << utf8.err;
  auto both = tandem("tokenize --model " + vocab + " --text a --file x");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("exactly one of --text or --file"), std::string::npos) << both.err;
}

// The bytes python3-jinja2 renders (tests/model/chat_template_reference.py), from the object form
// of --messages and from a bare array with the BOS/EOS flags.
TEST(TextCommands, ChatTemplateEqualsJinja2) {
  if (!fs::exists(kQwen)) GTEST_SKIP() << kQwen << " not found: the shared reference data is not beside the repository";
  const std::string conversation = read_file(std::string(TANDEM_SOURCE_DIR) + "/tests/data/chat/non-ascii.json");
  auto qwen = tandem("chat-template --template " + kQwen + " --messages " + shell_quote(conversation));
  ASSERT_EQ(qwen.exit_code, 0) << qwen.err;
  EXPECT_EQ(qwen.out, read_file(kGolden + "Qwen-Qwen2.5-7B-Instruct__non-ascii.out"));
  EXPECT_EQ(qwen.err, "");

  const std::string messages =
      R"([{"role":"user","content":"Name a prime number."},{"role":"assistant","content":"7 is prime."},)"
      R"({"role":"user","content":"Another one?"},{"role":"assistant","content":"11."}])";
  auto gemma = tandem("chat-template --template " + kShared + "/templates/google-gemma-2-2b-it.jinja --messages " +
                      shell_quote(messages) + " --bos-token '<s>' --eos-token '</s>'");
  ASSERT_EQ(gemma.exit_code, 0) << gemma.err;
  EXPECT_EQ(gemma.out, read_file(kGolden + "google-gemma-2-2b-it__no-system-multi-turn.out"));
}

TEST(TextCommands, ChatTemplateErrorsNameTheProblem) {
  const std::string model = test::model_file("tiny", 1);
  auto none = tandem("chat-template --model " + model + " --messages '[]'");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("has no chat template (tokenizer.chat_template)"), std::string::npos) << none.err;
  if (!fs::exists(kQwen)) GTEST_SKIP() << kQwen << " not found: the shared reference data is not beside the repository";
  auto json = tandem("chat-template --template " + kQwen + " --messages '[{\"role\":\"user\",}]'");
  EXPECT_EQ(json.exit_code, 2);
  EXPECT_NE(json.err.find("--messages: "), std::string::npos) << json.err;
  EXPECT_NE(json.err.find("offset"), std::string::npos) << json.err;
  auto role = tandem("chat-template --template " + kQwen + " --messages '[{\"role\":\"asistant\",\"content\":\"x\"}]'");
  EXPECT_EQ(role.exit_code, 2);
  EXPECT_NE(role.err.find("messages[0]: unknown role 'asistant'"), std::string::npos) << role.err;
  EXPECT_EQ(role.out, "");
}

// run --chat prompts with exactly the rendered conversation, special tokens parsed, BOS once:
// its tokens equal run --tokens of tokenize --special of chat-template's output.
TEST(TextCommands, RunChatIsTheRenderedTemplate) {
  if (!fs::exists(kQwen)) GTEST_SKIP() << kQwen << " not found: the shared reference data is not beside the repository";
  const std::string model = test::model_file("tiny", 1);
  const std::string messages = R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there"}])";
  auto prompt =
      tandem("chat-template --template " + kQwen + " --add-generation-prompt --messages " + shell_quote(messages));
  ASSERT_EQ(prompt.exit_code, 0) << prompt.err;
  EXPECT_EQ(prompt.out.substr(prompt.out.size() - 22), "<|im_start|>assistant\n");
  auto ids = tandem("tokenize --model " + model + " --special --file " + write_temp(prompt.out));
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  std::string list = ids.out.substr(0, ids.out.size() - 1);
  std::replace(list.begin(), list.end(), ' ', ',');

  const std::string gen = " --max-tokens 6 --ignore-eos --json";
  auto by_tokens = tandem("run --model " + model + " --tokens " + list + gen);
  auto by_chat = tandem("run --model " + model + " --chat --template " + kQwen +
                        " --system 'Be brief.' --prompt 'Hi there'" + gen);
  ASSERT_EQ(by_chat.exit_code, 0) << by_chat.err;
  ASSERT_EQ(by_tokens.exit_code, 0) << by_tokens.err;
  EXPECT_EQ(by_chat.out, by_tokens.out);
  auto text = tandem("run --model " + model + " --chat --template " + kQwen + " --prompt 'Hi there' --max-tokens 6");
  EXPECT_EQ(text.exit_code, 0) << text.err;

  auto no_template = tandem("run --model " + model + " --chat --prompt hi");
  EXPECT_NE(no_template.exit_code, 0);
  EXPECT_NE(no_template.err.find("has no chat template"), std::string::npos) << no_template.err;
  auto lone_system = tandem("run --model " + model + " --system x --prompt hi");
  EXPECT_EQ(lone_system.exit_code, 2);
  EXPECT_NE(lone_system.err.find("--system needs --chat"), std::string::npos) << lone_system.err;
}

}  // namespace
}  // namespace tandem
