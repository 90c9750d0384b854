#include "tests/test_util.h"

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
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

CommandOutput run_command(const std::string& command) {
  static int n = 0;
  const std::string dir = temp_dir();
  const std::string out = dir + "/out" + std::to_string(n), err = dir + "/err" + std::to_string(n++);
  const int rc = std::system((command + " >" + out + " 2>" + err).c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_file(out), read_file(err)};
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<VocabCase> read_vocab_cases(const std::string& gguf, size_t& out_lines) {
  const std::string inp = read_file(gguf + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<VocabCase> cases;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(sep, pos);
    cases.push_back(VocabCase{inp.substr(pos, next == std::string::npos ? std::string::npos : next - pos), {}});
    if (next == std::string::npos) break;
    pos = next + sep.size();
  }
  std::ifstream out(gguf + ".out");
  out_lines = 0;
  for (std::string line; std::getline(out, line) && out_lines < cases.size(); ++out_lines) {
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) cases[out_lines].ids.push_back(id);
  }
  return cases;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

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
