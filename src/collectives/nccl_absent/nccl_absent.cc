// The NCCL plane in a build without NCCL (nccl_plane.h).
#include "collectives/nccl/nccl_plane.h"

namespace krug::collectives::nccl {

bool built() {
  return false;
}
std::string build_version() {
  return "";
}
int build_version_code() {
  return 0;
}
std::string runtime_version() {
  return "";
}
bool reduces(DataType, ReduceOp) {
  return false;
}

std::unique_ptr<Communicator> make_communicator(Communicator&,
                                                std::shared_ptr<const device::Stream>,
                                                const Options&) {
  throw Error(
      "KRUG_GPU_OPERATIONS=nccl: this krug was built without NCCL; rebuild it where nccl.h and "
      "libnccl are installed (KRUG_WITH_NCCL=1, KRUG_NCCL_HOME), or use "
      "KRUG_GPU_OPERATIONS=host");
}

}  // namespace krug::collectives::nccl
