#include "scheduler/admission.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "scheduler/stops.h"
#include "tests/test_util.h"

namespace tandem::scheduler {
namespace {

// (The test targets link GoogleTest without gmock, so no HasSubstr.)
::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// A tokenizer loaded from a GGUF file; the file stays open beside it.
struct LoadedTokenizer {
  std::unique_ptr<model::GgufFile> file;
  std::unique_ptr<model::Tokenizer> tok;

  explicit LoadedTokenizer(const std::string& path) {
    auto f = model::GgufFile::open(path);
    EXPECT_TRUE(f.is_ok()) << f.status().to_string();
    if (!f) return;
    file = std::move(*f);
    auto t = model::Tokenizer::from_gguf(*file);
    EXPECT_TRUE(t.is_ok()) << t.status().to_string();
    if (t) tok = std::make_unique<model::Tokenizer>(std::move(*t));
  }
};

// The make-model tiny vocabulary: byte-level, 512 tokens.
const model::Tokenizer& tiny() {
  static LoadedTokenizer t(test::model_file("tiny"));
  return *t.tok;
}

// A WordPiece ("bert") vocabulary: loads, but tandem cannot encode text with it.
const model::Tokenizer& not_byte_level() {
  static LoadedTokenizer t([] {
    std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
    std::vector<int32_t> types = {2, 3, 3};
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      tokens.emplace_back(buf);
      types.push_back(6);
    }
    tokens.emplace_back("\xe2\x96\x81hello");
    types.push_back(1);
    model::GgufWriter w;
    w.add_string("tokenizer.ggml.model", "bert");
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add_i32_array("tokenizer.ggml.token_type", types);
    const std::string path = test::temp_dir() + "/sp.gguf";
    EXPECT_TRUE(w.write(path).is_ok());
    return path;
  }());
  return *t.tok;
}

AdmissionLimits limits() {
  AdmissionLimits l;
  l.context_length = 512;
  l.vocab_size = 512;
  return l;
}

// A valid token prompt; tests break one field at a time.
v1::Submit valid() {
  v1::Submit s;
  s.set_request_id("req-1");
  for (int32_t id : {1, 72, 105}) s.mutable_tokens()->add_ids(id);
  s.set_max_tokens(16);
  return s;
}

std::string error_of(const v1::Submit& s, const AdmissionLimits& l = limits(), const model::Tokenizer& tok = tiny()) {
  auto r = admit(s, tok, l);
  if (r.is_ok()) return "(admitted)";
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().to_string();
  return r.status().message();
}

int32_t byte_token(const model::Tokenizer& tok, char c) { return tok.encode(std::string(1, c), false)->front(); }

TEST(Admission, ValidTextPrompt) {
  ASSERT_TRUE(tiny().can_encode());
  v1::Submit s;
  s.set_request_id("r-text");
  s.set_text("hi");
  s.set_max_tokens(10);
  auto* p = s.mutable_sampling();
  p->set_temperature(0.7f);
  p->set_top_k(40);
  p->set_top_p(0.9f);
  p->set_min_p(0.05f);
  p->set_repetition_penalty(1.1f);
  p->set_seed(42);
  p->set_top_logprobs(3);
  auto* seq = s.add_stop_token_sequences();
  seq->add_ids(5);
  seq->add_ids(6);
  s.add_stop_strings("\n\n");
  s.set_include_stop_string(true);
  s.set_ignore_eos(true);
  s.set_logprobs(true);
  s.set_stream(true);
  s.set_priority(-3);
  s.set_timeout_ms(500);

  auto r = admit(s, tiny(), limits());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const RequestSpec& spec = *r;
  EXPECT_EQ(spec.id, "r-text");
  EXPECT_EQ(spec.prompt, (std::vector<int32_t>{tiny().bos_id(), byte_token(tiny(), 'h'), byte_token(tiny(), 'i')}));
  EXPECT_EQ(spec.max_tokens, 10u);
  EXPECT_FLOAT_EQ(spec.sampling.temperature, 0.7f);
  EXPECT_EQ(spec.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(spec.sampling.top_p, 0.9f);
  EXPECT_FLOAT_EQ(spec.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(spec.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(spec.sampling.seed, 42u);
  EXPECT_EQ(spec.sampling.top_logprobs, 3);
  EXPECT_EQ(spec.stop_token_sequences, (std::vector<std::vector<int32_t>>{{5, 6}}));
  EXPECT_EQ(spec.stop_strings, (std::vector<std::string>{"\n\n"}));
  EXPECT_TRUE(spec.include_stop_string);
  EXPECT_TRUE(spec.ignore_eos);
  EXPECT_TRUE(spec.logprobs);
  EXPECT_TRUE(spec.stream);
  EXPECT_EQ(spec.priority, -3);
  EXPECT_EQ(spec.timeout_ms, 500u);
}

// spec_tokens: absent, 0 and 16 admitted as given; more than 16 refused, naming the field.
TEST(Admission, SpecTokensPerRequest) {
  EXPECT_FALSE(admit(valid(), tiny(), limits())->spec_tokens.has_value());
  for (uint32_t k : {0u, 16u}) {
    v1::Submit s = valid();
    s.set_spec_tokens(k);
    EXPECT_EQ(admit(s, tiny(), limits())->spec_tokens, std::optional<uint32_t>(k));
  }
  v1::Submit s = valid();
  s.set_spec_tokens(17);
  EXPECT_EQ(error_of(s), "spec_tokens 17 is more than 16 drafts a round (0: this request does not speculate)");
}

TEST(Admission, TextPromptWithoutBos) {
  v1::Submit s = valid();
  s.set_text("ok");
  s.set_no_bos(true);
  auto r = admit(s, tiny(), limits());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->prompt, (std::vector<int32_t>{byte_token(tiny(), 'o'), byte_token(tiny(), 'k')}));
}

TEST(Admission, ValidTokenPromptWithDefaults) {
  v1::Submit s = valid();
  s.set_no_bos(true);  // tokens are used as given either way
  auto r = admit(s, tiny(), limits());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const RequestSpec& spec = *r;
  EXPECT_EQ(spec.id, "req-1");
  EXPECT_EQ(spec.prompt, (std::vector<int32_t>{1, 72, 105}));
  EXPECT_EQ(spec.max_tokens, 16u);
  // No `sampling`: greedy, everything off.
  EXPECT_EQ(spec.sampling.temperature, 0.0f);
  EXPECT_EQ(spec.sampling.top_k, 0);
  EXPECT_EQ(spec.sampling.top_p, 1.0f);
  EXPECT_EQ(spec.sampling.min_p, 0.0f);
  EXPECT_EQ(spec.sampling.repetition_penalty, 1.0f);
  EXPECT_EQ(spec.sampling.seed, 0u);
  EXPECT_EQ(spec.sampling.top_logprobs, 0);
  EXPECT_TRUE(spec.stop_token_sequences.empty());
  EXPECT_TRUE(spec.stop_strings.empty());
  EXPECT_FALSE(spec.include_stop_string);
  EXPECT_FALSE(spec.ignore_eos);
  EXPECT_FALSE(spec.logprobs);
  EXPECT_FALSE(spec.stream);  // proto3 default
  EXPECT_EQ(spec.priority, 0);
  EXPECT_EQ(spec.timeout_ms, 0u);
}

TEST(Admission, Proto3ZeroTopPAndRepetitionPenaltyMeanOff) {
  v1::Submit s = valid();
  s.mutable_sampling()->set_temperature(1.0f);  // top_p, repetition_penalty left at 0
  auto r = admit(s, tiny(), limits());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->sampling.temperature, 1.0f);
  EXPECT_EQ(r->sampling.top_p, 1.0f);
  EXPECT_EQ(r->sampling.repetition_penalty, 1.0f);
}

TEST(Admission, RequestId) {
  v1::Submit s = valid();
  s.set_request_id("");
  EXPECT_EQ(error_of(s), "request_id: empty");
  s.set_request_id(std::string(257, 'x'));
  EXPECT_EQ(error_of(s), "request_id: 257 bytes, at most 256");
  s.set_request_id(std::string(256, 'x'));
  EXPECT_EQ(error_of(s), "(admitted)");
  // The first bad field is named.
  s.set_request_id("");
  s.clear_prompt();
  EXPECT_EQ(error_of(s), "request_id: empty");
}

// logit_bias ids are checked against the model's vocabulary (512 here) at admission, naming the
// id; the other sampling bounds are validate()'s, named by field.
TEST(Admission, LogitBiasAndPenalties) {
  v1::Submit s = valid();
  auto* bias = s.mutable_sampling()->add_logit_bias();
  bias->set_token(511);
  bias->set_bias(-100.0f);
  s.mutable_sampling()->set_presence_penalty(1.5f);
  s.mutable_sampling()->set_frequency_penalty(-2.0f);
  auto ok = admit(s, tiny(), limits());
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->sampling.logit_bias, (std::vector<model::LogitBias>{{511, -100.0f}}));
  EXPECT_EQ(ok->sampling.presence_penalty, 1.5f);
  EXPECT_EQ(ok->sampling.frequency_penalty, -2.0f);
  bias->set_token(512);
  EXPECT_EQ(error_of(s), "logit_bias: token id 512 is outside the vocabulary of 512");
  bias->set_token(-3);
  EXPECT_EQ(error_of(s), "logit_bias: token id -3 is negative");
  bias->set_token(5);
  bias->set_bias(100.5f);
  EXPECT_EQ(error_of(s), "logit_bias: bias 100.5 for token 5 is outside [-100, 100]");
  bias->set_bias(1.0f);
  s.mutable_sampling()->set_presence_penalty(2.5f);
  EXPECT_EQ(error_of(s), "presence_penalty 2.5 is outside [-2, 2]");
}

TEST(Admission, Principal) {
  v1::Submit s = valid();
  s.set_principal(std::string(128, '~'));
  auto spec = admit(s, tiny(), limits());
  ASSERT_TRUE(spec) << spec.status().to_string();
  EXPECT_EQ(spec->principal, std::string(128, '~'));
  s.set_principal("alice smith@example.com");
  EXPECT_EQ(error_of(s), "(admitted)");
  s.set_principal(std::string(129, 'p'));
  EXPECT_EQ(error_of(s), "principal: 129 bytes, at most 128");
  s.set_principal("line\nbreak");
  EXPECT_EQ(error_of(s), "principal: byte 10 at position 4 is not printable ASCII (0x20..0x7e)");
  s.set_principal("caf\xc3\xa9");
  EXPECT_EQ(error_of(s), "principal: byte 195 at position 3 is not printable ASCII (0x20..0x7e)");
}

TEST(Admission, PromptMissingOrEmpty) {
  v1::Submit s = valid();
  s.clear_prompt();
  EXPECT_TRUE(Contains(error_of(s), "prompt: missing"));
  s.set_text("");  // would encode to BOS alone: still empty
  EXPECT_EQ(error_of(s), "prompt: empty");
  s.set_no_bos(true);
  EXPECT_EQ(error_of(s), "prompt: empty");
  s.mutable_tokens();  // set, with no ids
  EXPECT_EQ(error_of(s), "prompt: empty");
}

TEST(Admission, TextTooLong) {
  AdmissionLimits l = limits();
  l.max_prompt_bytes = 8;
  v1::Submit s = valid();
  s.set_text("123456789");
  EXPECT_EQ(error_of(s, l), "prompt: text of 9 bytes, at most 8");
  s.set_text("12345678");
  EXPECT_EQ(error_of(s, l), "(admitted)");
}

// #18 item 5: a conversation is bounded in messages and in bytes (messages and tools together),
// checked before it is copied; a token prompt as long as the context is refused before its ids
// are copied.
TEST(Admission, ConversationAndTokenPromptBounds) {
  AdmissionLimits l = limits();
  l.max_prompt_bytes = 64;
  v1::Submit s = valid();
  v1::Chat* chat = s.mutable_chat();
  for (size_t i = 0; i < kMaxChatMessages + 1; ++i) chat->add_messages()->set_role("user");
  EXPECT_EQ(error_of(s, l), "messages: 4097 messages, at most 4096");
  chat->Clear();
  chat->add_messages()->set_content(std::string(40, 'c'));
  chat->set_tools_json(std::string(40, 't'));
  EXPECT_EQ(error_of(s, l), "messages: conversation of 80 bytes, at most 64 (messages and tools_json together)");
  v1::Submit t = valid();
  t.mutable_tokens()->mutable_ids()->Resize(100000, 7);
  EXPECT_EQ(error_of(t),
            "prompt of 100000 tokens does not fit the context length 512 (it must leave room for one generated token)");
}

// The client socket's message bound: the largest Submit at every limit fits it, with room for
// CurveZMQ's per-message overhead (a MESSAGE command's name, nonce and MAC: 33 bytes).
TEST(Admission, TheLargestSubmitFitsTheClientMessageBound) {
  AdmissionLimits l = limits();
  v1::ClientMessage m;
  m.set_version(1);
  v1::Submit& s = *m.mutable_submit();
  s.set_request_id(std::string(l.max_request_id_bytes, 'r'));
  s.set_principal(std::string(runtime::kMaxPrincipalBytes, 'p'));
  v1::Chat* chat = s.mutable_chat();
  const size_t per = l.max_prompt_bytes / kMaxChatMessages / 5;
  for (size_t i = 0; i < kMaxChatMessages; ++i) {
    v1::ChatMessage* msg = chat->add_messages();
    for (std::string* f : {msg->mutable_role(), msg->mutable_content(), msg->mutable_name(),
                           msg->mutable_tool_call_id(), msg->mutable_tool_calls_json()})
      f->assign(per, 'x');
  }
  for (size_t i = 0; i < kMaxStopStrings; ++i) s.add_stop_strings(std::string(kMaxStopStringBytes, 's'));
  for (size_t i = 0; i < kMaxStopSequences; ++i)
    s.add_stop_token_sequences()->mutable_ids()->Resize(kMaxStopSequenceTokens, 511);
  s.set_max_tokens(~0u);
  s.set_priority(-1);
  s.set_timeout_ms(~0u);
  s.mutable_sampling()->set_seed(~uint64_t{0});
  s.mutable_sampling()->set_top_k(-1);
  for (size_t i = 0; i < model::kMaxLogitBias; ++i) {
    auto* b = s.mutable_sampling()->add_logit_bias();
    b->set_token(INT32_MAX);
    b->set_bias(-100.0f);
  }
  EXPECT_LE(m.ByteSizeLong() + 64, max_client_message_bytes(l));
  // A token prompt of a long context is bound by its ids.
  l.context_length = 1 << 20;
  s.mutable_tokens()->mutable_ids()->Resize(static_cast<int>(l.context_length - 1), (1 << 30));
  EXPECT_LE(m.ByteSizeLong() + 64, max_client_message_bytes(l));
}

TEST(Admission, TextWithATokenizerThatCannotEncode) {
  ASSERT_FALSE(not_byte_level().can_encode());
  v1::Submit s = valid();
  EXPECT_EQ(error_of(s, limits(), not_byte_level()), "(admitted)");  // token ids still work
  s.set_text("hello");
  const std::string err = error_of(s, limits(), not_byte_level());
  EXPECT_TRUE(Contains(err, "prompt: "));
  EXPECT_TRUE(Contains(err, not_byte_level().encode("hello", true).status().message()));
}

TEST(Admission, TokenOutsideVocabulary) {
  v1::Submit s = valid();
  s.mutable_tokens()->add_ids(512);
  EXPECT_TRUE(Contains(error_of(s), "prompt: token id 512 at position 3 is outside the vocabulary of 512"));
  s.mutable_tokens()->set_ids(3, -1);
  EXPECT_TRUE(Contains(error_of(s), "token id -1 at position 3 is outside the vocabulary of 512"));
  s.mutable_tokens()->set_ids(3, 511);
  EXPECT_EQ(error_of(s), "(admitted)");
}

TEST(Admission, PromptMustLeaveRoomForOneToken) {
  v1::Submit s = valid();
  s.set_max_tokens(1);
  s.mutable_tokens()->mutable_ids()->Resize(512, 7);
  EXPECT_TRUE(Contains(error_of(s), "prompt of 512 tokens does not fit the context length 512"));
  EXPECT_EQ(error_of(s).rfind("prompt", 0), 0u);
  s.mutable_tokens()->mutable_ids()->Resize(511, 7);
  EXPECT_EQ(error_of(s), "(admitted)");
  // A text of 511 bytes plus BOS is 512 tokens.
  s.set_text(std::string(511, 'a'));
  EXPECT_TRUE(Contains(error_of(s), "prompt of 512 tokens does not fit the context length 512"));
  s.set_no_bos(true);
  EXPECT_EQ(error_of(s), "(admitted)");
}

TEST(Admission, MaxTokens) {
  v1::Submit s = valid();
  s.set_max_tokens(0);
  EXPECT_EQ(error_of(s), "max_tokens must be >= 1");
  s.mutable_tokens()->mutable_ids()->Resize(510, 7);
  s.set_max_tokens(3);
  EXPECT_EQ(error_of(s), "max_tokens 3 with a prompt of 510 tokens exceeds the context length 512");
  s.set_max_tokens(4294967295u);  // no overflow
  EXPECT_TRUE(Contains(error_of(s), "exceeds the context length 512"));
  s.set_max_tokens(2);  // exactly fills the context
  auto r = admit(s, tiny(), limits());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->max_tokens, 2u);
}

TEST(Admission, Sampling) {
  v1::Submit s = valid();
  s.mutable_sampling()->set_top_p(1.5f);
  EXPECT_EQ(error_of(s), "top_p 1.5 is outside (0, 1]");
  s.mutable_sampling()->set_top_p(-0.5f);
  EXPECT_TRUE(Contains(error_of(s), "top_p -0.5 is outside (0, 1]"));
  s.mutable_sampling()->set_top_p(0.5f);
  s.mutable_sampling()->set_temperature(-1.0f);
  EXPECT_TRUE(Contains(error_of(s), "temperature -1"));
  s.mutable_sampling()->set_temperature(0.5f);
  s.mutable_sampling()->set_top_k(-2);
  EXPECT_TRUE(Contains(error_of(s), "top_k -2"));
  s.mutable_sampling()->set_top_k(0);
  s.mutable_sampling()->set_min_p(2.0f);
  EXPECT_TRUE(Contains(error_of(s), "min_p 2 is outside [0, 1]"));
  s.mutable_sampling()->set_min_p(0.0f);
  s.mutable_sampling()->set_repetition_penalty(-1.0f);
  EXPECT_TRUE(Contains(error_of(s), "repetition_penalty -1"));
  s.mutable_sampling()->set_repetition_penalty(1.2f);
  s.mutable_sampling()->set_top_logprobs(model::kMaxTopLogprobs + 1);
  EXPECT_TRUE(Contains(error_of(s), "top_logprobs 21 is outside [0, 20]"));
  s.mutable_sampling()->set_top_logprobs(model::kMaxTopLogprobs);
  EXPECT_EQ(error_of(s), "(admitted)");
}

TEST(Admission, StopTokenSequences) {
  v1::Submit s = valid();
  for (size_t i = 0; i < kMaxStopSequences; ++i) s.add_stop_token_sequences()->add_ids(2);
  EXPECT_EQ(error_of(s), "(admitted)");
  s.add_stop_token_sequences()->add_ids(2);
  EXPECT_EQ(error_of(s), "stop_token_sequences: 17 given, at most 16");

  s.clear_stop_token_sequences();
  s.add_stop_token_sequences()->add_ids(2);
  s.add_stop_token_sequences();
  EXPECT_EQ(error_of(s), "stop_token_sequences[1]: empty");

  s.mutable_stop_token_sequences(1)->mutable_ids()->Resize(kMaxStopSequenceTokens + 1, 3);
  EXPECT_EQ(error_of(s), "stop_token_sequences[1]: 65 tokens, at most 64");

  s.mutable_stop_token_sequences(1)->mutable_ids()->Resize(kMaxStopSequenceTokens, 3);
  EXPECT_EQ(error_of(s), "(admitted)");
  s.mutable_stop_token_sequences(1)->set_ids(5, 600);
  EXPECT_TRUE(
      Contains(error_of(s), "stop_token_sequences[1]: token id 600 at position 5 is outside the vocabulary of 512"));
}

TEST(Admission, StopStrings) {
  v1::Submit s = valid();
  for (size_t i = 0; i < kMaxStopStrings; ++i) s.add_stop_strings("x");
  EXPECT_EQ(error_of(s), "(admitted)");
  s.add_stop_strings("y");
  EXPECT_EQ(error_of(s), "stop_strings: 17 given, at most 16");

  s.clear_stop_strings();
  s.add_stop_strings("ok");
  s.add_stop_strings("");
  EXPECT_EQ(error_of(s), "stop_strings[1]: empty");
  s.set_stop_strings(1, std::string(kMaxStopStringBytes + 1, 'z'));
  EXPECT_EQ(error_of(s), "stop_strings[1]: 257 bytes, at most 256");
  s.set_stop_strings(1, std::string(kMaxStopStringBytes, 'z'));
  EXPECT_EQ(error_of(s), "(admitted)");
}

// What admission accepts, the stop matchers build.
TEST(Admission, AdmittedStopsBuild) {
  v1::Submit s = valid();
  for (size_t i = 0; i < kMaxStopSequences; ++i) {
    s.add_stop_token_sequences()->mutable_ids()->Resize(kMaxStopSequenceTokens, 4);
  }
  for (size_t i = 0; i < kMaxStopStrings; ++i) s.add_stop_strings(std::string(kMaxStopStringBytes, 'q'));
  auto r = admit(s, tiny(), limits());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(StopTokenMatcher::build(r->stop_token_sequences).is_ok());
  EXPECT_TRUE(StopStringMatcher::build(r->stop_strings, r->include_stop_string).is_ok());
}

// Conversations: rendered with the renderer's chat template, errors naming the problem.
constexpr const char* kChatMl =
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

v1::Submit chat_submit(std::initializer_list<std::pair<const char*, const char*>> messages) {
  v1::Submit s;
  s.set_request_id("r-chat");
  s.set_max_tokens(4);
  for (const auto& [role, content] : messages) {
    v1::ChatMessage* m = s.mutable_chat()->add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  return s;
}

std::string chat_error(const v1::Submit& s, const PromptRenderer& renderer, const AdmissionLimits& l = limits()) {
  auto r = admit(s, renderer, l);
  if (r.is_ok()) return "(admitted)";
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().to_string();
  return r.status().message();
}

TEST(Admission, MessagesAreRenderedWithTheChatTemplate) {
  const PromptRenderer renderer(tiny(), kChatMl);
  auto r = admit(chat_submit({{"system", "be brief"}, {"user", "hi"}}), renderer, limits());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  // The template writes bos_token ("<s>"): BOS appears once, as the token, not as text.
  const std::string text =
      "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
      "<|im_start|>assistant\n";
  std::vector<int32_t> want = {tiny().bos_id()};
  const auto body = tiny().encode(text, false).value();
  want.insert(want.end(), body.begin(), body.end());
  EXPECT_EQ(r->prompt, want);
  EXPECT_TRUE(r->chat);
}

TEST(Admission, MessagesErrorsNameTheProblem) {
  const PromptRenderer with(tiny(), kChatMl), without(tiny(), std::nullopt);
  EXPECT_EQ(chat_error(chat_submit({{"user", "hi"}}), without),
            "messages: the model has no chat template (tokenizer.chat_template)");
  EXPECT_TRUE(Contains(chat_error(chat_submit({{"user", "hi"}}), PromptRenderer(tiny(), "{% if %}")),
                       "messages: the model's chat template does not parse"));
  EXPECT_TRUE(Contains(chat_error(chat_submit({{"user", "hi"}, {"asistant", "x"}}), with),
                       "messages[1]: unknown role 'asistant'"));
  const PromptRenderer raising(tiny(), "{{ raise_exception('System role not supported') }}");
  EXPECT_EQ(chat_error(chat_submit({{"system", "x"}}), raising), "messages: chat template: System role not supported");
  v1::Submit empty;
  empty.set_request_id("r");
  empty.set_max_tokens(1);
  empty.mutable_chat();
  EXPECT_EQ(chat_error(empty, with), "messages: empty");
  v1::Submit calls = chat_submit({{"assistant", ""}});
  calls.mutable_chat()->mutable_messages(0)->set_tool_calls_json("{\"not\": \"a list\"}");
  EXPECT_EQ(chat_error(calls, with), "messages[0].tool_calls_json: not a JSON array");
  v1::Submit tools = chat_submit({{"user", "x"}});
  tools.mutable_chat()->set_tools_json("[1,");
  EXPECT_TRUE(Contains(chat_error(tools, with), "tools_json: "));
  // Too long once rendered: the template's own text counts.
  const std::string long_text(500, 'a');
  EXPECT_TRUE(Contains(chat_error(chat_submit({{"user", long_text.c_str()}}), with),
                       "tokens (the messages rendered with the chat template) does not fit the context length 512"));
}

}  // namespace
}  // namespace tandem::scheduler
