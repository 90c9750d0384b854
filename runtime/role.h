// What a worker does, the one definition every actor uses: the worker says it at registration,
// the scheduler plans by it, status reports its name. kBoth prefills and decodes its own
// sequences; a kPrefill worker hands each sequence to a kDecode worker once its prompt is done
// (its KV moves directly between the two).
#pragma once

#include <optional>
#include <string_view>

#include "tandem/v1/worker.pb.h"

namespace tandem::runtime {

enum class Role { kBoth, kPrefill, kDecode };

// "both", "prefill", "decode": the names on the command line, in configs and in status.
const char* role_name(Role role);
// The role named `name`; nullopt for any other string.
std::optional<Role> role_from_name(std::string_view name);

// The wire form (tandem.v1.WorkerRole) and back; nullopt for UNSPECIFIED or a value this
// build does not know.
v1::WorkerRole role_to_proto(Role role);
std::optional<Role> role_from_proto(v1::WorkerRole role);

}  // namespace tandem::runtime
