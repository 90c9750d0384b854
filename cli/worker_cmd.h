// `tandem worker` (and the tandem-worker binary): one worker actor alone, what `tandem up`
// starts.
#pragma once

#include "cli/args.h"
#include "runtime/status.h"
#include "workers/actor.h"

namespace tandem::cli {

// The worker settings given in `args` (its rows of the flag table); the others keep their
// value in `options`. Errors name the flag. `tandem up` checks each worker's argv with it.
[[nodiscard]] Status worker_options_from(const Args& args, worker::WorkerOptions& options);

}  // namespace tandem::cli
