#include "runtime/role.h"

#include <gtest/gtest.h>

namespace tandem::runtime {
namespace {

TEST(Role, NamesAndWireFormRoundTrip) {
  for (Role role : {Role::kBoth, Role::kPrefill, Role::kDecode}) {
    EXPECT_EQ(role_from_name(role_name(role)), role);
    EXPECT_EQ(role_from_proto(role_to_proto(role)), role);
  }
  EXPECT_EQ(role_to_proto(Role::kPrefill), v1::WORKER_ROLE_PREFILL);
  EXPECT_STREQ(role_name(Role::kDecode), "decode");
  EXPECT_EQ(role_from_name("Both"), std::nullopt);
  EXPECT_EQ(role_from_name(""), std::nullopt);
  EXPECT_EQ(role_from_proto(v1::WORKER_ROLE_UNSPECIFIED), std::nullopt);
  EXPECT_EQ(role_from_proto(static_cast<v1::WorkerRole>(99)), std::nullopt);
}

}  // namespace
}  // namespace tandem::runtime
