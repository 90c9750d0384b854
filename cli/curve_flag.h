// --curve-keys DIR for the commands that talk to a scheduler as clients: the scheduler's
// public key from DIR/server.pub goes into the client's options; --client-key FILE (NAME.key)
// adds the client's own key pair, its credential on the scheduler's --client-keys list.
#pragma once

#include "cli/args.h"
#include "runtime/security.h"
#include "tandem/client.h"

namespace tandem::cli {

[[nodiscard]] inline Status apply_curve_flag(const Args& args, ClientOptions& options) {
  auto dir = args.str("curve-keys");
  if (!dir) return args.str("client-key") ? Status::invalid("--client-key needs --curve-keys") : Status::ok();
  auto keys = runtime::load_curve_keys(*dir, /*need_secret=*/false);
  if (!keys) return keys.status();
  options.curve_server_key = keys->server_public;
  if (auto path = args.str("client-key")) {
    auto own = runtime::load_key_pair(*path);
    if (!own) return Status::invalid("--client-key: " + own.status().message());
    options.curve_public_key = own->client_public;
    options.curve_secret_key = own->client_secret;
  }
  return Status::ok();
}

}  // namespace tandem::cli
