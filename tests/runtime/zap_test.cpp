// The allow-list file format (runtime/zap.h): keys, names, priority ranges, comments, and errors
// that name the line but never a key.
#include "runtime/zap.h"

#include <gtest/gtest.h>
#include <zmq.h>

#include <fstream>
#include <string>

#include "tests/test_util.h"

namespace tandem::runtime {
namespace {

std::string new_key() {
  char pub[41], secret[41];
  EXPECT_EQ(zmq_curve_keypair(pub, secret), 0);
  return pub;
}

Result<AllowList> load_text(const std::string& text) {
  const std::string path = test::temp_dir() + "/list";
  std::ofstream(path) << text;
  return AllowList::load(path, "--client-keys", AllowList::Of::kClients);
}

TEST(AllowList, KeysNamesRangesAndComments) {
  const std::string a = new_key(), b = new_key();
  // Z85 has '#' (never first in a key): only a word starting with '#' begins a comment.
  std::string hash_key = new_key();
  for (int i = 0; i < 1000 && hash_key.find('#') == std::string::npos; ++i) hash_key = new_key();
  ASSERT_NE(hash_key.find('#'), std::string::npos);
  auto list =
      load_text("# clients\n\n" + a + " app  # the app\n  " + b + " batch priority=-3..5\n" + hash_key + " odd\n");
  ASSERT_TRUE(list) << list.status().to_string();
  EXPECT_EQ(list->size(), 3u);
  ASSERT_NE(list->find_key(a), nullptr);
  EXPECT_EQ(list->find_key(a)->name, "app");
  EXPECT_FALSE(list->find_key(a)->has_priority_range());
  const Credential* batch = list->find_name("batch");
  ASSERT_NE(batch, nullptr);
  EXPECT_EQ(batch->min_priority, -3);
  EXPECT_EQ(batch->max_priority, 5);
  EXPECT_NE(list->find_name("odd"), nullptr);
  EXPECT_EQ(list->find_key(new_key()), nullptr);
  EXPECT_EQ(list->find_name("nobody"), nullptr);
}

TEST(AllowList, ProxyKeysAndPrincipalRanges) {
  const std::string a = new_key(), b = new_key(), c = new_key();
  auto list = load_text(a + " gateway proxy priority=0..9\n" + b + " batch priority=1..2 proxy\n" + c +
                        " app\nprincipal alice priority=0..3  # a tenant\nprincipal app priority=5..5\n");
  ASSERT_TRUE(list) << list.status().to_string();
  EXPECT_EQ(list->size(), 3u);
  EXPECT_EQ(list->principals(), 2u);
  ASSERT_NE(list->find_name("gateway"), nullptr);
  EXPECT_TRUE(list->find_name("gateway")->proxy);
  EXPECT_EQ(list->find_name("gateway")->max_priority, 9);
  EXPECT_TRUE(list->find_name("batch")->proxy);
  EXPECT_EQ(list->find_name("batch")->min_priority, 1);
  EXPECT_FALSE(list->find_name("app")->proxy);
  const Credential* alice = list->find_principal("alice");
  ASSERT_NE(alice, nullptr);
  EXPECT_EQ(alice->min_priority, 0);
  EXPECT_EQ(alice->max_priority, 3);
  EXPECT_EQ(list->find_principal("app")->min_priority, 5);  // a principal may share a key's name
  EXPECT_EQ(list->find_principal("gateway"), nullptr);
  EXPECT_EQ(list->find_name("alice"), nullptr);

  // A worker list takes neither.
  const std::string path = test::temp_dir() + "/workers";
  std::ofstream(path) << a + " w1 proxy\n";
  auto workers = AllowList::load(path, "--worker-keys", AllowList::Of::kWorkers);
  ASSERT_FALSE(workers);
  EXPECT_NE(workers.status().message().find("proxy only in a client list"), std::string::npos);
  std::ofstream(path) << "principal alice priority=0..3\n";
  EXPECT_FALSE(AllowList::load(path, "--worker-keys", AllowList::Of::kWorkers));
}

TEST(AllowList, ErrorsNameTheLineAndNoKey) {
  const std::string a = new_key();
  const struct {
    std::string text, says;
  } bad[] = {
      {"not-a-key app\n", "line 1: the first word is not a Z85 public key"},
      {"# ok\n" + a + "\n", "line 2: a key needs a name"},
      {a + " app priority=5..1\n", "priority=LO..HI"},
      {a + " app priority=x\n", "priority=LO..HI"},
      {a + " app priority=1..2 extra\n", "unexpected text"},
      {a + " app proxy proxy\n", "unexpected text"},
      {a + " app priority=1..2 priority=1..2\n", "unexpected text"},
      {"principal\n", "line 1: a principal line needs a name"},
      {"principal alice\n", "priority=LO..HI"},
      {"principal alice proxy\n", "priority=LO..HI"},
      {"principal alice priority=1..2 x\n", "unexpected text"},
      {"principal alice priority=1..2\nprincipal alice priority=0..1\n", "line 2: the principal alice is listed twice"},
      {a + " app\n" + new_key() + " app\n", "the name app is listed twice"},
      {a + " app\n" + a + " other\n", "this key is listed twice"},
  };
  for (const auto& [text, says] : bad) {
    auto list = load_text(text);
    ASSERT_FALSE(list) << text;
    EXPECT_NE(list.status().message().find(says), std::string::npos) << list.status().message();
    EXPECT_EQ(list.status().message().find(a), std::string::npos) << "an error gives a key away";
  }
  EXPECT_FALSE(AllowList::load("/nonexistent/list", "--worker-keys", AllowList::Of::kWorkers));
}

}  // namespace
}  // namespace tandem::runtime
