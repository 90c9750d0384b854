// The tokenizers against Hugging Face's own ids: llama.cpp's vocabulary-only GGUFs with their
// .inp/.out pairs (models/ggml-vocab-NAME.gguf{,.inp,.out}). Where the files come from:
//   - the llama.cpp tree in npm's node-llama-cpp, fetched into the build tree by
//     tests/data/fetch-llama-tree.sh (a ctest fixture, so `ctest` runs it first);
//   - ../shared/data/vocab beside the repository (some of them).
// A test whose files are in neither place is skipped and says so.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "runtime/utf8.h"
#include "tests/test_util.h"

#ifndef TANDEM_LLAMA_VOCAB_DIR
#define TANDEM_LLAMA_VOCAB_DIR ""
#endif

namespace tandem::model {
namespace {

namespace fs = std::filesystem;

// Where ggml-vocab-NAME.gguf and its .inp/.out are, or "" (and why in `searched`).
std::string vocab_path(const std::string& name, std::string& searched) {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("TANDEM_LLAMA_VOCAB_DIR")) dirs.emplace_back(env);
  dirs.emplace_back(TANDEM_LLAMA_VOCAB_DIR);
  dirs.emplace_back(std::string(TANDEM_SOURCE_DIR) + "/../shared/data/vocab");
  for (const std::string& d : dirs) {
    if (d.empty()) continue;
    const std::string p = d + "/ggml-vocab-" + name + ".gguf";
    if (fs::exists(p) && fs::exists(p + ".inp") && fs::exists(p + ".out")) return p;
    searched += " " + d;
  }
  return "";
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using Case = test::VocabCase;

std::vector<Case> read_cases(const std::string& gguf) {
  size_t out_lines = 0;
  std::vector<Case> cases = test::read_vocab_cases(gguf, out_lines);
  EXPECT_EQ(out_lines, cases.size()) << gguf << ": .out has fewer lines than .inp has texts";
  return cases;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += " " + std::to_string(id);
  return s;
}

class Reference : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    std::string searched;
    path_ = vocab_path(GetParam(), searched);
    if (path_.empty()) {
      GTEST_SKIP() << "ggml-vocab-" << GetParam() << ".gguf with .inp/.out not found (searched" << searched
                   << "); `ctest` fetches it with tests/data/fetch-llama-tree.sh, which needs npm and its registry";
    }
    auto file = GgufFile::open(path_);
    ASSERT_TRUE(file) << file.status().to_string();
    file_ = std::move(*file);
    auto tok = Tokenizer::from_gguf(*file_);
    ASSERT_TRUE(tok) << tok.status().to_string();
    tok_ = std::move(*tok);
    ASSERT_TRUE(tok_.can_encode()) << *tok_.encode("x", false).status().to_string().c_str();
    cases_ = read_cases(path_);
  }
  std::string path_;
  std::unique_ptr<GgufFile> file_;
  Tokenizer tok_;
  std::vector<Case> cases_;
};

TEST_P(Reference, IdsEqualHuggingFaces) {
  size_t equal = 0;
  for (const Case& c : cases_) {
    auto ids = tok_.encode(c.text, EncodeOptions{.add_special = false});
    ASSERT_TRUE(ids) << ids.status().to_string();
    EXPECT_EQ(show(*ids), show(c.ids)) << "text '" << c.text << "'";
    equal += *ids == c.ids;
  }
  std::printf("%s (pre '%s'): %zu of %zu ids equal Hugging Face's\n", GetParam(), tok_.pre().c_str(), equal,
              cases_.size());
}

TEST_P(Reference, DecodeOfEncodeIsTheText) {
  for (const Case& c : cases_) {
    for (bool add_special : {false, true}) {
      auto ids = tok_.encode(c.text, EncodeOptions{.add_special = add_special});
      ASSERT_TRUE(ids) << ids.status().to_string();
      EXPECT_EQ(tok_.decode(*ids, DecodeOptions{.strip_space_prefix = true}), c.text);
    }
  }
}

// Token by token, every piece released is whole UTF-8 and the pieces add up to the text.
TEST_P(Reference, StreamedDecodingIsWholeCharactersAndTheSameText) {
  for (const Case& c : cases_) {
    StreamDecoder stream(tok_, DecodeOptions{.strip_space_prefix = true});
    std::string all;
    for (int32_t id : c.ids) {
      std::string piece;
      stream.push(id, piece);
      EXPECT_EQ(runtime::utf8_releasable_prefix(piece), piece.size());
      for (size_t i = 0; i < piece.size(); i += std::max<size_t>(1, runtime::utf8_sequence_length(piece, i))) {
        EXPECT_NE(runtime::utf8_sequence_length(piece, i), 0u) << "broken UTF-8 released for '" << c.text << "'";
      }
      all += piece;
    }
    stream.flush(all);
    EXPECT_EQ(all, tok_.decode(c.ids, DecodeOptions{.strip_space_prefix = true}));
    EXPECT_EQ(all, c.text);
  }
}

// 1 MiB of English as Debian ships it: the license texts (base-files), then the packages'
// copyright files, in name order; repeated only if the machine has less.
std::string english_megabyte() {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/usr/share/common-licenses", ec))
    if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<fs::path> copyrights;
  for (const auto& e : fs::directory_iterator("/usr/share/doc", ec))
    if (fs::is_regular_file(e.path() / "copyright")) copyrights.push_back(e.path() / "copyright");
  std::sort(copyrights.begin(), copyrights.end());
  files.insert(files.end(), copyrights.begin(), copyrights.end());
  std::string all;
  for (const fs::path& f : files) {
    std::string t = read_all(f.string());
    size_t ok = 0;  // whole UTF-8 only: a few copyright files are Latin-1
    while (ok < t.size() && runtime::utf8_sequence_length(t, ok) > 0) ok += runtime::utf8_sequence_length(t, ok);
    if (ok == t.size()) all += t;
    if (all.size() >= (1u << 20)) break;
  }
  if (all.empty()) return "";
  std::string text;
  while (text.size() < (1u << 20)) text += all;
  size_t cut = 1u << 20;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  text.resize(cut);
  return text;
}

// Printed, not asserted (the machine is shared): MB/s over 1 MiB and the time for 128 KiB,
// best of a few runs. bench/RESULTS.md keeps the figures.
TEST_P(Reference, SpeedOnEnglish) {
  const std::string text = english_megabyte();
  if (text.empty()) GTEST_SKIP() << "no /usr/share/common-licenses or /usr/share/doc to time with";
  // Best of `runs` in wall time and in this process's CPU time (on a shared machine the CPU
  // time is what the tokenizer itself costs).
  struct Timing {
    double wall_ms = 1e9, cpu_ms = 1e9;
    size_t tokens = 0;
  };
  auto best = [&](std::string_view t, int runs) {
    Timing b;
    for (int i = 0; i < runs; ++i) {
      const auto start = std::chrono::steady_clock::now();
      const std::clock_t cpu_start = std::clock();
      auto ids = tok_.encode(t, EncodeOptions{.add_special = false});
      const double cpu = 1e3 * static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
      const std::chrono::duration<double, std::milli> wall = std::chrono::steady_clock::now() - start;
      EXPECT_TRUE(ids);
      b.tokens = ids ? ids->size() : 0;
      b.wall_ms = std::min(b.wall_ms, wall.count());
      b.cpu_ms = std::min(b.cpu_ms, cpu);
    }
    return b;
  };
  const Timing mb = best(text, 3), small = best(std::string_view(text).substr(0, 128 << 10), 5);
  std::printf(
      "speed %s: %zu bytes -> %zu tokens in %.1f ms (CPU %.1f ms) = %.1f MB/s (CPU %.1f MB/s); "
      "128 KiB -> %zu tokens in %.2f ms (CPU %.2f ms)\n",
      GetParam(), text.size(), mb.tokens, mb.wall_ms, mb.cpu_ms, text.size() / 1e3 / mb.wall_ms,
      text.size() / 1e3 / mb.cpu_ms, small.tokens, small.wall_ms, small.cpu_ms);
}

INSTANTIATE_TEST_SUITE_P(Vocab, Reference,
                         ::testing::Values("gpt-2", "llama-bpe", "qwen2", "qwen35", "deepseek-llm", "deepseek-coder",
                                           "starcoder", "falcon", "refact", "mpt", "command-r", "llama-spm", "phi-3",
                                           "gemma-4"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace tandem::model
