// `tandem up --config`: a bad file is refused with a message naming the key, with a
// non-zero exit, before any process starts.
#include "cli/config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/e2e/deployment.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

struct Outcome {
  int code;
  std::string out, err;
};

// Runs `tandem up --config <file with text> flags...` to completion (bounded).
Outcome up_with(const std::string& toml, std::vector<std::string> flags = {}) {
  const std::string dir = test::temp_dir();
  {
    std::ofstream f(dir + "/deploy.toml");
    f << toml;
  }
  std::vector<std::string> argv = {TANDEM_TANDEM_BIN, "up",        "--config", dir + "/deploy.toml",
                                   "--runtime-dir",   dir + "/run"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  const pid_t pid = test::spawn(argv, dir + "/up.out");
  Outcome o{test::wait_for(pid, 30s), test::slurp(dir + "/up.out"), test::slurp(dir + "/up.out.err")};
  EXPECT_EQ(o.out.find("started"), std::string::npos) << "nothing may start: " << o.out;
  return o;
}

std::string model_line() { return "model = \"" + test::model_file("tiny", 1) + "\"\n"; }

void expect_error(const Outcome& o, const std::string& needle) {
  EXPECT_NE(o.code, 0);
  EXPECT_NE(o.err.find(needle), std::string::npos) << "stderr: " << o.err;
}

TEST(Config, UnknownKeysAreNamed) {
  expect_error(up_with(model_line() + "[scheduler]\nmax_qeue = 5\n"), "scheduler.max_qeue: unknown key (line 3)");
  expect_error(up_with(model_line() + "colour = \"blue\"\n"), "colour: unknown key");
  expect_error(up_with(model_line() + "[[workers]]\ncount = 1\nthread = 1\n"), "workers[0].thread: unknown key");
}

TEST(Config, BadEndpointsAreNamed) {
  expect_error(up_with(model_line() + "endpoint = \"http://localhost:80\"\n"),
               "endpoint: 'http://localhost:80' must start with ipc:// or tcp://");
  expect_error(up_with(model_line() + "worker_endpoint = \"tcp://127.0.0.1:99999\"\n"), "worker_endpoint");
  expect_error(up_with(model_line() + "endpoint = \"tcp://localhost\"\n"), "needs host:port");
}

TEST(Config, AMissingModelIsNamed) {
  expect_error(up_with("model = \"no-such-model.gguf\"\n"), "model: ");
  expect_error(up_with("model = \"no-such-model.gguf\"\n"), "does not exist");
  expect_error(up_with("[scheduler]\nmax_queue = 4\n"), "model: required");
}

TEST(Config, MoreThreadsThanCoresIsRefused) {
  const int cores = cli::available_cpus();
  expect_error(up_with(model_line() + "[[workers]]\ncount = " + std::to_string(cores + 1) + "\nthreads = 1\n"),
               "more than the " + std::to_string(cores) + " cores");
  // Flags override the file: with --workers 1 the thread count fits (and the next check,
  // the model, is what fails).
  const Outcome o =
      up_with("model = \"no-such.gguf\"\n[[workers]]\ncount = " + std::to_string(cores + 1) + "\n", {"--workers", "1"});
  expect_error(o, "no-such.gguf does not exist");
  expect_error(up_with(model_line() + "[[workers]]\ncount = 1\nthreads = 1\ncpus = [0, 0]\n"),
               "workers[0].cpus: needs count x threads = 1");
}

TEST(Config, WrongTypesRangesAndSyntaxAreNamed) {
  expect_error(up_with(model_line() + "[[workers]]\nthreads = \"two\"\n"), "workers[0].threads: must be an integer");
  expect_error(up_with(model_line() + "[scheduler]\npipeline_depth = 99\n"),
               "scheduler.pipeline_depth: must be in [1, 8], got 99");
  expect_error(up_with(model_line() + "[[workers]]\nrole = \"chef\"\n"),
               "workers[0].role: must be both, prefill or decode");
  expect_error(up_with(model_line() + "[[workers]]\ncpus = [9999]\n"), "workers[0].cpus");
  expect_error(up_with(model_line() + "log_level = \"loud\"\n"), "log_level: must be");
  expect_error(up_with(model_line() + "[scheduler\n"), "not valid TOML");
  expect_error(up_with(model_line(), {"--max-queue", "-3"}), "--max-queue");
}

TEST(Config, TheExampleParses) {
  auto c = cli::load_config(std::string(TANDEM_SOURCE_DIR) + "/deploy/local.toml");
  ASSERT_TRUE(c) << c.status().to_string();
  EXPECT_EQ(c->worker_count(), 2u);
  EXPECT_EQ(c->workers[0].cpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(c->scheduler.at("max-batch-tokens"), "256");
  EXPECT_EQ(c->supervision.drain_timeout_ms, 30000u);
}

TEST(Config, TcpWithoutAnAddressBindsLoopback) {
  EXPECT_EQ(*cli::normalize_endpoint("tcp://:5555", "endpoint"), "tcp://127.0.0.1:5555");
  EXPECT_EQ(*cli::normalize_endpoint("tcp://*:5555", "endpoint"), "tcp://*:5555");
  EXPECT_EQ(*cli::normalize_endpoint("ipc:///x/y.sock", "endpoint"), "ipc:///x/y.sock");
}

}  // namespace
}  // namespace tandem
