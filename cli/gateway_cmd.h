// The gateway's flags as GatewayOptions: shared by `tandem gateway` and `tandem up`, which
// checks a [gateway] table's settings before it starts anything.
#pragma once

#include "cli/args.h"
#include "gateway/server.h"

namespace tandem::cli {

// Errors name the flag: --endpoint or --model missing, a bad number, --tls-cert without --tls-key.
[[nodiscard]] Status gateway_options_from(const Args& args, gateway::GatewayOptions& o);

}  // namespace tandem::cli
