#include "tests/test_util.h"

#include <cstdlib>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "workers/engine/make_model.h"

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
  fs::path p = root().path / ("d" + std::to_string(counter++));
  fs::create_directories(p);
  return p.string();
}

std::string model_file(const std::string& preset, unsigned seed) {
  static std::map<std::pair<std::string, unsigned>, std::string> made;
  auto key = std::make_pair(preset, seed);
  if (auto it = made.find(key); it != made.end()) return it->second;
  auto config = engine::preset_config(preset);
  if (!config) throw std::runtime_error(config.status().to_string());
  std::string path = (root().path / (preset + "-" + std::to_string(seed) + ".gguf")).string();
  Status st = engine::make_model(*config, seed, path);
  if (!st) throw std::runtime_error(st.to_string());
  made[key] = path;
  return path;
}

}  // namespace tandem::test
