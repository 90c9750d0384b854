// tandem's types against llama.cpp's, on the GGUF files of ../shared/data/quant/ (beside the
// repository; skipped when absent). The references are checked in under tests/data/quant/, made
// by the scripts in bench/peers/ (their headers say from which llama.cpp commit and how):
// - dequant-gguf-py.txt: SHA-256 of gguf-py's float32 dequantization of every tensor of every file;
// - quantize-llama-cpp.txt: SHA-256 of every file llama-quantize wrote from mid-f32.gguf and
//   trained-f32.gguf for each type, and of each of its tensors' bytes.
#include <gtest/gtest.h>

#include <dirent.h>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/quant.h"
#include "model/quantize.h"
#include "tests/sha256.h"
#include "tests/test_util.h"

namespace tandem::model {
namespace {

const std::string kData = std::string(TANDEM_SOURCE_DIR) + "/../shared/data/quant";
const std::string kRefs = std::string(TANDEM_SOURCE_DIR) + "/tests/data/quant";

bool have_shared_data() { return std::ifstream(kData + "/mid-f32.gguf").good(); }

// The reference's lines, comments dropped, each split at spaces.
std::vector<std::vector<std::string>> reference_lines(const std::string& name) {
  std::ifstream in(kRefs + "/" + name);
  EXPECT_TRUE(in.good()) << kRefs << "/" << name;
  std::vector<std::vector<std::string>> lines;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    lines.push_back(std::move(w));
  }
  return lines;
}

std::string file_sha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  return test::sha256_hex(bytes.data(), bytes.size());
}

// SHA-256 of the tensor's values as little-endian float32, row by row through tandem's dequantizer.
std::string dequantized_sha256(const GgufTensor& t) {
  const TypeTraits* traits = type_traits(t.type);
  const uint64_t row = t.dims.empty() ? 1 : t.dims[0];
  const uint64_t rows = t.elements() / row, row_size = row / traits->block_elems * traits->block_bytes;
  std::vector<float> values(row);
  test::Sha256 sha;
  for (uint64_t r = 0; r < rows; ++r) {
    traits->dequantize(t.data + r * row_size, values.data(), static_cast<int64_t>(row));
    sha.update(values.data(), values.size() * sizeof(float));
  }
  return sha.hex();
}

TEST(QuantReference, DequantizationEqualsGgufPyForEveryTensorOfEveryFile) {
  if (!have_shared_data()) GTEST_SKIP() << "no " << kData << " (the shared data beside the repository)";
  std::map<std::string, std::unique_ptr<GgufFile>> files;
  std::map<std::string, size_t> listed;  // tensors per file in the reference
  int compared = 0, differing = 0;
  for (const auto& w : reference_lines("dequant-gguf-py.txt")) {
    ASSERT_EQ(w.size(), 5u);
    auto& file = files[w[0]];
    if (!file) {
      auto f = GgufFile::open(kData + "/" + w[0]);
      ASSERT_TRUE(f) << f.status().to_string();
      file = std::move(*f);
    }
    ++listed[w[0]];
    const GgufTensor* t = file->tensor(w[1]);
    ASSERT_NE(t, nullptr) << w[0] << " " << w[1];
    ASSERT_STREQ(ggml_type_name(t->type), w[2].c_str()) << w[0] << " " << w[1];
    ASSERT_NE(type_traits(t->type)->dequantize, nullptr) << w[2];
    ++compared;
    if (dequantized_sha256(*t) != w[4]) {
      ADD_FAILURE() << w[0] << " " << w[1] << " (" << w[2] << "): tandem's values differ from gguf-py's";
      ++differing;
    }
  }
  // Every .gguf of the folder is listed with all its tensors.
  DIR* dir = opendir(kData.c_str());
  ASSERT_NE(dir, nullptr);
  for (dirent* e; (e = readdir(dir)) != nullptr;) {
    const std::string name = e->d_name;
    if (name.size() < 5 || name.compare(name.size() - 5, 5, ".gguf") != 0) continue;
    auto f = GgufFile::open(kData + "/" + name);
    ASSERT_TRUE(f) << f.status().to_string();
    EXPECT_EQ(listed[name], (*f)->tensors().size()) << name << ": run bench/peers/dequant-reference.py again";
  }
  closedir(dir);
  std::printf("dequantized %d tensors of %zu files: %d differ from gguf-py\n", compared, files.size(), differing);
}

TEST(QuantReference, QuantizationEqualsLlamaQuantizeByteForByte) {
  if (!have_shared_data()) GTEST_SKIP() << "no " << kData << " (the shared data beside the repository)";
  const auto lines = reference_lines("quantize-llama-cpp.txt");
  const std::string dir = test::temp_dir();
  int files = 0, tensors = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto& f = lines[i];
    if (f[0] != "file") continue;
    ASSERT_EQ(f.size(), 4u);
    std::string lower = f[2];
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const auto type = parse_file_type(lower);
    ASSERT_TRUE(type) << f[2];
    const std::string out = dir + "/" + f[1] + "-" + f[2] + ".gguf";
    ASSERT_TRUE(quantize_model(kData + "/" + f[1], out, *type).is_ok());
    auto q = GgufFile::open(out);
    ASSERT_TRUE(q) << q.status().to_string();
    size_t k = 0;
    for (; i + 1 < lines.size() && lines[i + 1][0] == "tensor"; ++i, ++k) {
      const auto& t = lines[i + 1];  // tensor SOURCE TYPE name ggml_type sha256
      ASSERT_LT(k, (*q)->tensors().size()) << f[1] << " " << f[2];
      const GgufTensor& mine = (*q)->tensors()[k];
      EXPECT_EQ(mine.name, t[3]) << f[1] << " " << f[2] << ": tensor order";
      EXPECT_STREQ(ggml_type_name(mine.type), t[4].c_str()) << f[1] << " " << f[2] << " " << t[3];
      EXPECT_EQ(test::sha256_hex(mine.data, mine.nbytes), t[5]) << f[1] << " " << f[2] << " " << t[3];
      ++tensors;
    }
    EXPECT_EQ(k, (*q)->tensors().size()) << f[1] << " " << f[2];
    EXPECT_EQ(file_sha256(out), f[3]) << f[1] << " " << f[2] << ": metadata or layout differ from llama-quantize's";
    ++files;
  }
  EXPECT_EQ(files, 24);
  std::printf("quantized %d files (%d tensors) as llama-quantize does\n", files, tensors);
}

}  // namespace
}  // namespace tandem::model
