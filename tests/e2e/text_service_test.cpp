// Text through the service on a model with a real vocabulary (GPT-2's byte-level BPE from
// ../shared/data/vocab, random weights): a `messages` request streams what `tandem run --chat`
// prints, stop strings match across BPE token boundaries, a non-eos end-of-generation token
// ends the stream, `tandem generate --chat` goes through the service, tokenize/count_tokens
// agree with what a request is charged, and long text prompts are tokenized off the
// scheduler's planning thread (running streams keep their pace while they arrive).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "model/gguf.h"
#include "model/make_model.h"
#include "model/tokenizer.h"
#include "tandem/client.h"
#include "tests/e2e/streams.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using Deployment = test::ClientDeployment;

// ChatML, as Qwen and SmolLM2 write it (GPT-2's vocabulary has no <|im_start|> token: the
// markers are text here, which is what a template over a vocabulary without them gives).
constexpr const char* kChatTemplate =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const std::string kSystem = "You are a helpful assistant.";
const std::string kUser = "Write a short story about a lighthouse keeper.";

std::string vocab_file() { return std::string(TANDEM_SOURCE_DIR) + "/../shared/data/vocab/ggml-vocab-gpt-2.gguf"; }

// The tiny preset's random weights with the vocabulary of `vocab` (every tokenizer.* key
// copied, the embedding and output sized to it), a chat template, and `eot` as
// tokenizer.ggml.eot_token_id when >= 0. Made once per (eot) per process.
std::string real_vocab_model(int32_t eot = -1) {
  static std::map<int32_t, std::string> made;
  if (auto it = made.find(eot); it != made.end()) return it->second;
  auto vocab = model::GgufFile::open(vocab_file()).value();
  const uint32_t n_vocab = model::Tokenizer::from_gguf(*vocab).value().vocab_size();
  model::ModelConfig config = model::preset_config("tiny").value();
  config.vocab_size = n_vocab;
  const std::string dir = test::temp_dir();
  EXPECT_TRUE(model::make_model(config, 7, dir + "/weights.gguf").is_ok());
  auto weights = model::GgufFile::open(dir + "/weights.gguf").value();
  model::GgufWriter w;
  for (const std::string& key : weights->keys_in_file_order())
    if (!key.starts_with("tokenizer.")) w.add_value(key, *weights->find(key));
  for (const std::string& key : vocab->keys_in_file_order())
    if (key.starts_with("tokenizer.") && key != "tokenizer.chat_template") w.add_value(key, *vocab->find(key));
  w.add_string("tokenizer.chat_template", kChatTemplate);
  if (eot >= 0) w.add_u32("tokenizer.ggml.eot_token_id", static_cast<uint32_t>(eot));
  for (const model::GgufTensor& t : weights->tensors())
    w.add_tensor(t.name, t.dims, static_cast<model::TensorType>(t.type), t.data, t.nbytes);
  const std::string path = dir + "/gpt2-vocab-eot" + std::to_string(eot) + ".gguf";
  EXPECT_TRUE(w.write(path).is_ok());
  made[eot] = path;
  return path;
}

#define SKIP_WITHOUT_VOCAB() \
  if (!std::filesystem::exists(vocab_file())) GTEST_SKIP() << "no " << vocab_file() << " (shared data)"

const std::vector<std::string> kDeploy = {"--workers", "1", "--threads", "1"};

// A stream's ids, texts and final event (streams.h's collect, which waits 60 s at most: only
// a hang fails it).
using Streamed = test::Collected;
Streamed stream_all(Stream& s) { return test::collect(s); }

GenerateRequest chat_request(uint32_t max_tokens) {
  GenerateRequest r;
  r.messages = {ChatMessage{"system", kSystem}, ChatMessage{"user", kUser}};
  r.max_tokens = max_tokens;
  return r;
}

// `tandem run --chat` on `model`: its stdout.
std::string run_chat(const std::string& model, uint32_t max_tokens, bool json) {
  const auto out = test::run_command(std::string(TANDEM_TANDEM_BIN) + " run --model " + test::shell_quote(model) +
                                     " --threads 1 --chat --system " + test::shell_quote(kSystem) + " --prompt " +
                                     test::shell_quote(kUser) + " --max-tokens " + std::to_string(max_tokens) +
                                     (json ? " --json" : ""));
  EXPECT_EQ(out.exit_code, 0) << out.err;
  return out.out;
}

// The ids of a {"tokens":[...]} line.
std::vector<int32_t> json_tokens(const std::string& json) {
  std::vector<int32_t> ids;
  size_t at = json.find("\"tokens\":[");
  if (at == std::string::npos) return ids;
  at += 10;
  while (at < json.size() && json[at] != ']') {
    size_t end = 0;
    ids.push_back(std::stoi(json.substr(at), &end));
    at += end;
    if (json[at] == ',') ++at;
  }
  return ids;
}

TEST(TextService, MessagesStreamTheSameTextAsRunChat) {
  SKIP_WITHOUT_VOCAB();
  const std::string model = real_vocab_model();
  Deployment d(kDeploy, model);
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  const Streamed s = stream_all(*client->generate(chat_request(32)));
  ASSERT_EQ(s.finals, 1);
  ASSERT_NE(s.fin.reason, FinishReason::kError) << s.fin.error_message;
  EXPECT_EQ(s.tokens, json_tokens(run_chat(model, 32, true)));
  std::string printed = run_chat(model, 32, false);
  ASSERT_FALSE(printed.empty());
  printed.pop_back();  // run's closing newline
  EXPECT_EQ(s.text(), printed);
  EXPECT_FALSE(s.text().empty());
  // BPE text, not GPT-2's byte characters: no 'Ġ' (U+0120) for spaces.
  EXPECT_EQ(s.text().find("\xC4\xA0"), std::string::npos) << s.text();
  // The request was charged the rendered conversation, as tokenize() counts it.
  TokenizeRequest t;
  t.messages = chat_request(1).messages;
  auto n = client->count_tokens(t);
  ASSERT_TRUE(n) << n.status().to_string();
  EXPECT_EQ(*n, s.fin.prompt_tokens);
  auto ids = client->tokenize(t);
  ASSERT_TRUE(ids) << ids.status().to_string();
  EXPECT_EQ(ids->size(), *n);
}

// A stop string made of the end of one token's text and the start of the next's, first
// occurring there: the stream ends with the text before it (or through it when included).
TEST(TextService, StopStringsMatchAcrossBpeTokenBoundaries) {
  SKIP_WITHOUT_VOCAB();
  Deployment d(kDeploy, real_vocab_model());
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  GenerateRequest base = chat_request(48);
  base.ignore_eos = true;
  const Streamed full = stream_all(*client->generate(base));
  ASSERT_EQ(full.fin.reason, FinishReason::kLength) << full.fin.error_message;
  const std::string text = full.text();
  std::string stop;
  size_t stop_at = 0, boundaries = 0;
  size_t offset = 0;
  for (size_t i = 0; i + 1 < full.texts.size() && stop.empty(); ++i) {
    offset += full.texts[i].size();
    const std::string& a = full.texts[i];
    const std::string& b = full.texts[i + 1];
    if (a.size() < 2 || b.size() < 2) continue;
    ++boundaries;
    const std::string candidate = a.substr(a.size() - 2) + b.substr(0, 2);
    if (text.find(candidate) == offset - 2) {
      stop = candidate;
      stop_at = offset - 2;
    }
  }
  ASSERT_FALSE(stop.empty()) << "no token boundary to stop across in " << boundaries << " boundaries of: " << text;
  for (bool include : {false, true}) {
    GenerateRequest r = base;
    r.stop_strings = {stop};
    r.include_stop_string = include;
    const Streamed s = stream_all(*client->generate(r));
    EXPECT_EQ(s.fin.reason, FinishReason::kStop) << "stop '" << stop << "' " << s.fin.error_message;
    EXPECT_EQ(s.text(), text.substr(0, stop_at + (include ? stop.size() : 0))) << "stop '" << stop << "'";
  }
}

// The model's greedy continuation with `eot` made tokenizer.ggml.eot_token_id: the stream
// ends on it with "stop" (it is not eos), where the same model without it runs on.
TEST(TextService, ANonEosEndOfGenerationTokenEndsTheStream) {
  SKIP_WITHOUT_VOCAB();
  std::vector<int32_t> plain;
  {
    Deployment d(kDeploy, real_vocab_model());
    ASSERT_TRUE(d.ok());
    plain = stream_all(*d.client()->generate(chat_request(24))).tokens;
  }
  ASSERT_FALSE(plain.empty());
  const int32_t eos = 50256;  // GPT-2's <|endoftext|>
  // The first token that did not occur before it (after the first, when there is one).
  size_t k = 0;
  for (size_t i = 1; i < plain.size() && k == 0; ++i)
    if (std::find(plain.begin(), plain.begin() + i, plain[i]) == plain.begin() + i && plain[i] != eos) k = i;
  ASSERT_NE(plain[k], eos);
  Deployment d(kDeploy, real_vocab_model(plain[k]));
  ASSERT_TRUE(d.ok());
  const Streamed s = stream_all(*d.client()->generate(chat_request(24)));
  EXPECT_EQ(s.fin.reason, FinishReason::kStop) << s.fin.error_message;
  EXPECT_EQ(s.tokens, std::vector<int32_t>(plain.begin(), plain.begin() + k + 1)) << "eot " << plain[k];
  GenerateRequest ignoring = chat_request(24);
  ignoring.ignore_eos = true;
  EXPECT_EQ(stream_all(*d.client()->generate(ignoring)).tokens, plain);
}

TEST(TextService, GenerateChatGoesThroughTheService) {
  SKIP_WITHOUT_VOCAB();
  const std::string model = real_vocab_model();
  Deployment d(kDeploy, model);
  ASSERT_TRUE(d.ok());
  const std::string generate = std::string(TANDEM_TANDEM_BIN) + " generate --endpoint " + d.endpoint() +
                               " --chat --system " + test::shell_quote(kSystem) + " --prompt " +
                               test::shell_quote(kUser) + " --max-tokens 32";
  // Messages sent, rendered by the service: the text `tandem run --chat` prints.
  const auto text = test::run_command(generate);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out, run_chat(model, 32, false));
  // Token ids equal too (one JSON line per token, then the final event).
  const auto json = test::run_command(generate + " --json");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  std::vector<int32_t> ids;
  for (size_t at = json.out.find("\"id\":"); at != std::string::npos; at = json.out.find("\"id\":", at + 1))
    ids.push_back(std::stoi(json.out.substr(at + 5)));
  EXPECT_EQ(ids, json_tokens(run_chat(model, 32, true)));
  // Rendered here from a copy of the model (--model), sent as ids: the same stream.
  const auto local = test::run_command(generate + " --model " + test::shell_quote(model));
  ASSERT_EQ(local.exit_code, 0) << local.err;
  EXPECT_EQ(local.out, text.out);
}

TEST(TextService, BadConversationsAreRefusedByNameAndTheServiceKeepsServing) {
  SKIP_WITHOUT_VOCAB();
  Deployment d(kDeploy, real_vocab_model());
  ASSERT_TRUE(d.ok());
  auto client = d.client();
  auto error_of = [&](GenerateRequest r) {
    const Streamed s = stream_all(*client->generate(std::move(r)));
    EXPECT_EQ(s.finals, 1);
    EXPECT_EQ(s.fin.reason, FinishReason::kError);
    return s.fin.error_message;
  };
  GenerateRequest role = chat_request(4);
  role.messages[1].role = "asistant";
  EXPECT_EQ(error_of(role),
            "messages[1]: unknown role 'asistant' (system, user, assistant, tool, developer or ipython)");
  GenerateRequest calls = chat_request(4);
  calls.messages[1].tool_calls_json = "[{";
  EXPECT_NE(error_of(calls).find("messages[1].tool_calls_json: "), std::string::npos);
  GenerateRequest long_chat = chat_request(4);
  long_chat.messages[1].content = std::string(3000, 'x') + " " + std::string(3000, 'y');
  EXPECT_NE(error_of(long_chat).find("(the messages rendered with the chat template) does not fit the context length"),
            std::string::npos);
  TokenizeRequest bad;
  bad.messages = role.messages;
  auto refused = client->tokenize(bad);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("unknown role 'asistant'"), std::string::npos);
  // Still serving.
  const Streamed ok = stream_all(*client->generate(chat_request(4)));
  EXPECT_EQ(ok.fin.reason, FinishReason::kLength) << ok.fin.error_message;
}

// Without a template in the model, a conversation is refused by name.
TEST(TextService, AModelWithoutAChatTemplateRefusesMessages) {
  Deployment d(kDeploy);  // make-model's tiny file: byte-level vocabulary, no template
  ASSERT_TRUE(d.ok());
  const Streamed s = stream_all(*d.client()->generate(chat_request(4)));
  EXPECT_EQ(s.fin.reason, FinishReason::kError);
  EXPECT_EQ(s.fin.error_message, "messages: the model has no chat template (tokenizer.chat_template)");
}

// ---- Long prompts do not stall the planning thread ----

// English-like text of about `tokens` GPT-2 tokens (fixed seed), checked with count_tokens.
std::string long_text(Client& client, size_t tokens) {
  static const char* kWords[] = {"the",     "keeper", "of",    "light",  "walked", "along", "cliffs",   "where",
                                 "waves",   "broke",  "on",    "stones", "under",  "grey",  "morning",  "sky",
                                 "and",     "gulls",  "cried", "above",  "harbor", "boats", "returned", "slowly",
                                 "without", "a",      "sound", "while",  "lamps",  "glowed"};
  std::mt19937 rng(42);
  std::string text;
  TokenizeRequest t;
  for (;;) {
    for (int i = 0; i < 100; ++i) {
      text += kWords[rng() % std::size(kWords)];
      text += (rng() % 12 == 0) ? ". " : " ";
    }
    t.text = text;
    auto n = client.count_tokens(t);
    if (!n || *n >= tokens) break;
  }
  return text;
}

// When each stream's tokens arrived.
struct Arrivals {
  std::mutex mu;
  std::vector<std::vector<std::chrono::steady_clock::time_point>> at;  // per stream
  std::atomic<int> finished{0};
  size_t fewest() {
    std::lock_guard<std::mutex> lock(mu);
    size_t n = SIZE_MAX;
    for (const auto& v : at) n = std::min(n, v.size());
    return n;
  }
};

double p99(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(v.size())))];
}

struct ItlFigures {
  double quiet_p99 = 0, loaded_p99 = 0;
  size_t quiet_n = 0, loaded_n = 0, long_prompts = 0;
  uint64_t planning_stalls = 0;  // during the streams (StatusInfo::planning_stalls)
};

uint64_t planning_stalls(Client& client) {
  auto st = client.status(30s);
  EXPECT_TRUE(st) << st.status().to_string();
  return st ? st->planning_stalls : 0;
}

// The CPU time of this thread (ms): what tokenizing costs the thread that does it, whatever
// else this host runs.
double thread_cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// Long prompts in bursts of kBurst, kPause after the previous burst was answered, while `on`. Each is
// refused after tokenization (1,500 tokens do not fit the context of 512), so no worker
// computes it: any change in the streams' pace is the scheduler's.
constexpr size_t kBurst = 8;
constexpr auto kPause = 20ms;

size_t send_long_prompts(Client& client, const std::string& text, const std::atomic<bool>& on,
                         const std::atomic<bool>& done) {
  size_t sent = 0;
  while (!done.load()) {
    if (!on.load()) {
      std::this_thread::sleep_for(1ms);
      continue;
    }
    GenerateRequest r;
    r.prompt_text = text;
    r.max_tokens = 1;
    std::vector<std::shared_ptr<Stream>> burst;
    for (size_t i = 0; i < kBurst; ++i) burst.push_back(client.generate(r));
    for (auto& s : burst) {
      const Streamed out = stream_all(*s);
      EXPECT_NE(out.fin.error_message.find("does not fit the context length"), std::string::npos)
          << out.fin.error_message;
    }
    sent += kBurst;
    std::this_thread::sleep_for(kPause);
  }
  return sent;
}

// Four streams run 480 tokens each. From their 40th token on, segments of 40 tokens alternate
// between quiet and loaded (long text prompts arriving): alternating, so the host's own noise
// falls on both alike. The p99 of the inter-token gaps inside each kind of segment.
ItlFigures measure_itl(const std::string& prompt_threads) {
  // Steps of at least 4 ms (as a larger model's): the worker leaves the CPU to the rest, so what
  // is measured is the scheduler's pace, not a fight for this host's two cores.
  std::vector<std::string> flags = kDeploy;
  flags.insert(flags.end(), {"--prompt-threads", prompt_threads, "--test-step-delay-ms", "4"});
  Deployment d(flags, real_vocab_model());
  EXPECT_TRUE(d.ok());
  if (!d.ok()) return {};
  auto client = d.client();
  const std::string text = long_text(*client, 1500);
  const uint64_t stalls_before = planning_stalls(*client);
  constexpr uint32_t kStreams = 4, kTokens = 480, kSegment = 40;
  Arrivals arrivals;
  arrivals.at.resize(kStreams);
  for (auto& v : arrivals.at) v.reserve(kTokens);
  for (uint32_t i = 0; i < kStreams; ++i) {
    GenerateRequest r;
    r.prompt_tokens = test::prompt_of(8, i);
    r.max_tokens = kTokens;
    r.ignore_eos = true;
    client->generate(r, [&arrivals, i](const Event& ev) {
      if (ev.final) {
        arrivals.finished.fetch_add(1);
        return;
      }
      std::lock_guard<std::mutex> lock(arrivals.mu);
      arrivals.at[i].push_back(std::chrono::steady_clock::now());
    });
  }
  std::atomic<bool> on{false}, done{false};
  ItlFigures f;
  std::thread load([&] { f.long_prompts = send_long_prompts(*client, text, on, done); });
  struct Segment {
    std::chrono::steady_clock::time_point from, to;
    bool loaded;
  };
  std::vector<Segment> segments;
  for (uint32_t at = kSegment; at + kSegment <= kTokens - kSegment; at += kSegment) {
    // Bounded: 60 s per segment only detects a hang.
    for (int i = 0; i < 6000 && arrivals.fewest() < at && arrivals.finished.load() == 0; ++i)
      std::this_thread::sleep_for(1ms);
    const bool loaded = (at / kSegment) % 2 == 0;
    on.store(loaded);
    if (!segments.empty()) segments.back().to = std::chrono::steady_clock::now();
    segments.push_back({std::chrono::steady_clock::now(), {}, loaded});
  }
  segments.back().to = std::chrono::steady_clock::now();
  done.store(true);
  load.join();
  for (int i = 0; i < 6000 && arrivals.finished.load() < static_cast<int>(kStreams); ++i)
    std::this_thread::sleep_for(10ms);
  f.planning_stalls = planning_stalls(*client) - stalls_before;
  std::vector<double> quiet, loaded;
  std::lock_guard<std::mutex> lock(arrivals.mu);
  for (const auto& v : arrivals.at) {
    for (size_t j = 1; j < v.size(); ++j) {
      for (const Segment& seg : segments) {
        if (v[j - 1] < seg.from || v[j] > seg.to) continue;
        (seg.loaded ? loaded : quiet).push_back(std::chrono::duration<double, std::milli>(v[j] - v[j - 1]).count());
      }
    }
  }
  f.quiet_p99 = p99(quiet);
  f.loaded_p99 = p99(loaded);
  f.quiet_n = quiet.size();
  f.loaded_n = loaded.size();
  return f;
}

// Counted, not timed: a turn of the scheduler's loop using more than 1 ms of its thread's CPU
// is a planning stall; with the prompt threads, long prompts cause none (a generous tenth of
// their number is allowed), while tokenizing them on the planning thread makes each one a stall
// whenever one tokenization costs that much CPU here (checked only then). The streams' p99
// inter-token gaps, loaded against quiet in alternating segments, are held to a generous ratio.
TEST(TextService, RunningStreamsKeepTheirPaceWhileLongTextPromptsArrive) {
  SKIP_WITHOUT_VOCAB();
  // What one 1,500-token prompt costs to tokenize, in this process with the same tokenizer.
  auto file = model::GgufFile::open(real_vocab_model()).value();
  const model::Tokenizer tok = model::Tokenizer::from_gguf(*file).value();
  std::string text;
  {
    Deployment d(kDeploy, real_vocab_model());
    ASSERT_TRUE(d.ok());
    text = long_text(*d.client(), 1500);
  }
  const double cpu0 = thread_cpu_ms();
  for (int i = 0; i < 20; ++i) ASSERT_GE(tok.encode(text, true)->size(), 1500u);
  const double tokenize_ms = (thread_cpu_ms() - cpu0) / 20;

  const ItlFigures pool = measure_itl("2");
  const ItlFigures inline_ = measure_itl("0");
  for (const auto& [name, f] : {std::pair{"prompt threads 2", &pool}, {"prompt threads 0", &inline_}}) {
    std::printf(
        "%s: ITL p99 %.2f ms quiet (%zu gaps), %.2f ms with long prompts arriving (%zu gaps); %zu long prompts "
        "(%.2f ms CPU each to tokenize), %llu planning stalls\n",
        name, f->quiet_p99, f->quiet_n, f->loaded_p99, f->loaded_n, f->long_prompts, tokenize_ms,
        static_cast<unsigned long long>(f->planning_stalls));
  }
  ASSERT_GT(pool.quiet_n, 200u);
  ASSERT_GT(pool.loaded_n, 200u);
  ASSERT_GE(pool.long_prompts, 16u);
  EXPECT_LE(pool.planning_stalls, pool.long_prompts / 10);
  if (tokenize_ms > 2.0) EXPECT_GE(inline_.planning_stalls, inline_.long_prompts / 2);  // the count sees them
  // The ITL p99 figures above are reported, not asserted: on a shared 2-core host other load
  // falls on the two kinds of segment unevenly (a CI run failed a 3x bound once); the planning
  // stalls, counted in the scheduler thread's CPU time, are what this test holds.
}

// The count above does see a prompt tokenized on the planning thread: a text of 300,000 bytes
// (some 60,000 tokens, several milliseconds of CPU) is a stall there each time; with the prompt
// threads the planning thread only receives and copies it (a third of them may still cross the
// line on a loaded host or under a sanitizer).
TEST(TextService, AHugeTextPromptStallsPlanningOnlyWithoutPromptThreads) {
  SKIP_WITHOUT_VOCAB();
  constexpr int kPrompts = 6;
  for (const std::string threads : {"2", "0"}) {
    std::vector<std::string> flags = kDeploy;
    flags.insert(flags.end(), {"--prompt-threads", threads});
    Deployment d(flags, real_vocab_model());
    ASSERT_TRUE(d.ok());
    auto client = d.client();
    std::string huge;
    while (huge.size() + 50 < 300'000) huge += "the keeper of light walked along the grey cliffs. ";
    const uint64_t before = planning_stalls(*client);
    for (int i = 0; i < kPrompts; ++i) {
      GenerateRequest r;
      r.prompt_text = huge;
      r.max_tokens = 1;
      const Streamed s = stream_all(*client->generate(r));
      EXPECT_NE(s.fin.error_message.find("does not fit the context length"), std::string::npos) << s.fin.error_message;
    }
    const uint64_t stalls = planning_stalls(*client) - before;
    std::printf("prompt threads %s: %llu planning stalls for %d prompts of 300,000 bytes\n", threads.c_str(),
                static_cast<unsigned long long>(stalls), kPrompts);
    if (threads == "0") {
      EXPECT_GE(stalls, uint64_t{kPrompts});
    } else {
      EXPECT_LE(stalls, uint64_t{kPrompts / 3});
    }
  }
}

}  // namespace
}  // namespace tandem
