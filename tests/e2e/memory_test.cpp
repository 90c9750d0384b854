// A worker's KV pool sized from what the host has left (--kv-memory 0): the figure reaches
// `tandem status`, and a budget that holds nothing is an error that says what to change.
// Run alone (tests/CMakeLists.txt): the pools are committed at start, and other tests'
// deployments would move MemAvailable while this one measures it.
#include <gtest/gtest.h>

#include <filesystem>
#include <utility>

#include "tests/e2e/streams.h"
#include "workers/engine/kv_cache.h"
#include "workers/engine/state_pool.h"
#include "workers/memory_budget.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using Deployment = test::ClientDeployment;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Two workers split what is left above the reserve: each pool is at most half of it (plus what
// the host freed meanwhile), blocks x block bytes, and the weights are reported beside it.
TEST(KvMemory, ZeroSplitsWhatTheHostHasLeftBetweenItsWorkers) {
  auto host = worker::read_host_memory();
  ASSERT_TRUE(host) << host.status().to_string();
  constexpr uint64_t kLeft = 512 * kMiB;  // for the two pools and both workers' weights
  ASSERT_GT(host->usable(), 2 * kLeft) << host->to_string();
  const uint64_t reserve = host->usable() - kLeft;
  Deployment d({"--workers", "2", "--threads", "1", "--kv-memory", "0", "--memory-reserve", std::to_string(reserve)});
  ASSERT_TRUE(d.ok());
  auto status = d.client()->status(5s);
  ASSERT_TRUE(status) << status.status().to_string();
  ASSERT_EQ(status->workers.size(), 2u);
  auto model = model::GgufFile::open(test::model_file("tiny", 1));
  ASSERT_TRUE(model);
  auto config = model::read_model_config(**model);
  ASSERT_TRUE(config);
  const uint64_t block_bytes = engine::KvPool::bytes_per_block(*config);
  constexpr uint64_t kSlack = 128 * kMiB;  // the host's free memory moves while the workers start
  for (const WorkerInfo& w : status->workers) {
    EXPECT_GT(w.weight_bytes, 0u);
    EXPECT_EQ(w.kv_bytes, uint64_t{w.kv_blocks_total} * block_bytes);
    EXPECT_GT(w.kv_bytes, 0u);
    EXPECT_LE(w.kv_bytes, (kLeft - 2 * w.weight_bytes) / 2 + kSlack) << host->to_string();
  }
}

// A reserve larger than the host: the worker stops at start and names the settings.
TEST(KvMemory, ABudgetThatHoldsNoBlockIsAnError) {
  const std::string dir = test::temp_dir();
  const pid_t pid =
      test::spawn({TANDEM_TANDEM_BIN, "worker", "--model", test::model_file("tiny", 1), "--scheduler",
                   "ipc://" + dir + "/nobody.sock", "--kv-memory", "0", "--memory-reserve", "1099511627776"},
                  dir + "/worker.out");
  ASSERT_GT(pid, 0);
  EXPECT_NE(test::wait_for(pid, 30s), 0);
  const std::string err = test::slurp(dir + "/worker.out") + test::slurp(dir + "/worker.out.err");
  EXPECT_NE(err.find("no memory left for the KV cache"), std::string::npos) << err;
  EXPECT_NE(err.find("--memory-reserve"), std::string::npos) << err;
}

// A hybrid model's state slots come out of the worker's share: a host whose memory above the
// reserve holds the weights and a KV pool but not the slots refuses to start, where counting
// only weights and KV would have overcommitted it by the slots. Its prefix cache's state
// checkpoints (one slot each) count the same.
TEST(KvMemory, AHybridWorkersStateSlotsComeOutOfItsBudget) {
  const std::string model = test::tiny_model("qwen35", 3);
  auto file = model::GgufFile::open(model);
  ASSERT_TRUE(file);
  auto config = model::read_model_config(**file);
  ASSERT_TRUE(config);
  const uint64_t slot_bytes = (*engine::StatePool::create(*config, 1))->slot_floats() * sizeof(float);
  constexpr uint64_t kSlots = 4096;               // --state-slots' most
  const uint64_t left = kSlots * slot_bytes / 2;  // above the reserve: half the slots' bytes
  ASSERT_GT(left, 96 * kMiB) << "the slots should dwarf the weights, a block and the host's drift";
  auto host = worker::read_host_memory();
  ASSERT_TRUE(host) << host.status().to_string();
  ASSERT_GT(host->usable(), 4 * left) << host->to_string();
  using Pair = std::pair<uint64_t, uint64_t>;  // state slots, checkpoints
  for (const auto& [slots, checkpoints] : {Pair{kSlots, 0}, Pair{1, kSlots}}) {
    const std::string dir = test::temp_dir() + "/" + std::to_string(checkpoints);
    std::filesystem::create_directories(dir);
    const pid_t pid =
        test::spawn({TANDEM_TANDEM_BIN, "worker", "--model", model, "--scheduler", "ipc://" + dir + "/nobody.sock",
                     "--kv-memory", "0", "--state-slots", std::to_string(slots), "--state-checkpoints",
                     std::to_string(checkpoints), "--memory-reserve", std::to_string(host->usable() - left)},
                    dir + "/worker.out");
    ASSERT_GT(pid, 0);
    EXPECT_NE(test::wait_for(pid, 30s), 0) << checkpoints << " checkpoints";
    const std::string err = test::slurp(dir + "/worker.out") + test::slurp(dir + "/worker.out.err");
    EXPECT_NE(err.find("state slots"), std::string::npos) << err;
    EXPECT_NE(err.find("no memory left for the KV cache"), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace tandem
