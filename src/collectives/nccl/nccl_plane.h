// The NCCL data plane (DESIGN.md: collectives/nccl): a Communicator whose buffers are device
// memory and whose collectives run on krug's CUDA stream. Every call returns once the stream has
// finished the work (or throws); a peer that dies or a deadline that passes aborts the NCCL
// communicator (ncclCommAbort), so nothing waits forever.
//
// This header names no NCCL type: without NCCL, src/collectives/nccl_absent provides the same
// functions (built() false, make_communicator() throwing), and the engine needs no #ifdef.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "device/device.h"
#include "krug/types.h"

namespace krug::collectives::nccl {

// Whether this build has the NCCL plane; the NCCL version it was built against ("2.28.9", and
// as nccl.h's NCCL_VERSION_CODE: 22809; 0 when not built) and the one loaded at run time (empty
// when not built or not loadable).
bool built();
std::string build_version();
int build_version_code();
std::string runtime_version();

// Whether NCCL reduces `dtype` with `op` itself (it has no int16 or bool, and no Adasum); the
// engine stages other reductions through the CPU data plane.
bool reduces(DataType dtype, ReduceOp op);

struct Options {
  double timeout_seconds = 30.0;  // every collective and the communicator's creation
  // Set as NCCL_HOSTID before the communicator is made (NCCL 2.28 refuses two ranks of one
  // communicator on one GPU unless each looks like its own host); empty leaves it alone.
  std::string host_id;
};

// The size of ncclUniqueId, which rank 0 makes and every rank needs.
constexpr size_t kUniqueIdBytes = 128;

// An NCCL communicator over the ranks of `bootstrap` (same ranks, same order). Rank 0's unique
// id reaches the others through bootstrap.broadcast(), krug's authenticated data plane, so a
// process outside the job cannot learn it from krug. Collective: every rank of `bootstrap` calls
// it at the same point. Its collectives run on `stream`, on that stream's device.
std::unique_ptr<Communicator> make_communicator(Communicator& bootstrap,
                                                std::shared_ptr<const device::Stream> stream,
                                                const Options& options);

}  // namespace krug::collectives::nccl
