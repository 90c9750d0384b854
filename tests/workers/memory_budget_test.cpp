#include "workers/memory_budget.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/test_util.h"

namespace tandem::worker {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kGiB = uint64_t{1} << 30;

// A /proc and a /sys/fs/cgroup of files, as the kernel shows them, under a temp folder.
struct FakeHost {
  std::string root = test::temp_dir() + "/host-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed());
  std::string proc = root + "/proc", cgroup = root + "/cgroup";
  FakeHost() {
    fs::remove_all(root);
    fs::create_directories(proc + "/self");
    fs::create_directories(cgroup);
  }
  ~FakeHost() { fs::remove_all(root); }
  void write(const std::string& path, const std::string& text) const {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path) << text;
  }
  void meminfo(uint64_t available_kib) const {
    write(proc + "/meminfo", "MemTotal:       24684092 kB\nMemFree:         1000000 kB\nMemAvailable:   " +
                                 std::to_string(available_kib) + " kB\n");
  }
};

TEST(MemoryBudget, NoCgroupLimitLeavesMemAvailable) {
  FakeHost h;
  h.meminfo(16 * 1024 * 1024);
  h.write(h.proc + "/self/cgroup", "0::/user.slice/session-1.scope\n");
  h.write(h.cgroup + "/user.slice/session-1.scope/memory.max", "max\n");
  h.write(h.cgroup + "/user.slice/session-1.scope/memory.current", "123\n");
  auto host = read_host_memory(h.proc, h.cgroup);
  ASSERT_TRUE(host) << host.status().to_string();
  EXPECT_EQ(host->available, 16 * kGiB);
  EXPECT_FALSE(host->cgroup);
  EXPECT_EQ(host->usable(), 16 * kGiB);
}

// cgroup v2: the tightest level on the way up binds, here the parent slice.
TEST(MemoryBudget, CgroupV2TightestAncestorBinds) {
  FakeHost h;
  h.meminfo(16 * 1024 * 1024);
  h.write(h.proc + "/self/cgroup", "0::/a/b\n");
  h.write(h.cgroup + "/a/b/memory.max", std::to_string(8 * kGiB) + "\n");
  h.write(h.cgroup + "/a/b/memory.current", std::to_string(1 * kGiB) + "\n");
  h.write(h.cgroup + "/a/memory.max", std::to_string(6 * kGiB) + "\n");
  h.write(h.cgroup + "/a/memory.current", std::to_string(2 * kGiB) + "\n");
  auto host = read_host_memory(h.proc, h.cgroup);
  ASSERT_TRUE(host) << host.status().to_string();
  ASSERT_TRUE(host->cgroup);
  EXPECT_EQ(host->cgroup->path, "/a");
  EXPECT_EQ(host->usable(), 4 * kGiB);
  EXPECT_EQ(host->to_string(), "MemAvailable 16.0 GiB; cgroup /a: 2.0 GiB of 6.0 GiB used");
}

// cgroup v1: the memory controller's line, its mount under memory/, and v1's "unlimited".
TEST(MemoryBudget, CgroupV1MemoryController) {
  FakeHost h;
  h.meminfo(4 * 1024 * 1024);
  h.write(h.proc + "/self/cgroup", "5:cpu,cpuacct:/\n4:memory:/job/7\n0::/\n");
  h.write(h.cgroup + "/memory/job/7/memory.limit_in_bytes", "9223372036854771712\n");
  h.write(h.cgroup + "/memory/job/7/memory.usage_in_bytes", "5000\n");
  h.write(h.cgroup + "/memory/job/memory.limit_in_bytes", std::to_string(3 * kGiB) + "\n");
  h.write(h.cgroup + "/memory/job/memory.usage_in_bytes", std::to_string(kGiB / 2) + "\n");
  auto host = read_host_memory(h.proc, h.cgroup);
  ASSERT_TRUE(host) << host.status().to_string();
  ASSERT_TRUE(host->cgroup);
  EXPECT_EQ(host->cgroup->path, "/job");
  EXPECT_EQ(host->usable(), 3 * kGiB - kGiB / 2);
  // MemAvailable below the cgroup's room binds instead.
  h.meminfo(1024 * 1024);
  host = read_host_memory(h.proc, h.cgroup);
  ASSERT_TRUE(host);
  EXPECT_EQ(host->usable(), kGiB);
}

TEST(MemoryBudget, BadFilesAreNamed) {
  FakeHost h;
  auto host = read_host_memory(h.proc, h.cgroup);
  ASSERT_FALSE(host);
  EXPECT_NE(host.status().message().find("/meminfo cannot be read"), std::string::npos);
  h.write(h.proc + "/meminfo", "MemTotal: 1 kB\n");
  host = read_host_memory(h.proc, h.cgroup);
  ASSERT_FALSE(host);
  EXPECT_NE(host.status().message().find("has no MemAvailable line"), std::string::npos);
  h.meminfo(1024);
  h.write(h.proc + "/self/cgroup", "0::/x\n");
  h.write(h.cgroup + "/x/memory.max", "lots\n");
  host = read_host_memory(h.proc, h.cgroup);
  ASSERT_FALSE(host);
  EXPECT_NE(host.status().message().find("x/memory.max: 'lots' is not a byte count"), std::string::npos)
      << host.status().message();
}

TEST(MemoryBudget, KvBytesSubtractWeightsAndReserveThenSplit) {
  KvBudget b{.usable = 20 * kGiB, .weights = 2 * kGiB, .reserve = 2 * kGiB, .share = 2};
  EXPECT_EQ(b.kv_bytes(), 8 * kGiB);
  EXPECT_EQ(b.to_string(), "KV 8.0 GiB = (20.0 GiB usable - 2.0 GiB weights - 2.0 GiB reserve) / 2 workers");
  b.states = 3 * kGiB;  // a hybrid model's state slots come out of this worker's share
  EXPECT_EQ(b.kv_bytes(), 5 * kGiB);
  EXPECT_EQ(b.to_string(),
            "KV 5.0 GiB = (20.0 GiB usable - 2.0 GiB weights - 2.0 GiB reserve) / 2 workers - 3.0 GiB state slots");
  b.states = 9 * kGiB;
  EXPECT_EQ(b.kv_bytes(), 0u);
  b.states = 0;
  b.reserve = 19 * kGiB;
  EXPECT_EQ(b.kv_bytes(), 0u);
}

// This machine's own /proc and cgroups read without error and give a plausible figure.
TEST(MemoryBudget, ReadsThisHost) {
  auto host = read_host_memory();
  ASSERT_TRUE(host) << host.status().to_string();
  EXPECT_GT(host->available, uint64_t{64} << 20);
  EXPECT_LE(host->usable(), host->available);
}

}  // namespace
}  // namespace tandem::worker
