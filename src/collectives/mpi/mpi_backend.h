// The MPI backend as the rest of krug sees it. No MPI type crosses this header, so the engine and
// init() compile the same with or without MPI: without it (KRUG_WITH_MPI=OFF, or no
// libopenmpi-dev), src/collectives/mpi_absent/ provides these functions, each throwing an error
// that says how to get the backend.
//
// MPI_COMM_WORLD ranks are krug's global ranks: a job runs on MPI only when mpirun started every
// rank (`krugrun --mpi`, or `mpirun` directly).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace krug::collectives::mpi {

// Whether this build has the MPI backend.
bool built();

// Constructs the process's MPI lifetime owner (it initializes MPI only on first use). Its
// destructor finalizes MPI at process exit if krug initialized it; calling this before another
// function-local static is constructed makes MPI outlive that static (see mpi_environment.h).
void pin_lifetime();

// Whether MPI is initialized with MPI_THREAD_MULTIPLE.
bool thread_multiple();

// Where this process sits in MPI_COMM_WORLD; local = same host (MPI_COMM_TYPE_SHARED), cross =
// the processes with the same local rank. Initializes MPI if needed. Collective: every process
// of MPI_COMM_WORLD calls it.
struct WorldTopology {
  int rank = 0, size = 1, local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
};
WorldTopology world_topology();

// Collective over MPI_COMM_WORLD: every rank returns rank 0's `value`.
std::string broadcast_from_world_root(const std::string& value);

// Throws krug::Error unless MPI_COMM_WORLD is the job krug was configured with (`rank` of
// `size`): KRUG_CPU_OPERATIONS=mpi in ranks that mpirun did not start gets a clear error here
// instead of a hang. Initializes MPI if mpirun started this process and nobody did yet.
void require_world(int rank, int size);

struct Options {
  // Deadline of each call; a peer silent for this long makes the call throw.
  std::chrono::milliseconds timeout{30000};
  // Largest single MPI message: MPI counts are `int`, so longer buffers travel in pieces.
  size_t max_message_bytes = size_t{1} << 30;
  // Bytes per peer per pipeline step of the reduce-scatter (bounds its scratch memory).
  size_t segment_bytes = size_t{1} << 20;
};

// A communicator over the MPI_COMM_WORLD ranks `world_ranks` (sorted, distinct), for the member
// at `index`. Only members call it (MPI_Comm_create_group); members create the communicators
// of their sets in the same order. `tag` tells apart creations that may overlap in time on
// different ranks (the process set id does).
std::unique_ptr<Communicator> make_communicator(const std::vector<int32_t>& world_ranks, int index,
                                                int tag, const Options& options);

}  // namespace krug::collectives::mpi
