#include "model/model_config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <functional>
#include <variant>

#include "tests/test_util.h"
#include "model/gguf.h"
#include "model/make_model.h"

namespace tandem::model {
namespace {

// A llama file spec that tests edit before writing: dim 64, 4 heads, 2 KV heads
// (kv_dim 32), FFN 96, vocab 300, 2 layers. Tensor data is zeros.
struct Spec {
  using Value = std::variant<uint32_t, float, std::string>;
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type = 0;  // ggml type id (F32)
  };
  std::vector<std::pair<std::string, Value>> kvs = {
      {"general.architecture", std::string("llama")},
      {"general.name", std::string("spec")},
      {"llama.context_length", 256u},
      {"llama.embedding_length", 64u},
      {"llama.block_count", 2u},
      {"llama.feed_forward_length", 96u},
      {"llama.attention.head_count", 4u},
      {"llama.attention.head_count_kv", 2u},
      {"llama.rope.freq_base", 50000.0f},
      {"llama.attention.layer_norm_rms_epsilon", 1e-6f},
      {"llama.rope.dimension_count", 16u},
  };
  std::vector<Tensor> tensors;

  Spec() {
    tensors.push_back({"token_embd.weight", {64, 300}});
    for (uint32_t i = 0; i < 2; ++i) {
      tensors.push_back({layer_tensor(i, "attn_norm"), {64}});
      tensors.push_back({layer_tensor(i, "attn_q"), {64, 64}});
      tensors.push_back({layer_tensor(i, "attn_k"), {64, 32}});
      tensors.push_back({layer_tensor(i, "attn_v"), {64, 32}});
      tensors.push_back({layer_tensor(i, "attn_output"), {64, 64}});
      tensors.push_back({layer_tensor(i, "ffn_norm"), {64}});
      tensors.push_back({layer_tensor(i, "ffn_gate"), {64, 96}});
      tensors.push_back({layer_tensor(i, "ffn_up"), {64, 96}});
      tensors.push_back({layer_tensor(i, "ffn_down"), {96, 64}});
    }
    tensors.push_back({"output_norm.weight", {64}});
    tensors.push_back({"output.weight", {64, 300}});
  }

  void set(const std::string& key, Value v) {
    for (auto& kv : kvs) {
      if (kv.first == key) {
        kv.second = std::move(v);
        return;
      }
    }
    kvs.emplace_back(key, std::move(v));
  }
  void erase(const std::string& key) {
    std::erase_if(kvs, [&](const auto& kv) { return kv.first == key; });
  }
  Tensor& tensor(const std::string& name) {
    auto it = std::find_if(tensors.begin(), tensors.end(), [&](const Tensor& t) { return t.name == name; });
    EXPECT_NE(it, tensors.end()) << name;
    return *it;
  }
  void erase_tensor(const std::string& name) {
    std::erase_if(tensors, [&](const Tensor& t) { return t.name == name; });
  }

  std::string write() const {
    GgufWriter w;
    for (const auto& [key, v] : kvs) {
      if (auto* u = std::get_if<uint32_t>(&v)) {
        w.add_u32(key, *u);
      } else if (auto* f = std::get_if<float>(&v)) {
        w.add_f32(key, *f);
      } else {
        w.add_string(key, std::get<std::string>(v));
      }
    }
    for (const Tensor& t : tensors) {
      uint64_t n = 1;
      for (uint64_t d : t.dims) n *= d;
      const auto type = static_cast<TensorType>(t.type);
      const uint64_t nbytes = row_bytes(type, n);
      std::vector<char> zeros(nbytes);
      w.add_tensor(t.name, t.dims, type, zeros.data(), nbytes);
    }
    std::string path = test::temp_dir() + "/spec.gguf";
    Status st = w.write(path);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return path;
  }
};

Result<ModelConfig> load(const std::string& path, std::unique_ptr<GgufFile>& keep) {
  auto f = GgufFile::open(path);
  if (!f) return f.status();
  keep = std::move(*f);
  return read_model_config(*keep);
}

std::string error_of(const Spec& spec) {
  std::string path = spec.write();
  std::unique_ptr<GgufFile> file;
  auto cfg = load(path, file);
  if (cfg) return "";
  EXPECT_EQ(cfg.status().code(), Code::kModelFile);
  EXPECT_EQ(cfg.status().message().rfind(path + ": ", 0), 0u) << cfg.status().message();
  return cfg.status().message();
}

#define EXPECT_ERROR(spec, text)                                                \
  do {                                                                          \
    std::string _err = error_of(spec);                                          \
    EXPECT_NE(_err.find(text), std::string::npos) << "error: '" << _err << "'"; \
  } while (0)

TEST(ModelConfigTest, ReadsTheSpec) {
  Spec spec;
  std::unique_ptr<GgufFile> file;
  auto cfg = load(spec.write(), file);
  ASSERT_TRUE(cfg) << cfg.status().to_string();
  EXPECT_EQ(cfg->name, "spec");
  EXPECT_EQ(cfg->vocab_size, 300u);
  EXPECT_EQ(cfg->dim, 64u);
  EXPECT_EQ(cfg->n_layers, 2u);
  EXPECT_EQ(cfg->n_heads, 4u);
  EXPECT_EQ(cfg->n_kv_heads, 2u);
  EXPECT_EQ(cfg->ffn_dim, 96u);
  EXPECT_EQ(cfg->context_length, 256u);
  EXPECT_EQ(cfg->rope_freq_base, 50000.0f);
  EXPECT_EQ(cfg->rms_eps, 1e-6f);
  EXPECT_FALSE(cfg->tied_embeddings);
  EXPECT_EQ(cfg->head_dim(), 16u);
  EXPECT_EQ(cfg->kv_dim(), 32u);
}

TEST(ModelConfigTest, ReadsTheTinyPreset) {
  std::unique_ptr<GgufFile> file;
  auto cfg = load(test::model_file("tiny", 1), file);
  ASSERT_TRUE(cfg) << cfg.status().to_string();
  EXPECT_EQ(cfg->name, "tandem-tiny");
  EXPECT_EQ(cfg->vocab_size, 512u);
  EXPECT_EQ(cfg->dim, 64u);
  EXPECT_EQ(cfg->n_kv_heads, 2u);
  EXPECT_EQ(cfg->ffn_dim, 192u);
  EXPECT_FALSE(cfg->tied_embeddings);
}

TEST(ModelConfigTest, OptionalKeysHaveDefaults) {
  Spec spec;
  spec.erase("llama.attention.head_count_kv");
  spec.erase("llama.rope.freq_base");
  spec.erase("llama.attention.layer_norm_rms_epsilon");
  spec.erase("llama.rope.dimension_count");
  spec.erase("general.name");
  for (auto& t : spec.tensors) {
    if (t.name.find("attn_k") != std::string::npos || t.name.find("attn_v") != std::string::npos) t.dims = {64, 64};
  }
  std::string path = spec.write();
  std::unique_ptr<GgufFile> file;
  auto cfg = load(path, file);
  ASSERT_TRUE(cfg) << cfg.status().to_string();
  EXPECT_EQ(cfg->n_kv_heads, 4u);
  EXPECT_EQ(cfg->rope_freq_base, 10000.0f);
  EXPECT_EQ(cfg->rms_eps, 1e-5f);
  EXPECT_EQ(cfg->name, "spec.gguf");
}

TEST(ModelConfigTest, NoOutputWeightMeansTiedEmbeddings) {
  Spec spec;
  spec.erase_tensor("output.weight");
  std::unique_ptr<GgufFile> file;
  auto cfg = load(spec.write(), file);
  ASSERT_TRUE(cfg) << cfg.status().to_string();
  EXPECT_TRUE(cfg->tied_embeddings);
}

TEST(ModelConfigTest, AcceptsF16EverywhereIncludingNorms) {
  Spec spec;
  for (auto& t : spec.tensors) t.type = 1;
  std::unique_ptr<GgufFile> file;
  auto cfg = load(spec.write(), file);
  ASSERT_TRUE(cfg) << cfg.status().to_string();
}

TEST(ModelConfigTest, UnsupportedArchitecture) {
  Spec spec;
  spec.set("general.architecture", std::string("gpt2"));
  EXPECT_ERROR(spec,
               "unsupported architecture 'gpt2' (tandem runs 'llama', 'qwen2', 'qwen3', 'qwen35', 'gemma2', 'gemma3')");
  spec.erase("general.architecture");
  EXPECT_ERROR(spec, "missing key general.architecture");
}

TEST(ModelConfigTest, MissingRequiredKeys) {
  for (const char* key : {"llama.context_length", "llama.embedding_length", "llama.block_count",
                          "llama.feed_forward_length", "llama.attention.head_count"}) {
    Spec spec;
    spec.erase(key);
    EXPECT_ERROR(spec, std::string("missing key ") + key);
  }
}

TEST(ModelConfigTest, KeysOfTheWrongKindOrOutOfRange) {
  Spec spec;
  spec.set("llama.block_count", std::string("two"));
  EXPECT_ERROR(spec, "key llama.block_count is not a non-negative integer");
  spec = Spec();
  spec.set("llama.block_count", 0u);
  EXPECT_ERROR(spec, "llama.block_count 0 is out of range (1 to 1048575)");
  spec = Spec();
  spec.set("llama.embedding_length", 1u << 20);
  EXPECT_ERROR(spec, "llama.embedding_length 1048576 is out of range");
  spec = Spec();
  spec.set("llama.rope.freq_base", -1.0f);
  EXPECT_ERROR(spec, "llama.rope.freq_base");
  spec = Spec();
  spec.set("llama.attention.layer_norm_rms_epsilon", 2u);
  EXPECT_ERROR(spec, "key llama.attention.layer_norm_rms_epsilon is not a float");
}

TEST(ModelConfigTest, HeadArithmetic) {
  Spec spec;
  spec.set("llama.attention.head_count", 5u);
  EXPECT_ERROR(spec, "head_count 5 does not divide embedding_length 64");
  spec = Spec();
  spec.set("llama.attention.head_count_kv", 3u);
  EXPECT_ERROR(spec, "head_count_kv 3 does not divide head_count 4");
  spec = Spec();
  spec.set("llama.attention.head_count", 64u);  // head_dim 1
  spec.set("llama.attention.head_count_kv", 64u);
  EXPECT_ERROR(spec, "head_dim 1 (embedding_length 64 / head_count 64) is odd");
  spec = Spec();
  spec.set("llama.rope.dimension_count", 8u);
  EXPECT_ERROR(spec, "llama.rope.dimension_count 8 differs from head_dim 16 (tandem applies rope to the whole head)");
}

TEST(ModelConfigTest, BadShape) {
  Spec spec;
  spec.tensor("blk.1.attn_k.weight").dims = {64, 48};
  EXPECT_ERROR(spec, "tensor blk.1.attn_k.weight has shape [64, 48], expected [64, 32]");
  spec = Spec();
  spec.tensor("blk.0.ffn_down.weight").dims = {64, 96};  // transposed
  EXPECT_ERROR(spec, "tensor blk.0.ffn_down.weight has shape [64, 96], expected [96, 64]");
  spec = Spec();
  spec.tensor("output_norm.weight").dims = {64, 1};
  EXPECT_ERROR(spec, "tensor output_norm.weight has shape [64, 1], expected [64]");
  spec = Spec();
  spec.tensor("output.weight").dims = {64, 301};
  EXPECT_ERROR(spec, "tensor output.weight has shape [64, 301], expected [64, 300]");
  spec = Spec();
  spec.tensor("token_embd.weight").dims = {32, 300};
  EXPECT_ERROR(spec, "tensor token_embd.weight has shape [32, 300], expected [64, vocab_size]");
}

TEST(ModelConfigTest, MissingTensor) {
  Spec spec;
  spec.erase_tensor("blk.1.ffn_gate.weight");
  EXPECT_ERROR(spec, "missing tensor blk.1.ffn_gate.weight");
  spec = Spec();
  spec.erase_tensor("token_embd.weight");
  EXPECT_ERROR(spec, "missing tensor token_embd.weight");
}

// A tensor of a type the engine does not compute (F64, ggml id 28): refused, naming it and
// listing what the engine loads.
TEST(ModelConfigTest, UnsupportedTensorType) {
  Spec spec;
  spec.tensor("blk.0.ffn_up.weight").type = 28;
  std::unique_ptr<GgufFile> file;
  auto cfg = load(spec.write(), file);
  ASSERT_FALSE(cfg);
  EXPECT_NE(cfg.status().message().find("tensor blk.0.ffn_up.weight has unsupported type F64 (tandem loads F32, F16, "
                                        "BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)"),
            std::string::npos)
      << cfg.status().message();
}

// The types the engine computes on load (rows of whole blocks: 64 = 2 blocks of 32). A row
// that is not whole blocks never gets this far: GgufFile::open refuses it.
TEST(ModelConfigTest, QuantizedTypesLoad) {
  for (TensorType type : {TensorType::kQ8_0, TensorType::kQ4_0, TensorType::kQ5_1, TensorType::kBF16}) {
    Spec spec;
    spec.tensor("blk.0.ffn_up.weight").type = static_cast<uint32_t>(type);
    std::unique_ptr<GgufFile> file;
    auto cfg = load(spec.write(), file);
    EXPECT_TRUE(cfg) << cfg.status().message();
  }
}

TEST(ModelConfigTest, LayerTensorNames) {
  EXPECT_EQ(layer_tensor(3, "attn_k"), "blk.3.attn_k.weight");
  EXPECT_EQ(layer_tensor(0, "ffn_down"), "blk.0.ffn_down.weight");
  EXPECT_EQ(layer_tensor(2, LayerTensor::kAttnOutput), "blk.2.attn_output.weight");
  EXPECT_EQ(layer_tensor(0, LayerTensor::kFfnGate), "blk.0.ffn_gate.weight");
}

// The table's llama row is what the spec above writes: its keys under "llama.", its nine
// block tensors in llama.cpp's order, adjacent-pair RoPE and plain RMSNorm.
TEST(ArchitectureTable, LlamaRow) {
  const Architecture* llama = find_architecture("llama");
  ASSERT_NE(llama, nullptr);
  EXPECT_EQ(llama, default_architecture());
  EXPECT_EQ(find_architecture("gpt2"), nullptr);
  EXPECT_EQ(architecture_names(), "'llama', 'qwen2', 'qwen3', 'qwen35', 'gemma2', 'gemma3'");
  EXPECT_EQ(llama->key("block_count"), "llama.block_count");
  EXPECT_EQ(llama->rope, RopeType::kNormal);
  EXPECT_EQ(llama->norm, NormVariant::kRms);
  std::vector<std::string> names;
  for (const TensorSpec& t : llama->layer_tensors)
    if (t.presence == Presence::kRequired) names.push_back(layer_tensor(0, t.role));
  Spec spec;
  std::vector<std::string> written;
  for (const Spec::Tensor& t : spec.tensors)
    if (t.name.starts_with("blk.0.")) written.push_back(t.name);
  EXPECT_EQ(names, written);
  ASSERT_NE(llama->find(LayerTensor::kFfnDown), nullptr);
  EXPECT_EQ(llama->find(LayerTensor::kFfnDown)->in, Dim::kFfn);
}

// The config read from a file knows its row, and the fingerprint covers it.
TEST(ArchitectureTable, ConfigCarriesItsRow) {
  const std::string path = Spec().write();
  std::unique_ptr<GgufFile> file;
  auto cfg = load(path, file);
  ASSERT_TRUE(cfg) << cfg.status().message();
  EXPECT_EQ(cfg->arch, find_architecture("llama"));
  EXPECT_EQ(dim_size(Dim::kKv, *cfg), 32u);
  EXPECT_EQ(dim_size(Dim::kQ, *cfg), 64u);
}

// The spec as another architecture of the same shape: its keys under `arch.`.
Spec as_architecture(const std::string& arch) {
  Spec spec;
  for (auto& [key, v] : spec.kvs)
    if (key.starts_with("llama.")) key = arch + key.substr(5);
  spec.set("general.architecture", arch);
  return spec;
}

TEST(ArchitectureTable, Qwen2BiasesAreOptionalAndChecked) {
  Spec spec = as_architecture("qwen2");
  std::unique_ptr<GgufFile> file;
  auto cfg = load(spec.write(), file);  // llama.cpp loads Qwen2 without biases too
  ASSERT_TRUE(cfg) << cfg.status().to_string();
  EXPECT_EQ(cfg->arch->rope, RopeType::kNeox);
  spec.tensors.push_back({"blk.0.attn_q.bias", {64}});
  spec.tensors.push_back({"blk.0.attn_k.bias", {32}});
  spec.tensors.push_back({"blk.0.attn_v.bias", {32}});
  cfg = load(spec.write(), file);
  ASSERT_TRUE(cfg) << cfg.status().to_string();
  spec.tensor("blk.0.attn_k.bias").dims = {64};
  EXPECT_ERROR(spec, "tensor blk.0.attn_k.bias has shape [64], expected [32]");
  EXPECT_EQ(layer_tensor(1, LayerTensor::kAttnVBias), "blk.1.attn_v.bias");
  spec = as_architecture("qwen2");  // a bias llama.cpp would add and tandem does not compute
  spec.tensors.push_back({"output.bias", {300}});
  EXPECT_ERROR(spec, "tensor output.bias is not supported (tandem adds no such bias)");
  spec = Spec();
  spec.tensors.push_back({"blk.1.attn_output.bias", {64}});
  EXPECT_ERROR(spec, "tensor blk.1.attn_output.bias is not supported");
}

// Qwen3: attention.key_length sets head_dim (here 32, not 64 / 4), and the Q/K norms are required.
Spec qwen3_spec() {
  Spec spec = as_architecture("qwen3");
  spec.set("qwen3.attention.key_length", 32u);
  spec.set("qwen3.attention.value_length", 32u);
  spec.set("qwen3.rope.dimension_count", 32u);
  for (uint32_t i = 0; i < 2; ++i) {
    spec.tensor(layer_tensor(i, "attn_q")).dims = {64, 128};
    spec.tensor(layer_tensor(i, "attn_k")).dims = {64, 64};
    spec.tensor(layer_tensor(i, "attn_v")).dims = {64, 64};
    spec.tensor(layer_tensor(i, "attn_output")).dims = {128, 64};
    spec.tensors.push_back({layer_tensor(i, "attn_q_norm"), {32}});
    spec.tensors.push_back({layer_tensor(i, "attn_k_norm"), {32}});
  }
  return spec;
}

TEST(ArchitectureTable, Qwen3HeadDimFromKeyLength) {
  Spec spec = qwen3_spec();
  std::unique_ptr<GgufFile> file;
  auto cfg = load(spec.write(), file);
  ASSERT_TRUE(cfg) << cfg.status().to_string();
  EXPECT_EQ(cfg->head_dim(), 32u);
  EXPECT_EQ(cfg->q_dim(), 128u);
  EXPECT_EQ(cfg->kv_dim(), 64u);
  EXPECT_EQ(cfg->arch->norm, NormVariant::kRmsQkNorm);
  spec.set("qwen3.attention.value_length", 16u);
  EXPECT_ERROR(spec, "qwen3.attention.value_length 16 differs from head_dim 32");
  spec = qwen3_spec();
  spec.erase_tensor("blk.1.attn_k_norm.weight");
  EXPECT_ERROR(spec, "missing tensor blk.1.attn_k_norm.weight");
  spec = qwen3_spec();
  spec.erase("qwen3.attention.key_length");  // head_dim 16: the matrices no longer fit
  spec.erase("qwen3.attention.value_length");
  spec.erase("qwen3.rope.dimension_count");
  EXPECT_ERROR(spec, "tensor blk.0.attn_q.weight has shape [64, 128], expected [64, 64]");
}

TEST(ArchitectureTable, MissingKeyOfAnotherArchitectureNamesIt) {
  Spec spec = qwen3_spec();
  spec.erase("qwen3.block_count");
  EXPECT_ERROR(spec, "missing key qwen3.block_count");
  spec = as_architecture("qwen2");
  spec.set("llama.block_count", 2u);  // another architecture's key does not count
  spec.erase("qwen2.block_count");
  EXPECT_ERROR(spec, "missing key qwen2.block_count");
}

TEST(RopeScaling, KeysAsLlamaCppReadsThem) {
  std::unique_ptr<GgufFile> file;
  auto read = [&](const Spec& spec) {
    auto cfg = load(spec.write(), file);
    EXPECT_TRUE(cfg) << cfg.status().to_string();
    return cfg ? *cfg : ModelConfig{};
  };
  Spec spec;
  EXPECT_EQ(read(spec).rope_scaling, RopeScaling::kNone);
  spec.set("llama.rope.scaling.factor", 4.0f);  // the type defaults to linear
  EXPECT_EQ(read(spec).rope_scaling, RopeScaling::kLinear);
  EXPECT_EQ(read(spec).rope_scaling_factor, 4.0f);
  spec.set("llama.rope.scaling.type", std::string("none"));  // never scales
  EXPECT_EQ(read(spec).rope_scaling, RopeScaling::kNone);
  EXPECT_EQ(read(spec).rope_scaling_factor, 1.0f);
  spec.set("llama.rope.scaling.type", std::string("yarn"));
  spec.set("llama.rope.scaling.original_context_length", 64u);
  spec.set("llama.rope.scaling.attn_factor", 0.5f);
  ModelConfig c = read(spec);
  EXPECT_EQ(c.rope_scaling, RopeScaling::kYarn);
  EXPECT_EQ(c.yarn_original_context(), 64u);
  EXPECT_EQ(c.rope_attn_factor, 0.5f);
  spec = Spec();
  spec.set("llama.rope.scale_linear", 2.0f);  // the older key
  EXPECT_EQ(read(spec).rope_scaling_factor, 2.0f);
  spec.set("llama.rope.scaling.type", std::string("longrope"));
  EXPECT_ERROR(spec, "llama.rope.scaling.type 'longrope' is not supported (tandem applies none, linear, yarn)");
}

TEST(RopeScaling, RopeFreqsOnlyForLlama) {
  Spec spec;
  spec.tensors.push_back({"rope_freqs.weight", {8}});
  std::unique_ptr<GgufFile> file;
  auto cfg = load(spec.write(), file);
  ASSERT_TRUE(cfg) << cfg.status().to_string();
  EXPECT_TRUE(cfg->rope_freqs);
  spec.tensor("rope_freqs.weight").dims = {16};
  EXPECT_ERROR(spec, "tensor rope_freqs.weight has shape [16], expected [8]");
  spec.tensor("rope_freqs.weight").dims = {8};
  spec.tensor("rope_freqs.weight").type = 1;
  EXPECT_ERROR(spec, "tensor rope_freqs.weight must be F32");
  spec = as_architecture("qwen2");  // llama.cpp ignores it there
  spec.tensors.push_back({"rope_freqs.weight", {8}});
  cfg = load(spec.write(), file);
  ASSERT_TRUE(cfg) << cfg.status().to_string();
  EXPECT_FALSE(cfg->rope_freqs);
}

}  // namespace
}  // namespace tandem::model

namespace tandem::model {
namespace {

// make-model's tiny file of `arch` (qwen35 unless named), rewritten with `edit` applied to its
// keys (returning false drops the key; `added` keys are appended) and without tensor `drop`.
struct Qwen35File {
  std::string dir = test::temp_dir();
  std::string path() const { return dir + "/q35.gguf"; }
  explicit Qwen35File(std::string_view arch = "qwen35") {
    auto c = preset_config("tiny", arch);
    EXPECT_TRUE(c) << c.status().to_string();
    EXPECT_TRUE(make_model(*c, 1, path()).is_ok());
  }
  Result<ModelConfig> read_edited(const std::function<bool(const std::string&, GgufValue&)>& edit,
                                  const std::string& drop = "",
                                  const std::vector<std::pair<std::string, GgufValue>>& added = {}) const {
    auto in = GgufFile::open(path());
    EXPECT_TRUE(in);
    GgufWriter w;
    for (const std::string& key : (*in)->keys_in_file_order()) {
      GgufValue v = *(*in)->find(key);
      if (edit(key, v)) w.add_value(key, v);
    }
    for (const auto& [key, v] : added) w.add_value(key, v);
    for (const GgufTensor& t : (*in)->tensors())
      if (t.name != drop) w.add_tensor(t.name, t.dims, static_cast<TensorType>(t.type), t.data, t.nbytes);
    const std::string out = dir + "/edited.gguf";
    EXPECT_TRUE(w.write(out).is_ok());
    auto file = GgufFile::open(out);
    if (!file) return file.status();
    return read_model_config(**file);
  }
  static GgufValue ints(GgufValueType type, std::vector<int64_t> v) {
    GgufValue g;
    g.type = GgufValueType::kArray;
    g.array_type = type;
    g.value = std::move(v);
    return g;
  }
};

void expect_refused(const Result<ModelConfig>& r, const std::string& fragment) {
  ASSERT_FALSE(r) << "accepted, expected: " << fragment;
  EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status().message();
}

TEST(Qwen35Config, ReadsMakeModelsTinyFile) {
  Qwen35File f;
  auto c = f.read_edited([](const std::string&, GgufValue&) { return true; });
  ASSERT_TRUE(c) << c.status().to_string();
  EXPECT_EQ(c->arch->name, "qwen35");
  EXPECT_EQ(c->recurrent, (std::vector<bool>{true, true, true, false}));  // (i + 1) % 4 != 0
  EXPECT_EQ(c->attention_layers(), 1u);
  EXPECT_EQ(c->head_dim(), 32u);
  EXPECT_EQ(c->rope_dim(), 8u);
  EXPECT_EQ(c->conv_channels(), 128u);
  EXPECT_EQ(c->ssm_time_step_rank, 4u);
  EXPECT_EQ(c->ssm_group_count, 2u);
  EXPECT_EQ(layer_tensor(0, LayerTensor::kSsmA), "blk.0.ssm_a");
  EXPECT_EQ(layer_tensor(0, LayerTensor::kSsmDt), "blk.0.ssm_dt.bias");
}

TEST(Qwen35Config, MissingOrInconsistentKeysAndTensorsAreNamed) {
  Qwen35File f;
  auto without = [&](const std::string& gone) {
    return f.read_edited([&](const std::string& key, GgufValue&) { return key != gone; });
  };
  expect_refused(without("qwen35.ssm.state_size"), "missing key qwen35.ssm.state_size");
  expect_refused(without("qwen35.rope.dimension_sections"), "missing key qwen35.rope.dimension_sections");
  expect_refused(f.read_edited([](const std::string& key, GgufValue& v) {
    if (key == "qwen35.ssm.inner_size") v.value = uint64_t{60};
    return true;
  }),
                 "qwen35.ssm.inner_size 60 is not time_step_rank 4 x state_size 16");
  expect_refused(f.read_edited([](const std::string& key, GgufValue& v) {
    if (key == "qwen35.rope.dimension_sections") v = Qwen35File::ints(GgufValueType::kI32, {1, 1, 1, 1});
    return true;
  }),
                 "falls outside the text sections");
  expect_refused(f.read_edited([](const std::string&, GgufValue&) { return true; }, "blk.1.ssm_a"),
                 "missing tensor blk.1.ssm_a");
  expect_refused(f.read_edited([](const std::string&, GgufValue&) { return true; }, "blk.3.attn_q_norm.weight"),
                 "missing tensor blk.3.attn_q_norm.weight");
}

TEST(Qwen35Config, AnExplicitLayerPatternWinsOverTheInterval) {
  Qwen35File f;
  auto keep = [](const std::string&, GgufValue&) { return true; };
  // Layer 0 made full attention: its attention tensors are now required (and absent).
  expect_refused(
      f.read_edited(keep, "",
                    {{"qwen35.attention.recurrent_layers", Qwen35File::ints(GgufValueType::kBool, {0, 1, 1, 0})}}),
      "missing tensor blk.0.attn_q.weight");
  auto same = f.read_edited(
      keep, "", {{"qwen35.attention.recurrent_layers", Qwen35File::ints(GgufValueType::kBool, {1, 1, 1, 0})}});
  ASSERT_TRUE(same) << same.status().to_string();
  expect_refused(
      f.read_edited(keep, "", {{"qwen35.attention.recurrent_layers", Qwen35File::ints(GgufValueType::kBool, {1, 1})}}),
      "has 2 entries for 4 blocks");
}

// Gemma's 27B models scale queries by 1 / sqrt(dim / heads), as llama.cpp picks them by layer
// count (gemma2: 46 layers, gemma3: 62); every other Gemma, and other architectures, by
// 1 / sqrt(head_dim) (0: the default). Gemma 2 27B: dim 4608, 32 heads of 128 -> 1 / sqrt(144);
// Gemma 2 9B: 42 layers, dim 3584, 16 heads of 256 -> 1 / sqrt(256), not 1 / sqrt(224).
TEST(GemmaConfig, The27BModelsScaleQueriesByDimOverHeads) {
  Qwen35File g2("gemma2"), g3("gemma3");
  auto keep = [](const std::string&, GgufValue&) { return true; };
  ModelConfig c2 = g2.read_edited(keep).value(), c3 = g3.read_edited(keep).value();
  EXPECT_EQ(c2.query_scale, 0.0f) << "the tiny file is no 27B";
  EXPECT_EQ(c2.attention_scale(), 1.0f / std::sqrt(float(c2.head_dim())));
  c2.n_layers = 46, c2.dim = 4608, c2.n_heads = 32, c2.key_length = 128;
  EXPECT_EQ(gemma_query_scale(c2), 1.0f / std::sqrt(144.0f));
  c2.n_layers = 42, c2.dim = 3584, c2.n_heads = 16, c2.key_length = 256;
  EXPECT_EQ(gemma_query_scale(c2), 0.0f);
  c2.query_scale = gemma_query_scale(c2);
  EXPECT_EQ(c2.attention_scale(), 1.0f / 16.0f);
  c3.n_layers = 62, c3.dim = 5376, c3.n_heads = 32, c3.key_length = 128;
  EXPECT_EQ(gemma_query_scale(c3), 1.0f / std::sqrt(168.0f));
  c3.n_layers = 46;
  EXPECT_EQ(gemma_query_scale(c3), 0.0f) << "46 layers is a gemma2 27B only";
  ModelConfig llama;
  llama.n_layers = 46, llama.dim = 4608, llama.n_heads = 32;
  EXPECT_EQ(gemma_query_scale(llama), 0.0f);
}

// Gemma's windowed layers (docs/WINDOWS.md), as llama.cpp's load_swa_pattern: an integer
// pattern n windows layer l iff l % n < n - 1, a bool array names each layer, Gemma 2 without a
// window has 4096 and Gemma 3 none; a short array is refused, naming the key.
TEST(GemmaConfig, WindowedLayersFollowLlamaCppsPattern) {
  Qwen35File g2("gemma2"), g3("gemma3");
  auto keep = [](const std::string&, GgufValue&) { return true; };
  auto c = g2.read_edited(keep);
  ASSERT_TRUE(c) << c.status().to_string();
  EXPECT_EQ(c->swa_layers, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(c->window(0), 32u);
  EXPECT_EQ(c->window(1), 0u);
  EXPECT_EQ(c->attn_softcap, 5.0f);
  EXPECT_EQ(c->final_softcap, 30.0f);
  EXPECT_EQ(c->rope_freq_base_swa, c->rope_freq_base);
  c = g2.read_edited(
      [](const std::string& key, GgufValue&) { return key.find("sliding_window") == std::string::npos; });
  ASSERT_TRUE(c) << c.status().to_string();
  EXPECT_EQ(c->window(0), 4096u);
  c = g3.read_edited(keep);
  ASSERT_TRUE(c) << c.status().to_string();
  EXPECT_EQ(c->swa_layers, (std::vector<bool>{true, true, true, true, true, false}));
  EXPECT_EQ(c->rope_freq_base_swa, 10000.0f);
  EXPECT_EQ(c->final_softcap, 0.0f);
  c = g3.read_edited([](const std::string& key, GgufValue& v) {
    if (key == "gemma3.attention.sliding_window_pattern") v.value = uint64_t{3};
    return true;
  });
  ASSERT_TRUE(c) << c.status().to_string();
  EXPECT_EQ(c->swa_layers, (std::vector<bool>{true, true, false, true, true, false}));
  c = g3.read_edited([](const std::string& key, GgufValue& v) {
    if (key == "gemma3.attention.sliding_window_pattern")
      v = Qwen35File::ints(GgufValueType::kBool, {0, 1, 0, 0, 1, 1});
    return true;
  });
  ASSERT_TRUE(c) << c.status().to_string();
  EXPECT_EQ(c->swa_layers, (std::vector<bool>{false, true, false, false, true, true}));
  c = g3.read_edited([](const std::string& key, GgufValue&) { return key != "gemma3.attention.sliding_window"; });
  ASSERT_TRUE(c) << c.status().to_string();
  for (uint32_t l = 0; l < 6; ++l) EXPECT_EQ(c->window(l), 0u) << "no window, no windowed layer";
  expect_refused(g3.read_edited([](const std::string& key, GgufValue& v) {
    if (key == "gemma3.attention.sliding_window_pattern") v = Qwen35File::ints(GgufValueType::kBool, {1, 0});
    return true;
  }),
                 "gemma3.attention.sliding_window_pattern has 2 entries for 6 blocks");
}

}  // namespace
}  // namespace tandem::model
