// MPI_COMM_WORLD as krug's job: topology, a broadcast for bootstrapping, and the check that the
// world is the job krug was configured with.
#include <fmt/format.h>

#include <cstdlib>

#include "collectives/mpi/mpi_backend.h"
#include "collectives/mpi/mpi_environment.h"
#include "krug/types.h"

namespace krug::collectives::mpi {
namespace {

// A communicator freed when it goes out of scope.
class OwnedComm {
 public:
  OwnedComm() = default;
  ~OwnedComm() {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  OwnedComm(const OwnedComm&) = delete;
  OwnedComm& operator=(const OwnedComm&) = delete;
  MPI_Comm* out() { return &comm_; }
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// A private duplicate of MPI_COMM_WORLD, so krug's bootstrap messages never match a program's
// own traffic on MPI_COMM_WORLD, with errors returned rather than fatal.
void dup_world(OwnedComm& comm) {
  check(MPI_Comm_dup(MPI_COMM_WORLD, comm.out()), "MPI_Comm_dup of MPI_COMM_WORLD");
  MPI_Comm_set_errhandler(comm.get(), MPI_ERRORS_RETURN);
}

}  // namespace

WorldTopology world_topology() {
  Environment::get().ensure_initialized();
  OwnedComm world;
  dup_world(world);
  WorldTopology t;
  check(MPI_Comm_rank(world.get(), &t.rank), "MPI_Comm_rank");
  check(MPI_Comm_size(world.get(), &t.size), "MPI_Comm_size");
  OwnedComm local, cross;
  check(MPI_Comm_split_type(world.get(), MPI_COMM_TYPE_SHARED, t.rank, MPI_INFO_NULL, local.out()),
        "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  check(MPI_Comm_rank(local.get(), &t.local_rank), "MPI_Comm_rank");
  check(MPI_Comm_size(local.get(), &t.local_size), "MPI_Comm_size");
  // Hosts in the order of their first rank, as krugrun numbers them.
  check(MPI_Comm_split(world.get(), t.local_rank, t.rank, cross.out()), "MPI_Comm_split");
  check(MPI_Comm_rank(cross.get(), &t.cross_rank), "MPI_Comm_rank");
  check(MPI_Comm_size(cross.get(), &t.cross_size), "MPI_Comm_size");
  return t;
}

std::string broadcast_from_world_root(const std::string& value) {
  Environment::get().ensure_initialized();
  OwnedComm world;
  dup_world(world);
  unsigned long long length = value.size();
  check(MPI_Bcast(&length, 1, MPI_UNSIGNED_LONG_LONG, 0, world.get()), "MPI_Bcast");
  std::string out = value;
  out.resize(length);
  // Bootstrap strings (an address, a port, a secret): far below MPI's int count limit.
  if (length > 0)
    check(MPI_Bcast(out.data(), static_cast<int>(length), MPI_CHAR, 0, world.get()), "MPI_Bcast");
  return out;
}

void require_world(int rank, int size) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr)
    throw Error(fmt::format(
        "KRUG_CPU_OPERATIONS=mpi on rank {} of {}: this process was not started by mpirun, so "
        "MPI cannot reach the other ranks. Start the job with `krugrun --mpi -np {} ...` or "
        "`mpirun -np {} ...`, or use KRUG_CPU_OPERATIONS=gloo",
        rank, size, size, size));
  Environment::get().ensure_initialized();
  int world_rank = -1, world_size = -1;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &world_size), "MPI_Comm_size");
  if (world_rank != rank || world_size != size)
    throw Error(fmt::format(
        "KRUG_CPU_OPERATIONS=mpi: krug is rank {} of {} but MPI_COMM_WORLD says rank {} of {}. "
        "With the MPI backend mpirun must start every rank and krug takes the ranks from it: "
        "do not set KRUG_RANK/KRUG_SIZE yourself (start with `krugrun --mpi` or `mpirun`)",
        rank, size, world_rank, world_size));
}

}  // namespace krug::collectives::mpi
