// init() in a process that mpirun started without krugrun (or through `krugrun --mpi`, which
// cannot give each rank its own KRUG_RANK): the job's shape comes from MPI_COMM_WORLD.
#pragma once

#include <memory>
#include <string>

#include "common/config.h"
#include "rendezvous/server.h"

namespace krug {

// True when Open MPI's launcher started this process (OMPI_COMM_WORLD_SIZE is set) and nobody
// set KRUG_RANK: the ranks then come from MPI.
bool started_by_mpirun(const Config& config, const GetEnv& getenv = {});

// What an mpirun-started process keeps from one init() to the next: under a plain mpirun,
// rank 0 serves the job's rendezvous store itself, for the life of the process.
struct MpiBootstrap {
  std::unique_ptr<rendezvous::RendezvousServer> server;  // rank 0 only
  std::string addr;
  int port = 0;
  std::string secret;
};

// Collective over MPI_COMM_WORLD (every rank's init() calls it). Sets rank, size, local and
// cross rank/size from MPI; an unset KRUG_CPU_OPERATIONS becomes mpi (as under horovodrun's
// MPI mode). Without a rendezvous address (plain mpirun), rank 0 starts a rendezvous server
// with a fresh job secret on the first call and broadcasts its address, port and secret;
// later calls reuse it.
void configure_from_mpi(Config& config, MpiBootstrap& bootstrap);

}  // namespace krug
