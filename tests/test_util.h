// Helpers shared by tests: scratch folders and model files made on the fly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

// The sanitizer this build runs under: GCC defines __SANITIZE_ADDRESS__ and
// __SANITIZE_THREAD__, clang answers __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define TANDEM_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TANDEM_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define TANDEM_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TANDEM_TEST_TSAN 1
#endif
#endif

namespace tandem::test {

// A fresh folder under the system temp dir, removed when the process exits.
std::string temp_dir();

// Path of a GGUF file with the given preset and seed, made once per process; `f16` stores
// matrices and embeddings in half precision, `tied` leaves out output.weight.
std::string model_file(const std::string& preset = "tiny", unsigned seed = 1, bool f16 = false, bool tied = false);

// What a shell command line printed and how it exited (-1: killed by a signal).
struct CommandOutput {
  int exit_code = -1;
  std::string out, err;
};
// Runs `command` with /bin/sh, its stdout and stderr captured in files under temp_dir().
CommandOutput run_command(const std::string& command);
// A file's bytes ("" when it cannot be read).
std::string read_file(const std::string& path);
// `s` as one shell word (single-quoted).
std::string shell_quote(const std::string& s);

// One text of a llama.cpp vocabulary test and the ids Hugging Face gives it.
struct VocabCase {
  std::string text;
  std::vector<int32_t> ids;
};
// llama.cpp's format: GGUF.inp holds the texts separated by "\n__ggml_vocab_test__\n", GGUF.out
// one line of ids per text. `out_lines`: how many lines .out has (a test checks it equals the
// number of texts).
std::vector<VocabCase> read_vocab_cases(const std::string& gguf, size_t& out_lines);

// n token ids drawn uniformly from [3, vocab) (no special tokens), the same for the same seed.
std::vector<int32_t> random_tokens(size_t n, uint32_t vocab, uint32_t seed);

}  // namespace tandem::test
