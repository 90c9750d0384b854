#include "model/make_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "tests/test_util.h"
#include "model/gguf.h"
#include "model/half.h"
#include "model/tokenizer.h"

namespace tandem::model {
namespace {

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

uint64_t fnv1a(const void* data, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::span<const float> floats(const GgufTensor& t) {
  return {reinterpret_cast<const float*>(t.data), static_cast<size_t>(t.elements())};
}

TEST(MakeModelTest, Presets) {
  auto tiny = preset_config("tiny");
  ASSERT_TRUE(tiny);
  EXPECT_EQ(tiny->name, "tandem-tiny");
  EXPECT_EQ(tiny->vocab_size, 512u);
  EXPECT_EQ(tiny->dim, 64u);
  EXPECT_EQ(tiny->n_layers, 2u);
  EXPECT_EQ(tiny->n_heads, 4u);
  EXPECT_EQ(tiny->n_kv_heads, 2u);
  EXPECT_EQ(tiny->ffn_dim, 192u);
  EXPECT_EQ(tiny->context_length, 512u);
  EXPECT_FALSE(tiny->tied_embeddings);
  auto small = preset_config("small");
  ASSERT_TRUE(small);
  EXPECT_EQ(small->name, "tandem-small");
  EXPECT_EQ(small->vocab_size, 49152u);
  EXPECT_EQ(small->dim, 576u);
  EXPECT_EQ(small->n_layers, 30u);
  EXPECT_EQ(small->n_heads, 9u);
  EXPECT_EQ(small->n_kv_heads, 3u);
  EXPECT_EQ(small->ffn_dim, 1536u);
  EXPECT_EQ(small->context_length, 2048u);
  EXPECT_EQ(small->rope_freq_base, 100000.0f);
  EXPECT_EQ(small->rms_eps, 1e-5f);
  EXPECT_EQ(small->head_dim(), 64u);
  auto bad = preset_config("huge");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.status().message(), "unknown model preset 'huge' (presets: tiny, small)");
}

TEST(MakeModelTest, RefusesInconsistentConfigs) {
  auto c = *preset_config("tiny");
  const std::string path = test::temp_dir() + "/x.gguf";
  c.vocab_size = 100;
  Status st = make_model(c, 1, path);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("vocab_size 100 is too small for the byte-level vocabulary"), std::string::npos);
  c = *preset_config("tiny");
  c.n_kv_heads = 3;
  EXPECT_NE(make_model(c, 1, path).message().find("n_kv_heads 3 does not divide n_heads 4"), std::string::npos);
  c = *preset_config("tiny");
  EXPECT_EQ(make_model(c, 1, test::temp_dir() + "/no/such/dir/x.gguf").code(), Code::kModelFile);
}

TEST(MakeModelTest, SameSeedSameBytesOtherSeedOtherWeights) {
  auto c = *preset_config("tiny");
  const std::string dir = test::temp_dir();
  ASSERT_TRUE(make_model(c, 7, dir + "/a.gguf").is_ok());
  ASSERT_TRUE(make_model(c, 7, dir + "/b.gguf").is_ok());
  ASSERT_TRUE(make_model(c, 8, dir + "/c.gguf").is_ok());
  auto a = read_bytes(dir + "/a.gguf"), b = read_bytes(dir + "/b.gguf"), other = read_bytes(dir + "/c.gguf");
  ASSERT_GT(a.size(), 100000u);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), other.size());  // same layout ...
  EXPECT_NE(a, other);                // ... other weights
}

// The generator uses no libm transcendental and no std distribution, so these bytes
// are the same on every IEEE-754 machine. A change here changes every model file.
TEST(MakeModelTest, WeightsAreThePortableGoldenValues) {
  auto f = GgufFile::open(test::model_file("tiny", 1));
  ASSERT_TRUE(f);
  const GgufTensor* embd = (*f)->tensor("token_embd.weight");
  const GgufTensor* down = (*f)->tensor("blk.1.ffn_down.weight");
  EXPECT_EQ(fnv1a(embd->data, embd->nbytes), 0x01f574309c91949bull) << std::hex << fnv1a(embd->data, embd->nbytes);
  EXPECT_EQ(fnv1a(down->data, down->nbytes), 0xcaf402693bab0a2full) << std::hex << fnv1a(down->data, down->nbytes);
}

TEST(MakeModelTest, WritesLlamaCppMetadata) {
  auto f = GgufFile::open(test::model_file("tiny", 1));
  ASSERT_TRUE(f) << f.status().to_string();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
  EXPECT_EQ(g.get_string("general.name"), "tandem-tiny");
  EXPECT_EQ(g.get_uint("general.file_type"), 0u);
  EXPECT_EQ(g.get_uint("general.alignment"), 32u);
  EXPECT_EQ(g.find("general.alignment")->type, GgufValueType::kU32);
  EXPECT_EQ(g.get_uint("llama.context_length"), 512u);
  EXPECT_EQ(g.get_uint("llama.embedding_length"), 64u);
  EXPECT_EQ(g.get_uint("llama.block_count"), 2u);
  EXPECT_EQ(g.get_uint("llama.feed_forward_length"), 192u);
  EXPECT_EQ(g.get_uint("llama.attention.head_count"), 4u);
  EXPECT_EQ(g.get_uint("llama.attention.head_count_kv"), 2u);
  EXPECT_EQ(g.find("llama.rope.freq_base")->type, GgufValueType::kF32);
  EXPECT_EQ(g.get_float("llama.rope.freq_base"), 10000.0);
  EXPECT_EQ(g.get_float("llama.attention.layer_norm_rms_epsilon"), static_cast<double>(1e-5f));
  EXPECT_EQ(g.get_uint("llama.rope.dimension_count"), 16u);
  EXPECT_EQ(g.get_uint("llama.vocab_size"), 512u);
  EXPECT_EQ(g.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(g.get_string("tokenizer.ggml.pre"), "default");
  EXPECT_EQ(g.get_uint("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(g.get_uint("tokenizer.ggml.eos_token_id"), 2u);
  EXPECT_EQ(g.get_uint("tokenizer.ggml.unknown_token_id"), 0u);
  EXPECT_EQ(g.get_bool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(g.get_bool("tokenizer.ggml.add_eos_token"), false);

  const auto& tokens = std::get<std::vector<std::string>>(g.find("tokenizer.ggml.tokens")->value);
  const auto& types = std::get<std::vector<int64_t>>(g.find("tokenizer.ggml.token_type")->value);
  const auto& scores = std::get<std::vector<double>>(g.find("tokenizer.ggml.scores")->value);
  EXPECT_EQ(g.find("tokenizer.ggml.tokens")->array_type, GgufValueType::kString);
  EXPECT_EQ(g.find("tokenizer.ggml.token_type")->array_type, GgufValueType::kI32);
  EXPECT_EQ(g.find("tokenizer.ggml.scores")->array_type, GgufValueType::kF32);
  ASSERT_EQ(tokens.size(), 512u);
  ASSERT_EQ(types.size(), 512u);
  ASSERT_EQ(scores.size(), 512u);
  EXPECT_EQ(tokens[0], "<unk>");
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(tokens[2], "</s>");
  EXPECT_EQ(tokens[3], "<0x00>");
  EXPECT_EQ(tokens[3 + 0x0A], "<0x0A>");
  EXPECT_EQ(tokens[258], "<0xFF>");
  EXPECT_EQ(tokens[259], "<unused0>");
  EXPECT_EQ(tokens[511], "<unused252>");
  EXPECT_EQ(types[0], 2);
  EXPECT_EQ(types[1], 3);
  EXPECT_EQ(types[2], 3);
  EXPECT_EQ(types[3], 6);
  EXPECT_EQ(types[258], 6);
  EXPECT_EQ(types[259], 5);
  EXPECT_EQ(types[511], 5);

  auto cfg = read_model_config(g);
  ASSERT_TRUE(cfg) << cfg.status().to_string();
  auto tok = Tokenizer::from_gguf(g);
  ASSERT_TRUE(tok) << tok.status().to_string();
  EXPECT_TRUE(tok->can_encode());
}

TEST(MakeModelTest, TensorsInLlamaCppOrder) {
  auto f = GgufFile::open(test::model_file("tiny", 1));
  ASSERT_TRUE(f);
  std::vector<std::string> want = {"token_embd.weight"};
  for (uint32_t i = 0; i < 2; ++i) {
    for (const char* w :
         {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"}) {
      want.push_back(layer_tensor(i, w));
    }
  }
  want.push_back("output_norm.weight");
  want.push_back("output.weight");
  std::vector<std::string> got;
  for (const GgufTensor& t : (*f)->tensors()) {
    got.push_back(t.name);
    EXPECT_EQ(t.type, 0u) << t.name;
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
  }
  EXPECT_EQ(got, want);
}

struct Moments {
  double mean = 0, std = 0, within_1sd = 0, kurtosis = 0;
};

Moments moments(std::span<const float> x) {
  Moments m;
  double s = 0;
  for (float v : x) s += v;
  m.mean = s / static_cast<double>(x.size());
  double s2 = 0, s4 = 0;
  for (float v : x) {
    const double d = v - m.mean;
    s2 += d * d;
    s4 += d * d * d * d;
  }
  const double var = s2 / static_cast<double>(x.size());
  m.std = std::sqrt(var);
  m.kurtosis = s4 / static_cast<double>(x.size()) / (var * var);
  size_t inside = 0;
  for (float v : x) inside += std::fabs(v - m.mean) <= m.std;
  m.within_1sd = static_cast<double>(inside) / static_cast<double>(x.size());
  return m;
}

TEST(MakeModelTest, WeightStatistics) {
  // A config with bigger matrices than tiny, still fast to write.
  auto c = *preset_config("tiny");
  c.dim = 256;
  c.ffn_dim = 1024;
  c.vocab_size = 1024;
  c.n_layers = 1;
  const std::string path = test::temp_dir() + "/stats.gguf";
  ASSERT_TRUE(make_model(c, 3, path).is_ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f);
  struct Want {
    const char* name;
    double std;
  };
  for (Want w :
       {Want{"token_embd.weight", 1.0}, Want{"blk.0.attn_q.weight", 1 / 16.0}, Want{"blk.0.attn_k.weight", 1 / 16.0},
        Want{"blk.0.ffn_gate.weight", 1 / 16.0}, Want{"blk.0.ffn_up.weight", 1 / 16.0},
        Want{"blk.0.ffn_down.weight", 1 / 32.0}, Want{"output.weight", 1 / 16.0}}) {
    const GgufTensor* t = (*f)->tensor(w.name);
    ASSERT_NE(t, nullptr) << w.name;
    Moments m = moments(floats(*t));
    EXPECT_NEAR(m.std / w.std, 1.0, 0.03) << w.name;
    EXPECT_NEAR(m.mean / w.std, 0.0, 0.03) << w.name;
    EXPECT_NEAR(m.within_1sd, 0.6827, 0.01) << w.name;  // normal, not uniform
    EXPECT_NEAR(m.kurtosis, 3.0, 0.15) << w.name;
  }
  // Big matrices look like independent draws: rows are not correlated with each other.
  const GgufTensor* up = (*f)->tensor("blk.0.ffn_up.weight");
  auto x = floats(*up);
  double dot = 0;
  for (size_t i = 0; i + 256 < x.size(); ++i) dot += static_cast<double>(x[i]) * x[i + 256];
  EXPECT_NEAR(dot / static_cast<double>(x.size()) * 256.0, 0.0, 0.02);
  for (const GgufTensor& t : (*f)->tensors()) {
    if (t.name.find("norm") == std::string::npos) continue;
    for (float v : floats(t)) ASSERT_EQ(v, 1.0f) << t.name;
  }
}

TEST(MakeModelTest, TiedEmbeddingsOmitOutputWeight) {
  auto c = *preset_config("tiny");
  c.tied_embeddings = true;
  const std::string path = test::temp_dir() + "/tied.gguf";
  ASSERT_TRUE(make_model(c, 1, path).is_ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f);
  EXPECT_EQ((*f)->tensor("output.weight"), nullptr);
  auto cfg = read_model_config(**f);
  ASSERT_TRUE(cfg);
  EXPECT_TRUE(cfg->tied_embeddings);
}

// Each architecture's file reads back as what was asked: its row, the tensors it writes
// (Qwen2's biases, Qwen3's Q/K norms and longer head), and nothing of another row.
TEST(MakeModelTest, EveryArchitectureReadsBack) {
  const std::string dir = test::temp_dir();
  for (const char* name : {"llama", "qwen2", "qwen3"}) {
    auto c = *preset_config("tiny");
    c.arch = find_architecture(name);
    if (c.arch->norm == NormVariant::kRmsQkNorm) c.key_length = 32;
    const std::string path = dir + "/" + name + ".gguf";
    ASSERT_TRUE(make_model(c, 1, path).is_ok()) << name;
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f);
    auto cfg = read_model_config(**f);
    ASSERT_TRUE(cfg) << cfg.status().to_string();
    EXPECT_EQ(cfg->arch, c.arch);
    EXPECT_EQ(cfg->head_dim(), c.head_dim());
    const bool qwen2 = std::string(name) == "qwen2", qwen3 = std::string(name) == "qwen3";
    EXPECT_EQ((*f)->tensor("blk.1.attn_v.bias") != nullptr, qwen2) << name;
    EXPECT_EQ((*f)->tensor("blk.1.attn_k_norm.weight") != nullptr, qwen3) << name;
    EXPECT_EQ((*f)->find(std::string(name) + ".attention.key_length") != nullptr, qwen3) << name;
    if (qwen3) {
      EXPECT_EQ((*f)->tensor("blk.0.attn_q.weight")->dims, (std::vector<uint64_t>{64, 128}));
      EXPECT_EQ((*f)->get_uint("qwen3.attention.value_length"), 32u);
      EXPECT_EQ((*f)->get_uint("qwen3.rope.dimension_count"), 32u);
    }
  }
}

TEST(MakeModelTest, RopeScalingKeysAndLlama3Factors) {
  const std::string dir = test::temp_dir();
  auto c = *preset_config("tiny");
  c.rope_scaling = RopeScaling::kYarn;
  c.rope_scaling_factor = 4.0f;
  c.rope_original_context = 128;
  ASSERT_TRUE(make_model(c, 1, dir + "/yarn.gguf").is_ok());
  auto f = GgufFile::open(dir + "/yarn.gguf");
  ASSERT_TRUE(f);
  EXPECT_EQ((*f)->get_string("llama.rope.scaling.type"), "yarn");
  EXPECT_EQ((*f)->get_float("llama.rope.scaling.factor"), 4.0);
  EXPECT_EQ((*f)->get_uint("llama.rope.scaling.original_context_length"), 128u);
  EXPECT_EQ((*f)->find("llama.rope.scaling.attn_factor"), nullptr);  // 1: left out

  // Llama 3.1's factors for a 128-wide head, base 500000: 1 for the fast pairs, 8 for the
  // slow ones, the blend between (the convert script's values).
  const auto f128 = llama3_rope_factors(Llama3Rope{}, 128, 500000.0);
  ASSERT_EQ(f128.size(), 64u);
  EXPECT_EQ(f128[0], 1.0f);
  EXPECT_EQ(f128[63], 8.0f);
  EXPECT_GT(f128[30], 1.0f);
  EXPECT_LT(f128[30], 8.0f);
  c = *preset_config("tiny");
  ASSERT_TRUE(make_model(c, 1, dir + "/l3.gguf", TensorType::kF32, Llama3Rope{}).is_ok());
  f = GgufFile::open(dir + "/l3.gguf");
  ASSERT_TRUE(f);
  const GgufTensor* freqs = (*f)->tensor("rope_freqs.weight");
  ASSERT_NE(freqs, nullptr);
  EXPECT_EQ(freqs->dims, (std::vector<uint64_t>{8}));
  auto cfg = read_model_config(**f);
  ASSERT_TRUE(cfg);
  EXPECT_TRUE(cfg->rope_freqs);
  c.arch = find_architecture("qwen2");  // llama.cpp reads rope_freqs for llama only
  EXPECT_NE(make_model(c, 1, dir + "/q.gguf", TensorType::kF32, Llama3Rope{}).message().find("no rope_freqs"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::model

namespace tandem::model {
namespace {

// The scripted fixture: spelled with distinct tokens only, never with an avoided one; its
// weights are the bigram chain make_model.h describes.
TEST(MakeModelTest, ScriptedModelSpellsWithDistinctTokensAndChainsThem) {
  auto file = GgufFile::open(test::model_file("tiny", 1)).value();
  const Tokenizer tok = Tokenizer::from_gguf(*file).value();
  const int32_t a = 'a' + 3, b = 'b' + 3, c = 'c' + 3;  // the byte-level vocabulary: byte + 3
  EXPECT_EQ(spell_without_repeats(tok, "abc", {}).value(), (std::vector<int32_t>{a, b, c}));
  const Status repeated = spell_without_repeats(tok, "abca", {}).status();
  EXPECT_NE(repeated.message().find("no spelling of the text with distinct tokens"), std::string::npos)
      << repeated.message();
  EXPECT_FALSE(spell_without_repeats(tok, "abc", {b}).is_ok());
  EXPECT_FALSE(spell_without_repeats(tok, "", {}).is_ok());

  const VocabularyKeys vocab = read_vocabulary({test::model_file("tiny", 1), "", ""}).value();
  ModelConfig config = preset_config("tiny").value();
  config.n_layers = 1;
  const std::string path = test::temp_dir() + "/scripted.gguf";
  EXPECT_FALSE(make_scripted_model(config, {a, b, a, 2}, path, vocab).is_ok());  // a twice
  ASSERT_TRUE(make_scripted_model(config, {a, b, c, 2}, path, vocab).is_ok());
  auto scripted = GgufFile::open(path).value();
  const ModelConfig read = read_model_config(*scripted).value();
  ASSERT_EQ(read.dim, 64u);
  auto at = [&](const char* name, int32_t row, uint32_t col) {
    const GgufTensor* t = scripted->tensor(name);
    return half_to_float(reinterpret_cast<const uint16_t*>(t->data)[static_cast<size_t>(row) * read.dim + col]);
  };
  EXPECT_EQ(at("token_embd.weight", a, 1), 1.0f);  // chain token i: dimension i + 1
  EXPECT_EQ(at("token_embd.weight", c, 3), 1.0f);
  EXPECT_EQ(at("token_embd.weight", 'z' + 3, 0), 1.0f);  // any other token: dimension 0
  EXPECT_EQ(at("output.weight", a, 0), 16.0f);           // after any other token: the first
  EXPECT_EQ(at("output.weight", b, 1), 16.0f);           // after a: b
  EXPECT_EQ(at("output.weight", 2, 3), 16.0f);           // after c: the end token
  EXPECT_EQ(at("output.weight", b, 0), 0.0f);
  EXPECT_EQ(at("blk.0.attn_output.weight", 0, 0), 0.0f);
}

}  // namespace
}  // namespace tandem::model
