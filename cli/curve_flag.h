// --curve-keys DIR for the commands that talk to a scheduler as clients: the scheduler's
// public key from DIR/server.pub goes into the client's options.
#pragma once

#include "cli/args.h"
#include "runtime/security.h"
#include "tandem/client.h"

namespace tandem::cli {

[[nodiscard]] inline Status apply_curve_flag(const Args& args, ClientOptions& options) {
  auto dir = args.str("curve-keys");
  if (!dir) return Status::ok();
  auto keys = runtime::load_curve_keys(*dir, /*need_secret=*/false);
  if (!keys) return keys.status();
  options.curve_server_key = keys->server_public;
  return Status::ok();
}

}  // namespace tandem::cli
