// `tandem scheduler` (and the tandem-scheduler binary): the scheduler actor alone, what
// `tandem up` starts.
#pragma once

#include "cli/args.h"
#include "runtime/status.h"
#include "scheduler/actor.h"

namespace tandem::cli {

// The scheduler settings given in `args` (its rows of the flag table); the others keep their
// value in `options`. Errors name the flag. `tandem up` checks its scheduler's argv with it.
[[nodiscard]] Status scheduler_options_from(const Args& args, scheduler::ActorOptions& options);

}  // namespace tandem::cli
