// krugrun --mpi: runs the job under Open MPI's mpirun (see mpi_launch.h).
#pragma once

#include "run/cli/options.h"

namespace krug::run {

// Starts the rendezvous server and mpirun, forwards mpirun's output (rank tags rewritten to
// krugrun's), and returns mpirun's exit code (128 + signal if it was killed; SIGINT / SIGTERM
// to krugrun stop mpirun, which stops its ranks). Throws krug::Error when mpirun is not on PATH.
int launch_mpi(const LaunchOptions& options);

}  // namespace krug::run
