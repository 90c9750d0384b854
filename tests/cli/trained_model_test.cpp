// tests/data/vocab-trained.gguf, the model scripts/main.sh and the README's first example run:
// what it writes is English. At least 90 % of the words `tandem run` generates from it, greedy
// and sampled, over several prompts, are in Debian's wamerican list
// (/usr/share/dict/american-english, installed by scripts/install-deps.sh).
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "tests/test_util.h"

namespace tandem {
namespace {

constexpr const char* kModel = TANDEM_SOURCE_DIR "/tests/data/vocab-trained.gguf";
constexpr const char* kWords = "/usr/share/dict/american-english";

// Runs of ASCII letters: what a reader would look up (digits, punctuation and apostrophes cut).
std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text + " ") {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      cur += c;
    } else if (!cur.empty()) {
      out.push_back(cur);
      cur.clear();
    }
  }
  return out;
}

TEST(TrainedModel, NinetyPercentOfTheWordsItGeneratesAreEnglish) {
  std::ifstream in(kWords);
  if (!in) {
    if (std::getenv("CI") != nullptr) FAIL() << kWords << " is missing: scripts/install-deps.sh installs wamerican";
    GTEST_SKIP() << kWords << " is missing (Debian: apt-get install wamerican)";
  }
  std::unordered_set<std::string> dict;
  for (std::string w; std::getline(in, w);) dict.insert(w);
  auto known = [&](std::string w) {
    if (dict.count(w)) return true;
    for (char& c : w) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return dict.count(w) > 0;
  };

  const std::vector<std::string> prompts = {"The quick brown fox", "This program is free software",
                                            "To move the cursor to the end of the line,", "You can"};
  // Greedy, then sampled at temperature 0.8 with three seeds.
  const std::vector<std::string> samplings = {"--temperature 0", "--temperature 0.8 --seed 1",
                                              "--temperature 0.8 --seed 2", "--temperature 0.8 --seed 3"};
  size_t total = 0, in_dict = 0;
  std::string unknown;
  for (const std::string& p : prompts) {
    for (const std::string& s : samplings) {
      const auto r = test::run_command(std::string(TANDEM_TANDEM_BIN) + " run --model " + kModel + " --prompt " +
                                       test::shell_quote(p) + " --max-tokens 48 --threads 1 " + s);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      for (const std::string& w : words_of(r.out)) {
        ++total;
        if (known(w)) {
          ++in_dict;
        } else {
          unknown += " " + w;
        }
      }
    }
  }
  ASSERT_GT(total, 200u);
  const double share = static_cast<double>(in_dict) / static_cast<double>(total);
  std::printf("%zu of %zu generated words (%.1f %%) are in wamerican; not:%s\n", in_dict, total, 100 * share,
              unknown.c_str());
  EXPECT_GE(share, 0.90) << "not in the word list:" << unknown;
}

}  // namespace
}  // namespace tandem
