// The MPI backend's entry points in a build without MPI (KRUG_WITH_MPI=OFF, or MPI not found
// at configure time): each says how to get the backend, so callers need no #ifdef.
#include <fmt/format.h>

#include "collectives/mpi/mpi_backend.h"
#include "krug/types.h"

namespace krug::collectives::mpi {
namespace {

[[noreturn]] void not_built(const std::string& what) {
  throw Error(fmt::format(
      "{}: this krug was built without the MPI backend. Install Open MPI (Debian: "
      "libopenmpi-dev openmpi-bin, see scripts/install-deps) and configure again with "
      "-DKRUG_WITH_MPI=AUTO or ON; or start the job with krugrun and KRUG_CPU_OPERATIONS=gloo",
      what));
}

}  // namespace

bool built() {
  return false;
}

void pin_lifetime() {}

bool thread_multiple() {
  return false;
}

WorldTopology world_topology() {
  not_built("this process was started by mpirun (OMPI_COMM_WORLD_SIZE is set)");
}

std::string broadcast_from_world_root(const std::string&) {
  not_built("this process was started by mpirun (OMPI_COMM_WORLD_SIZE is set)");
}

void require_world(int, int) {
  not_built("KRUG_CPU_OPERATIONS=mpi");
}

std::unique_ptr<Communicator> make_communicator(const std::vector<int32_t>&, int, int,
                                                const Options&) {
  not_built("KRUG_CPU_OPERATIONS=mpi");
}

}  // namespace krug::collectives::mpi
