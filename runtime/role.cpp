#include "runtime/role.h"

namespace tandem::runtime {

const char* role_name(Role role) {
  switch (role) {
    case Role::kBoth: return "both";
    case Role::kPrefill: return "prefill";
    case Role::kDecode: return "decode";
  }
  return "unknown";
}

std::optional<Role> role_from_name(std::string_view name) {
  for (Role role : {Role::kBoth, Role::kPrefill, Role::kDecode})
    if (name == role_name(role)) return role;
  return std::nullopt;
}

v1::WorkerRole role_to_proto(Role role) {
  switch (role) {
    case Role::kBoth: return v1::WORKER_ROLE_BOTH;
    case Role::kPrefill: return v1::WORKER_ROLE_PREFILL;
    case Role::kDecode: return v1::WORKER_ROLE_DECODE;
  }
  return v1::WORKER_ROLE_UNSPECIFIED;
}

std::optional<Role> role_from_proto(v1::WorkerRole role) {
  switch (role) {
    case v1::WORKER_ROLE_BOTH: return Role::kBoth;
    case v1::WORKER_ROLE_PREFILL: return Role::kPrefill;
    case v1::WORKER_ROLE_DECODE: return Role::kDecode;
    default: return std::nullopt;
  }
}

}  // namespace tandem::runtime
