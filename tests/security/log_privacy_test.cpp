// #18 item 11 (first half): what clients send and get (prompts, conversations, completions) is
// theirs; no log line at the default level may hold it. A real deployment with --log-dir serves
// text, a conversation, a request split between prefill and decode workers and a refused one,
// each carrying a unique marker; then every log file is searched for the markers, the
// completions' text and the prompts' token ids.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "tandem/client.h"
#include "tests/e2e/deployment.h"

namespace tandem::test {
namespace {

using namespace std::chrono_literals;

// The tiny model with a chat template (ChatML), so conversations are served too.
std::string tiny_chat_model() {
  auto tiny = model::GgufFile::open(model_file("tiny", 1)).value();
  model::GgufWriter w;
  for (const std::string& key : tiny->keys_in_file_order())
    if (key != "tokenizer.chat_template") w.add_value(key, *tiny->find(key));
  w.add_string(
      "tokenizer.chat_template",
      "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}");
  for (const model::GgufTensor& t : tiny->tensors())
    w.add_tensor(t.name, t.dims, static_cast<model::TensorType>(t.type), t.data, t.nbytes);
  const std::string path = temp_dir() + "/tiny-chat.gguf";
  EXPECT_TRUE(w.write(path).is_ok());
  return path;
}

// Every file under `dir`, concatenated.
std::string all_logs(const std::string& dir) {
  std::string all;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) all += slurp(e.path().string());
  return all;
}

// Runs `r`; the completion's text.
std::string complete(Client& client, GenerateRequest r, bool expect_error = false) {
  auto s = client.generate(r);
  std::string text;
  Event ev;
  while (s->next(ev))
    if (ev.final)
      text += ev.fin.text;
    else
      text += ev.token.text;
  EXPECT_TRUE(ev.final);
  EXPECT_EQ(ev.fin.reason == FinishReason::kError, expect_error) << ev.fin.error_message;
  return text;
}

TEST(LogPrivacy, NoPromptOrCompletionTextInLogsAtTheDefaultLevel) {
  const std::string logs = temp_dir();
  // The default level (info), as a service runs.
  Deployment d({"--prefill", "1", "--decode", "1", "--threads", "1", "--kv-memory", "67108864", "--log-dir", logs,
                "--log-level", "info"},
               tiny_chat_model());
  ASSERT_TRUE(d.ok());
  ClientOptions o;
  o.endpoint = d.endpoint();
  auto client = Client::connect(o);
  ASSERT_TRUE(client) << client.status().to_string();
  const std::vector<std::string> markers = {"qzxv-prompt-marker-7731", "qzxv-chat-marker-4410", "qzxv-stop-marker-2208",
                                            "qzxv-refused-marker-9902"};
  std::vector<std::string> completions;
  GenerateRequest text;
  text.prompt_text = "tell me about " + markers[0] + " please";
  text.max_tokens = 24;
  text.ignore_eos = true;
  text.stop_strings = {markers[2]};
  completions.push_back(complete(**client, text));
  GenerateRequest chat;
  chat.messages = {ChatMessage{"user", "what is " + markers[1] + "?", "", "", ""}};
  chat.max_tokens = 24;
  chat.ignore_eos = true;
  chat.stream = false;
  completions.push_back(complete(**client, chat));
  GenerateRequest refused;  // longer than the model's context: refused with an error
  refused.prompt_text = markers[3] + std::string(20000, 'x');
  refused.max_tokens = 4;
  complete(**client, refused, /*expect_error=*/true);
  GenerateRequest ids;
  ids.prompt_tokens = {401, 377, 411, 389, 397, 383, 409, 379};
  ids.max_tokens = 8;
  ids.ignore_eos = true;
  complete(**client, ids);
  EXPECT_GE((*client)->status(5s).value().handoffs, 1u) << "the KV handoff path ran";
  (*client).reset();
  std::this_thread::sleep_for(300ms);  // what the processes logged is flushed

  const std::string all = all_logs(logs) + d.output() + slurp(d.dir() + "/up.out.err");
  ASSERT_NE(all.find("scheduler: worker 1 registered"), std::string::npos) << "the logs were not found";
  for (const std::string& c : completions) EXPECT_FALSE(c.empty()) << "a request produced no text";
  for (const std::string& m : markers) EXPECT_EQ(all.find(m), std::string::npos) << "a log holds " << m;
  for (const std::string& c : completions)
    if (c.size() >= 12) EXPECT_EQ(all.find(c), std::string::npos) << "a log holds a completion: " << c;
  for (const char* form : {"401, 377, 411", "401,377,411", "401 377 411"})
    EXPECT_EQ(all.find(form), std::string::npos) << "a log holds the prompt's token ids";
}

}  // namespace
}  // namespace tandem::test
