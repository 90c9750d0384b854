#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>

#include "tests/test_util.h"
#include "model/gguf.h"

namespace tandem::model {
namespace {

struct Vocab {
  std::string model = "llama";
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  bool write_types = true;

  // <unk>, <s>, </s>, then the 256 byte tokens.
  Vocab() {
    tokens = {"<unk>", "<s>", "</s>"};
    types = {2, 3, 3};
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      tokens.emplace_back(buf);
      types.push_back(6);
    }
  }
  void add(const std::string& piece, int32_t type) {
    tokens.push_back(piece);
    types.push_back(type);
  }

  std::string write(const std::function<void(GgufWriter&)>& extra = {}) const {
    GgufWriter w;
    w.add_string("tokenizer.ggml.model", model);
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    if (write_types) w.add_i32_array("tokenizer.ggml.token_type", types);
    if (extra) extra(w);
    std::string path = test::temp_dir() + "/vocab.gguf";
    Status st = w.write(path);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return path;
  }
};

// Loads a tokenizer; keeps the file alive in `file`.
Result<Tokenizer> load(const std::string& path, std::unique_ptr<GgufFile>& file) {
  auto f = GgufFile::open(path);
  if (!f) return f.status();
  file = std::move(*f);
  return Tokenizer::from_gguf(*file);
}

std::string load_error(const std::string& path) {
  std::unique_ptr<GgufFile> file;
  auto tok = load(path, file);
  if (tok) return "";
  EXPECT_EQ(tok.status().code(), Code::kModelFile);
  EXPECT_EQ(tok.status().message().rfind(path + ": ", 0), 0u) << tok.status().message();
  return tok.status().message();
}

class TinyTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = load(test::model_file("tiny", 1), file);
    ASSERT_TRUE(t) << t.status().to_string();
    tok = std::move(*t);
  }
  std::unique_ptr<GgufFile> file;
  Tokenizer tok;
};

TEST_F(TinyTokenizer, IsByteLevel) {
  EXPECT_EQ(tok.vocab_size(), 512u);
  EXPECT_TRUE(tok.can_encode());
  EXPECT_EQ(tok.kind(), "llama");
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.piece(3), "<0x00>");
  EXPECT_EQ(tok.piece(3 + 0xAB), "<0xAB>");
}

TEST_F(TinyTokenizer, EncodesOneTokenPerByteWithOptionalBos) {
  auto ids = tok.encode("hi\n", true);
  ASSERT_TRUE(ids);
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 3 + 'h', 3 + 'i', 3 + '\n'}));
  auto no_bos = tok.encode("hi", false);
  ASSERT_TRUE(no_bos);
  EXPECT_EQ(*no_bos, (std::vector<int32_t>{3 + 'h', 3 + 'i'}));
  auto empty = tok.encode("", true);
  ASSERT_TRUE(empty);
  EXPECT_EQ(*empty, (std::vector<int32_t>{1}));
  auto none = tok.encode("", false);
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->empty());
}

TEST_F(TinyTokenizer, RandomByteStringsRoundTripByteForByte) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 500; ++i) {
    std::string text(rng() % 64, '\0');
    for (char& c : text) c = static_cast<char>(rng());  // NULs, invalid UTF-8, anything
    if (i == 0) text = std::string("\0\xff\xc3(\xe2\x96\x81 \x80", 9);
    auto ids = tok.encode(text, i % 2 == 0);
    ASSERT_TRUE(ids);
    EXPECT_EQ(ids->size(), text.size() + (i % 2 == 0 ? 1 : 0));
    EXPECT_EQ(tok.decode(*ids), text);
  }
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  EXPECT_EQ(tok.decode(*tok.encode(all, true)), all);
}

TEST_F(TinyTokenizer, ControlUnusedAndOutOfRangeTokensDecodeToNothing) {
  std::vector<int32_t> ids = {1, 3 + 'a', 0, 2, 300, 511, -1, 512, 100000, 3 + 'b'};
  EXPECT_EQ(tok.decode(ids), "ab");
  std::string out = "x";
  tok.append_token_bytes(3 + 'y', out);
  tok.append_token_bytes(400, out);
  EXPECT_EQ(out, "xy");
}

TEST(TokenizerTest, NormalTokensMakeItSentencePiece) {
  Vocab v;
  v.add("\xe2\x96\x81hello", 1);
  v.add("world", 1);
  v.add("<|user|>", 4);
  std::unique_ptr<GgufFile> file;
  auto tok = load(v.write(), file);
  ASSERT_TRUE(tok) << tok.status().to_string();
  EXPECT_TRUE(tok->can_encode());
  // No two-character pieces to merge through: the space prefix and each letter fall back to bytes.
  EXPECT_EQ(*tok->encode("hi", true), (std::vector<int32_t>{1, 3 + 0xe2, 3 + 0x96, 3 + 0x81, 3 + 'h', 3 + 'i'}));
  EXPECT_EQ(*tok->encode("<|user|>", false), (std::vector<int32_t>{261}));  // user-defined: always matched
  std::vector<int32_t> seq = {1, 259, 260, 3 + '!', 261};
  EXPECT_EQ(tok->decode(seq), " helloworld!<|user|>");
  EXPECT_EQ(tok->decode(seq, DecodeOptions{.strip_space_prefix = true}), "helloworld!<|user|>");
}

TEST(TokenizerTest, OtherTokenizerModelsAreRefused) {
  Vocab v;
  v.model = "gpt2";
  std::unique_ptr<GgufFile> file;
  auto tok = load(v.write(), file);
  ASSERT_TRUE(tok) << tok.status().to_string();
  EXPECT_FALSE(tok->can_encode());
  auto ids = tok->encode("hi", false);
  ASSERT_FALSE(ids);
  EXPECT_EQ(ids.status().message(),
            "text prompts need the 'gpt2' tokenizer, but the file has no tokenizer.ggml.merges; pass token ids");

  v.model = "bert";
  std::unique_ptr<GgufFile> file2;
  auto bert = load(v.write(), file2);
  ASSERT_TRUE(bert) << bert.status().to_string();
  EXPECT_EQ(bert->encode("hi", false).status().message(),
            "text prompts need the 'bert' tokenizer, which tandem does not support; pass token ids");
  EXPECT_EQ(bert->decode(std::vector<int32_t>{3 + 'o', 3 + 'k'}), "ok");  // decoding still works
}

TEST(TokenizerTest, WithoutAllByteTokensItIsSentencePiece) {
  Vocab v;
  v.tokens[3 + 0x41] = "<unused-A>";
  v.types[3 + 0x41] = 5;
  std::unique_ptr<GgufFile> file;
  auto tok = load(v.write(), file);
  ASSERT_TRUE(tok) << tok.status().to_string();
  // 'A' has neither a piece nor a byte token: <unk>.
  EXPECT_EQ(*tok->encode("A", false), (std::vector<int32_t>{3 + 0xe2, 3 + 0x96, 3 + 0x81, 0}));

  Vocab untyped;  // no token_type array: every token is normal
  untyped.write_types = false;
  std::unique_ptr<GgufFile> file2;
  auto tok2 = load(untyped.write(), file2);
  ASSERT_TRUE(tok2) << tok2.status().to_string();
  std::vector<int32_t> ids = {3};
  EXPECT_EQ(tok2->decode(ids), "<0x00>");  // a normal token decodes to its piece
}

TEST(TokenizerTest, LowercaseByteTokensAndCustomSpecialIds) {
  Vocab v;
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02x>", b);
    v.tokens[3 + static_cast<size_t>(b)] = buf;
  }
  v.add("<eot>", 3);
  std::unique_ptr<GgufFile> file;
  auto tok = load(v.write([](GgufWriter& w) {
    w.add_u32("tokenizer.ggml.bos_token_id", 2);
    w.add_u32("tokenizer.ggml.eos_token_id", 259);
  }),
                  file);
  ASSERT_TRUE(tok) << tok.status().to_string();
  EXPECT_TRUE(tok->can_encode());
  EXPECT_EQ(tok->bos_id(), 2);
  EXPECT_EQ(tok->eos_id(), 259);
  EXPECT_EQ(*tok->encode("\xfe", true), (std::vector<int32_t>{2, 3 + 0xfe}));
}

TEST(TokenizerTest, DuplicateTokens) {
  Vocab v;
  v.add("<unused0>", 5);
  v.add("<unused0>", 5);
  EXPECT_NE(load_error(v.write()).find("duplicate token '<unused0>' (ids 259 and 260)"), std::string::npos);
}

TEST(TokenizerTest, MismatchedArrays) {
  Vocab v;
  v.types.pop_back();
  EXPECT_NE(load_error(v.write()).find("tokenizer.ggml.token_type has 258 entries, tokenizer.ggml.tokens has 259"),
            std::string::npos);
  Vocab s;
  EXPECT_NE(load_error(s.write([](GgufWriter& w) {
              w.add_f32_array("tokenizer.ggml.scores", {0.0f});
            })).find("tokenizer.ggml.scores has 1 entries, tokenizer.ggml.tokens has 259"),
            std::string::npos);
}

TEST(TokenizerTest, SpecialIdsOutOfRange) {
  Vocab v;
  EXPECT_NE(load_error(v.write([](GgufWriter& w) {
              w.add_u32("tokenizer.ggml.eos_token_id", 259);
            })).find("tokenizer.ggml.eos_token_id 259 is out of range (vocabulary of 259 tokens)"),
            std::string::npos);
  EXPECT_NE(load_error(v.write([](GgufWriter& w) {
              w.add_i32("tokenizer.ggml.bos_token_id", -1);
            })).find("key tokenizer.ggml.bos_token_id is not a non-negative integer"),
            std::string::npos);
}

TEST(TokenizerTest, MissingKeysAndBadTypes) {
  GgufWriter no_model;
  no_model.add_string_array("tokenizer.ggml.tokens", {"a"});
  std::string nm = test::temp_dir() + "/no_model.gguf";
  ASSERT_TRUE(no_model.write(nm).is_ok());
  EXPECT_NE(load_error(nm).find("missing key tokenizer.ggml.model"), std::string::npos);

  GgufWriter w;
  w.add_string("tokenizer.ggml.model", "llama");
  std::string path = test::temp_dir() + "/none.gguf";
  ASSERT_TRUE(w.write(path).is_ok());
  EXPECT_NE(load_error(path).find("missing key tokenizer.ggml.tokens"), std::string::npos);
  w.add_i32_array("tokenizer.ggml.tokens", {1, 2});
  ASSERT_TRUE(w.write(path).is_ok());
  EXPECT_NE(load_error(path).find("key tokenizer.ggml.tokens is not an array of strings"), std::string::npos);

  Vocab v;
  v.tokens[3] = "<0xZZ>";  // typed byte, but not a byte piece
  EXPECT_NE(load_error(v.write()).find("token 3 has type byte but its piece '<0xZZ>' is not <0xHH>"),
            std::string::npos);
  Vocab u;
  u.types[5] = 9;
  EXPECT_NE(load_error(u.write()).find("token 5 has unknown token type 9"), std::string::npos);
}

// A byte-pair vocabulary of a few tokens (no byte characters but "a", "b", " "/"Ġ").
std::string small_bpe(const std::string& pre, const std::vector<std::string>& merges) {
  GgufWriter w;
  w.add_string("tokenizer.ggml.model", "gpt2");
  if (!pre.empty()) w.add_string("tokenizer.ggml.pre", pre);
  w.add_string_array("tokenizer.ggml.tokens", {"a", "b", "ab", "\xc4\xa0",
                                               "\xc4\xa0"
                                               "ab",
                                               "<|im_end|>", "<|im_start|>"});
  w.add_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 1, 1, 3, 3});
  w.add_string_array("tokenizer.ggml.merges", merges);
  w.add_u32("tokenizer.ggml.eos_token_id", 6);
  std::string path = test::temp_dir() + "/bpe.gguf";
  EXPECT_TRUE(w.write(path).is_ok());
  return path;
}

TEST(TokenizerTest, BytePairMergesByRankAndMapsSpaces) {
  std::unique_ptr<GgufFile> file;
  auto tok = load(small_bpe("gpt-2", {"a b",
                                      "\xc4\xa0 "
                                      "ab"}),
                  file);
  ASSERT_TRUE(tok) << tok.status().to_string();
  ASSERT_TRUE(tok->can_encode());
  EXPECT_EQ(*tok->encode("ab ab", true), (std::vector<int32_t>{2, 4}));  // gpt2: no BOS unless the file asks
  EXPECT_EQ(tok->decode(std::vector<int32_t>{2, 4}), "ab ab");
}

TEST(TokenizerTest, SpecialTokensOnlyWhenAskedAndEndOfGeneration) {
  std::unique_ptr<GgufFile> file;
  auto tok = load(small_bpe("gpt-2", {"a b"}), file);
  ASSERT_TRUE(tok) << tok.status().to_string();
  // Control tokens written in text stay text unless parse_special (here: no such byte tokens, so dropped).
  EXPECT_EQ(*tok->encode("ab<|im_end|>", EncodeOptions{.parse_special = true}), (std::vector<int32_t>{2, 5}));
  auto plain = tok->encode("ab<|im_end|>", EncodeOptions{});
  ASSERT_TRUE(plain);
  EXPECT_EQ(std::count(plain->begin(), plain->end(), 5), 0);
  // <|im_end|> ends generation by its text (and is the end-of-turn token), beside eos.
  EXPECT_EQ(tok->eot_id(), 5);
  EXPECT_TRUE(tok->is_eog(5));
  EXPECT_TRUE(tok->is_eog(6));
  EXPECT_FALSE(tok->is_eog(2));
  EXPECT_EQ(tok->eog_ids(), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{2, 5}), "ab");
  EXPECT_EQ(tok->decode(std::vector<int32_t>{2, 5}, DecodeOptions{.special = true}), "ab<|im_end|>");
}

TEST(TokenizerTest, BrokenMergesAndUnknownPreTokenizers) {
  EXPECT_NE(load_error(small_bpe("gpt-2", {"a b", "ab"})).find("tokenizer.ggml.merges[1] 'ab' is not two tokens"),
            std::string::npos);
  EXPECT_NE(load_error(small_bpe("gpt-2", {"b a"}))
                .find("tokenizer.ggml.merges[0] 'b a' names a token the vocabulary does not have"),
            std::string::npos);
  std::unique_ptr<GgufFile> file;
  auto tok = load(small_bpe("tekken", {"a b"}), file);
  ASSERT_TRUE(tok) << tok.status().to_string();
  EXPECT_EQ(tok->encode("ab", false).status().message(),
            "text prompts need the 'gpt2' tokenizer with pre-tokenizer 'tekken' (tokenizer.ggml.pre), which tandem "
            "does not support; pass token ids");
  std::unique_ptr<GgufFile> file2;
  auto no_pre = load(small_bpe("", {"a b"}), file2);  // llama.cpp's fallback: "default"
  ASSERT_TRUE(no_pre) << no_pre.status().to_string();
  EXPECT_EQ(*no_pre->encode("ab", false), (std::vector<int32_t>{2}));
}

TEST(TokenizerTest, InvalidUtf8IsRefusedExceptByByteLevelVocabularies) {
  Vocab v;
  v.add("\xe2\x96\x81", 1);
  std::unique_ptr<GgufFile> file;
  auto tok = load(v.write(), file);
  ASSERT_TRUE(tok) << tok.status().to_string();
  auto bad = tok->encode("ok\xc3(", false);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.status().message(), "text is not valid UTF-8 (byte 2)");
  EXPECT_EQ(*tok->encode("a b", false), (std::vector<int32_t>{259, 3 + 'a', 259, 3 + 'b'}));
}

TEST_F(TinyTokenizer, StreamDecoderHoldsBytesUntilACharacterIsWhole) {
  StreamDecoder stream(tok);
  std::string out;
  const std::string euro = "\xe2\x82\xac";
  for (size_t i = 0; i < euro.size(); ++i) {
    stream.push(3 + static_cast<unsigned char>(euro[i]), out);
    EXPECT_EQ(out, i + 1 < euro.size() ? "" : euro) << "after byte " << i;
  }
  stream.push(3 + '!', out);
  EXPECT_EQ(out, "\xe2\x82\xac!");
  stream.push(3 + 0xf0, out);  // the start of a 4-byte character, never finished
  EXPECT_EQ(out, "\xe2\x82\xac!");
  stream.flush(out);
  EXPECT_EQ(out, "\xe2\x82\xac!\xf0");
  EXPECT_TRUE(tok.is_eog(tok.eos_id()));
  EXPECT_FALSE(tok.is_eog(tok.bos_id()));
  // Byte-level vocabularies add no space prefix, so none is stripped (found by tokenizer_fuzz).
  EXPECT_EQ(tok.decode(*tok.encode(" a", true), DecodeOptions{.strip_space_prefix = true}), " a");
}

}  // namespace
}  // namespace tandem::model
