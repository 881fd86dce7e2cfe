// krugrun's elastic driver (docs/elastic.md): runs the host discovery script, starts a worker
// per usable slot, forms rendezvous rounds (each worker's init() asks for its rank in the next
// one), blacklists hosts whose workers fail or straggle, and ends the job when the workers
// finish, a limit is hit or krugrun is interrupted.
#pragma once

#include "run/cli/options.h"

namespace krug::run {

// Runs an elastic job to its end; returns krugrun's exit code (0 when the workers finished).
int run_elastic(const LaunchOptions& options);

}  // namespace krug::run
