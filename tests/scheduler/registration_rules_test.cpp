// The registration checks of scheduler/registration.h, as pure functions: every rule of the
// kv_endpoint and of the KV pool, and the MemTotal reader. The real-socket tests are in
// tests/security/registration_test.cpp.
#include <gtest/gtest.h>

#include <fstream>

#include "scheduler/registration.h"
#include "tests/test_util.h"

namespace tandem::scheduler {
namespace {

bool taken(const std::string& endpoint, const RegisteringPeer& peer, const std::vector<std::string>& allow = {}) {
  return !check_kv_endpoint(endpoint, peer, allow).has_value();
}

TEST(RegistrationRules, AKvEndpointIsThePeersOwnOrAllowed) {
  const RegisteringPeer local{true, ""}, v4{false, "10.0.0.5"}, v6{false, "fd00::5"};
  EXPECT_TRUE(taken("ipc:///run/tandem/kv.sock", local));
  EXPECT_TRUE(taken("tcp://127.0.0.1:5600", local));
  EXPECT_TRUE(taken("tcp://[::1]:5600", local));
  EXPECT_FALSE(taken("tcp://10.0.0.5:5600", local));
  EXPECT_TRUE(taken("tcp://10.0.0.5:5600", v4));
  EXPECT_FALSE(taken("tcp://10.0.0.50:5600", v4));
  EXPECT_FALSE(taken("tcp://127.0.0.1:5600", v4)) << "a remote peer's loopback is not its address here";
  EXPECT_FALSE(taken("ipc:///run/tandem/kv.sock", v4));
  EXPECT_FALSE(taken("tcp://0.0.0.0:5600", v4));
  EXPECT_FALSE(taken("inproc://kv", v4));
  EXPECT_FALSE(taken("tcp://10.0.0.5", v4)) << "no port";
  EXPECT_TRUE(taken("tcp://[fd00::5]:5600", v6));
  EXPECT_FALSE(taken("tcp://[fd00::6]:5600", v6));
  EXPECT_TRUE(taken("tcp://kv-host.example:5600", v4, {"kv-host.example"}));
  EXPECT_TRUE(taken("tcp://10.0.0.9:5600", v4, {"tcp://10.0.0.9:5600"}));
  EXPECT_FALSE(taken("tcp://10.0.0.9:5601", v4, {"tcp://10.0.0.9:5600"}));
  EXPECT_TRUE(taken("ipc:///run/tandem/kv.sock", v4, {"ipc:///run/tandem/kv.sock"}));
  const auto refusal = check_kv_endpoint("tcp://10.0.0.50:5600", v4, {"10.0.0.7"});
  ASSERT_TRUE(refusal);
  EXPECT_EQ(refusal->reason, v1::REFUSAL_REASON_KV_ENDPOINT);
  EXPECT_EQ(refusal->message.find("10.0.0.5:"), std::string::npos) << "names no expected value: " << refusal->message;
  EXPECT_EQ(refusal->message.find("10.0.0.7"), std::string::npos) << refusal->message;
}

// The scheme a worker's KV codes are made with: one this scheduler knows, at a width it takes.
TEST(RegistrationRules, AKvSchemeIsOneTheSchedulerKnowsAtAWidthItTakes) {
  v1::Register r;
  auto refusal = [&](v1::KvQuantScheme scheme, uint32_t bits) {
    r.set_kv_quant_scheme(scheme);
    r.set_kv_bits(bits);
    return check_kv_scheme(r);
  };
  for (uint32_t bits : {0u, 8u, 4u}) {
    EXPECT_FALSE(refusal(v1::KV_QUANT_SCHEME_UNSPECIFIED, bits)) << bits;  // a worker from before the field
    EXPECT_FALSE(refusal(v1::KV_QUANT_SCHEME_UNIFORM, bits)) << bits;
  }
  EXPECT_FALSE(refusal(v1::KV_QUANT_SCHEME_ROTATED, 4));
  EXPECT_FALSE(refusal(v1::KV_QUANT_SCHEME_ROTATED, 3));
  auto bad = refusal(v1::KV_QUANT_SCHEME_ROTATED, 8);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->reason, v1::REFUSAL_REASON_KV_FORMAT);
  EXPECT_EQ(bad->message, "rotated KV codes of 8 bits: the rotated scheme takes 4 or 3");
  bad = refusal(v1::KV_QUANT_SCHEME_UNIFORM, 3);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->message, "uniform KV codes of 3 bits: this scheduler knows 0 (F32), 8 and 4");
  bad = refusal(static_cast<v1::KvQuantScheme>(7), 4);  // a newer worker's scheme
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->reason, v1::REFUSAL_REASON_KV_FORMAT);
  EXPECT_EQ(bad->message, "KV quantization scheme 7 is not one this scheduler knows (uniform, rotated)");
}

TEST(RegistrationRules, AKvPoolIsBoundedByBytesAndByTheModelsSmallestBlock) {
  model::ModelConfig tiny;
  tiny.n_layers = 2;
  tiny.n_kv_heads = 2;
  tiny.n_heads = 4;
  tiny.dim = 64;
  EXPECT_EQ(min_kv_bytes_per_token(tiny), 48u);  // 2 layers x K,V x 2 heads x 16 dims x 3 bits
  RegistrationLimits limits;
  limits.max_worker_kv_bytes = uint64_t{1} << 30;
  limits.min_kv_bytes_per_token = 64;
  v1::Register r;
  r.set_kv_blocks(1024);
  r.set_block_tokens(16);
  r.set_block_bytes(8192);
  EXPECT_FALSE(check_kv_pool(r, limits));
  r.set_block_bytes(1023);
  ASSERT_TRUE(check_kv_pool(r, limits));
  EXPECT_EQ(check_kv_pool(r, limits)->reason, v1::REFUSAL_REASON_KV_POOL);
  r.set_block_bytes(uint64_t{1} << 20);  // 1 GiB in all: at the bound
  EXPECT_FALSE(check_kv_pool(r, limits));
  r.set_kv_blocks(1025);
  EXPECT_TRUE(check_kv_pool(r, limits));
  r.set_kv_blocks(1u << 24);
  r.set_block_bytes(~uint64_t{0});  // the product does not wrap
  EXPECT_TRUE(check_kv_pool(r, limits));
  r.set_kv_blocks((1u << 24) + 1);
  r.set_block_bytes(1024);
  limits.max_worker_kv_bytes = 0;
  EXPECT_TRUE(check_kv_pool(r, limits)) << "2^24 blocks at most";
  r.set_kv_blocks(16);
  r.set_block_tokens(24);
  EXPECT_TRUE(check_kv_pool(r, limits)) << "block tokens a multiple of 16";
  r.set_block_tokens(32);
  r.set_block_bytes(uint64_t{1} << 16);
  r.set_state_checkpoints(4);  // a hybrid's checkpoints sit at grid points and block ends
  for (const uint32_t every : {0u, 96u, 160u}) {
    r.set_checkpoint_interval(every);
    const auto refused = check_kv_pool(r, limits);
    ASSERT_TRUE(refused) << every;
    EXPECT_NE(refused->message.find("state checkpoints"), std::string::npos) << refused->message;
  }
  r.set_checkpoint_interval(192);
  EXPECT_FALSE(check_kv_pool(r, limits));
}

TEST(RegistrationRules, ListsAndMemTotal) {
  EXPECT_EQ(split_list(" a, tcp://b:1 ,, c"), (std::vector<std::string>{"a", "tcp://b:1", "c"}));
  EXPECT_TRUE(split_list("").empty());
  const std::string meminfo = test::temp_dir() + "/meminfo";
  std::ofstream(meminfo) << "MemTotal:       24684092 kB\nMemFree:         1000000 kB\n";
  EXPECT_EQ(host_mem_total(meminfo), uint64_t{24684092} * 1024);
  EXPECT_EQ(host_mem_total(test::temp_dir() + "/absent"), 0u);
  EXPECT_GT(host_mem_total(), 0u);
}

}  // namespace
}  // namespace tandem::scheduler
