#include "tests/test_util.h"

#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <stdexcept>

#include "model/make_model.h"

namespace tandem::test {

namespace fs = std::filesystem;

namespace {
struct TempRoot {
  fs::path path;
  TempRoot() {
    std::string tmpl = (fs::temp_directory_path() / "tandem-test-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~TempRoot() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};
TempRoot& root() {
  static TempRoot r;
  return r;
}
}  // namespace

std::string temp_dir() {
  static int counter = 0;
  std::string name = std::to_string(counter++);
  name.insert(0, 1, 'd');  // (not "d" + ...: GCC 12 -O3 warns falsely on that, -Wrestrict)
  fs::path p = root().path / name;
  fs::create_directories(p);
  return p.string();
}

std::string model_file(const std::string& preset, unsigned seed, bool f16, bool tied) {
  static std::map<std::string, std::string> made;
  const std::string key = preset + "-" + std::to_string(seed) + (f16 ? "-f16" : "") + (tied ? "-tied" : "");
  if (auto it = made.find(key); it != made.end()) return it->second;
  auto config = model::preset_config(preset);
  if (!config) throw std::runtime_error(config.status().to_string());
  config->tied_embeddings = tied;
  std::string path = (root().path / (key + ".gguf")).string();
  Status st = model::make_model(*config, seed, path, f16 ? model::TensorType::kF16 : model::TensorType::kF32);
  if (!st) throw std::runtime_error(st.to_string());
  made[key] = path;
  return path;
}

std::vector<int32_t> random_tokens(size_t n, uint32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(3, static_cast<int32_t>(vocab) - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

}  // namespace tandem::test
