// llama-quantize's choice of type per tensor (model/quantize.h) on synthetic files that exercise
// each rule, and the file quantize_model writes. Equality with llama-quantize itself on real
// files: quant_reference_test.cpp.
#include "model/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "tests/test_util.h"

namespace tandem::model {
namespace {

struct Spec {
  std::string name;
  std::vector<uint64_t> dims;
  TensorType type = TensorType::kF32;
};

// A GGUF with llama metadata (block_count, heads) and the given tensors of small random values.
std::string write_file(const std::string& path, const std::vector<Spec>& specs, uint32_t layers, uint32_t heads = 4,
                       uint32_t kv_heads = 2, const std::string& arch = "llama") {
  GgufWriter w;
  w.add_string("general.architecture", arch);
  w.add_u32("general.file_type", 0);
  w.add_u32("split.count", 1);
  w.add_u32(arch + ".block_count", layers);
  w.add_u32(arch + ".attention.head_count", heads);
  w.add_u32(arch + ".attention.head_count_kv", kv_heads);
  w.add_string("general.name", "synthetic");
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  for (const Spec& s : specs) {
    uint64_t n = 1;
    for (uint64_t d : s.dims) n *= d;
    std::vector<float> x(n);
    for (float& v : x) v = dist(rng);
    std::vector<std::byte> data(row_bytes(s.type, n));
    type_traits(s.type)->quantize(x.data(), data.data(), static_cast<int64_t>(n));
    w.add_tensor(s.name, s.dims, s.type, data.data(), data.size());
  }
  EXPECT_TRUE(w.write(path).is_ok());
  return path;
}

// A dense llama of `layers` blocks whose rows are all multiples of 256.
std::vector<Spec> llama_specs(uint32_t layers, bool tied = false) {
  std::vector<Spec> s = {{"token_embd.weight", {256, 8}}, {"output_norm.weight", {256}}};
  if (!tied) s.push_back({"output.weight", {256, 8}});
  for (uint32_t i = 0; i < layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}) {
      s.push_back({b + m + ".weight", {256, 2}});
    }
    s.push_back({b + "attn_norm.weight", {256}});
    s.push_back({b + "ffn_norm.weight", {256}});
  }
  return s;
}

std::map<std::string, std::string> plan_types(const std::string& path, FileType type) {
  auto f = GgufFile::open(path);
  EXPECT_TRUE(f) << f.status().to_string();
  auto plan = plan_quantization(**f, type);
  EXPECT_TRUE(plan) << plan.status().to_string();
  std::map<std::string, std::string> out;
  for (const TensorPlan& p : *plan) out[p.tensor->name] = ggml_type_name(p.to);
  return out;
}

class QuantizeTest : public ::testing::Test {
 protected:
  std::string dir = test::temp_dir();
};

TEST_F(QuantizeTest, MediumMixesGiveMoreBitsToAttnVAndFfnDownOfChosenLayers) {
  const std::string path = write_file(dir + "/m.gguf", llama_specs(8), 8);
  // use_more_bits over 8 layers: the first eighth, the last eighth, and every third between.
  const std::vector<int> more = {0, 3, 6, 7};
  for (FileType ft : {FileType::kQ4_K_M, FileType::kQ5_K_M}) {
    auto t = plan_types(path, ft);
    const std::string base = ft == FileType::kQ4_K_M ? "Q4_K" : "Q5_K";
    for (int i = 0; i < 8; ++i) {
      const bool bump = std::find(more.begin(), more.end(), i) != more.end();
      const std::string b = "blk." + std::to_string(i) + ".";
      EXPECT_EQ(t[b + "attn_v.weight"], bump ? "Q6_K" : base) << i;
      EXPECT_EQ(t[b + "ffn_down.weight"], bump ? "Q6_K" : base) << i;
      EXPECT_EQ(t[b + "attn_q.weight"], base);
      EXPECT_EQ(t[b + "ffn_up.weight"], base);
      EXPECT_EQ(t[b + "attn_norm.weight"], "F32");
    }
    EXPECT_EQ(t["output.weight"], "Q6_K");
    EXPECT_EQ(t["token_embd.weight"], base) << "untied embeddings keep the mix's type";
  }
  auto s = plan_types(path, FileType::kQ4_K_S);
  for (int i = 0; i < 8; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    EXPECT_EQ(s[b + "attn_v.weight"], i < 4 ? "Q5_K" : "Q4_K") << i;
    EXPECT_EQ(s[b + "ffn_down.weight"], i < 1 ? "Q5_K" : "Q4_K") << i;
  }
  auto q8 = plan_types(path, FileType::kQ8_0);
  EXPECT_EQ(q8["output.weight"], "Q8_0");
  EXPECT_EQ(q8["blk.0.attn_v.weight"], "Q8_0");
  auto f16 = plan_types(path, FileType::kF16);
  EXPECT_EQ(f16["output.weight"], "F16");
  EXPECT_EQ(f16["blk.0.ffn_norm.weight"], "F32");
}

TEST_F(QuantizeTest, TiedEmbeddingsTakeTheOutputRule) {
  const std::string path = write_file(dir + "/t.gguf", llama_specs(2, /*tied=*/true), 2);
  EXPECT_EQ(plan_types(path, FileType::kQ4_K_M)["token_embd.weight"], "Q6_K");
  EXPECT_EQ(plan_types(path, FileType::kQ4_0)["token_embd.weight"], "Q6_K");
  EXPECT_EQ(plan_types(path, FileType::kQ8_0)["token_embd.weight"], "Q8_0");
}

TEST_F(QuantizeTest, RowsThatAreNotWholeBlocksFallBack) {
  const std::string path = write_file(dir + "/f.gguf",
                                      {{"token_embd.weight", {288, 4}},
                                       {"output.weight", {96, 4}},
                                       {"blk.0.attn_v.weight", {288, 2}},
                                       {"blk.0.ffn_down.weight", {33, 2}},
                                       {"blk.0.ffn_up.weight", {160, 2}}},
                                      1);
  auto m = plan_types(path, FileType::kQ4_K_M);
  EXPECT_EQ(m["token_embd.weight"], "Q5_0");     // Q4_K -> Q5_0
  EXPECT_EQ(m["output.weight"], "Q8_0");         // a row of 96 is no whole Q6_K block: Q8_0
  EXPECT_EQ(m["blk.0.attn_v.weight"], "Q8_0");   // bumped to Q6_K (layer 0), -> Q8_0
  EXPECT_EQ(m["blk.0.ffn_down.weight"], "F16");  // 33 fits no block type
  EXPECT_EQ(m["blk.0.ffn_up.weight"], "Q5_0");
  auto s = plan_types(path, FileType::kQ5_K_S);
  EXPECT_EQ(s["blk.0.ffn_up.weight"], "Q5_1");  // Q5_K -> Q5_1
  EXPECT_EQ(plan_types(path, FileType::kQ4_0)["blk.0.ffn_down.weight"], "F16");
}

TEST_F(QuantizeTest, SeventyBillionLlamaGivesAttnVFiveBits) {
  std::vector<Spec> specs;
  for (int i = 0; i < 80; ++i) specs.push_back({"blk." + std::to_string(i) + ".attn_v.weight", {256, 2}});
  const std::string gqa = write_file(dir + "/70b.gguf", specs, 80, 64, 8);
  auto t = plan_types(gqa, FileType::kQ4_K_M);
  EXPECT_EQ(t["blk.0.attn_v.weight"], "Q6_K");
  EXPECT_EQ(t["blk.11.attn_v.weight"], "Q5_K") << "Q4_K bumped to Q5_K in a 70B";
  const std::string mha = write_file(dir + "/65b.gguf", specs, 80, 64, 64);  // LLaMA-1 65B: no bump
  EXPECT_EQ(plan_types(mha, FileType::kQ4_K_M)["blk.11.attn_v.weight"], "Q4_K");
}

TEST_F(QuantizeTest, WritesLlamaQuantizesMetadataAndTensorOrder) {
  std::vector<Spec> specs = {{"blk.10.attn_q.weight", {256, 2}},
                             {"blk.2.attn_q.weight", {256, 2}},
                             {"output_norm.weight", {256}},
                             {"token_embd.weight", {256, 2}},
                             {"blk.2.attn_k.weight", {256, 2}}};
  const std::string in = write_file(dir + "/in.gguf", specs, 11);
  ASSERT_TRUE(quantize_model(in, dir + "/out.gguf", FileType::kQ6_K).is_ok());
  auto f = GgufFile::open(dir + "/out.gguf");
  ASSERT_TRUE(f) << f.status().to_string();
  std::vector<std::string> names;
  for (const GgufTensor& t : (*f)->tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"output_norm.weight", "token_embd.weight", "blk.2.attn_k.weight",
                                             "blk.2.attn_q.weight", "blk.10.attn_q.weight"}));
  const std::vector<std::string> keys = (*f)->keys_in_file_order();
  ASSERT_GE(keys.size(), 2u);
  EXPECT_EQ(keys[keys.size() - 2], "general.quantization_version");
  EXPECT_EQ(keys.back(), "general.file_type");
  EXPECT_EQ((*f)->get_uint("general.file_type"), 18u);
  EXPECT_EQ((*f)->get_uint("general.quantization_version"), 2u);
  EXPECT_EQ((*f)->find("split.count"), nullptr);
  EXPECT_EQ((*f)->get_string("general.name"), "synthetic");
  EXPECT_EQ((*f)->tensor("blk.2.attn_q.weight")->type, static_cast<uint32_t>(TensorType::kQ6_K));
}

TEST_F(QuantizeTest, RefusesWhatItCannotDoWithoutTouchingTheOutput) {
  const std::string q8 = write_file(dir + "/q8.gguf", {{"blk.0.attn_q.weight", {256, 2}, TensorType::kQ8_0}}, 1);
  Status st = quantize_model(q8, dir + "/out.gguf", FileType::kQ4_0);
  EXPECT_EQ(st.code(), Code::kModelFile);
  EXPECT_NE(st.message().find("tensor blk.0.attn_q.weight: cannot convert Q8_0 to Q4_0"), std::string::npos)
      << st.message();
  EXPECT_TRUE(quantize_model(q8, dir + "/same.gguf", FileType::kQ8_0).is_ok()) << "same type: copied";
  const std::string bf16 = write_file(dir + "/bf.gguf", {{"blk.0.attn_q.weight", {256, 2}, TensorType::kBF16}}, 1);
  EXPECT_TRUE(quantize_model(bf16, dir + "/from-bf16.gguf", FileType::kQ4_K_M).is_ok());
  GgufWriter nan;
  std::vector<float> values(512, 0.5f);
  values[300] = std::nanf("");
  nan.add_string("general.architecture", "llama");
  nan.add_u32("llama.block_count", 1);
  nan.add_tensor("blk.0.ffn_up.weight", {256, 2}, TensorType::kF32, values.data(), values.size() * 4);
  ASSERT_TRUE(nan.write(dir + "/nan.gguf").is_ok());
  st = quantize_model(dir + "/nan.gguf", dir + "/out.gguf", FileType::kQ8_0);
  EXPECT_NE(st.message().find("tensor blk.0.ffn_up.weight has a value that is not finite (element 300)"),
            std::string::npos)
      << st.message();
  GgufWriter moe;
  moe.add_string("general.architecture", "llama");
  moe.add_u32("llama.block_count", 1);
  moe.add_u32("llama.expert_count", 8);
  ASSERT_TRUE(moe.write(dir + "/moe.gguf").is_ok());
  st = quantize_model(dir + "/moe.gguf", dir + "/out.gguf", FileType::kQ4_K_M);
  EXPECT_NE(st.message().find("mixture-of-experts"), std::string::npos) << st.message();
  st = quantize_model(dir + "/absent.gguf", dir + "/out.gguf", FileType::kQ4_K_M);
  EXPECT_EQ(st.code(), Code::kModelFile);
  EXPECT_FALSE(GgufFile::open(dir + "/out.gguf"));
  EXPECT_EQ(parse_file_type("q4_k_m"), FileType::kQ4_K_M);
  EXPECT_FALSE(parse_file_type("Q4_K_M")) << "lower case, as the flag's choices";
  EXPECT_FALSE(parse_file_type("q3_k_m"));
}

}  // namespace
}  // namespace tandem::model
