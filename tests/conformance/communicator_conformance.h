// One conformance suite for every Communicator (collectives/communicator.h): the same cases run
// over Gloo, shared memory and hierarchical communicators with ranks as threads
// (tests/unit/communicator_conformance_test.cc) and over MPI with ranks as mpirun's processes
// (tests/multiproc/mpi_communicator_test.cc). A case is collective: every member of the
// communicator calls it, in the same order, and checks its own results with gtest's
// non-fatal EXPECTs (a fatal one would leave the other members waiting in a collective).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "krug/types.h"

namespace krug::collectives::conformance {

// How partial results combine: a left fold in order, or the tree of krug's TCP plane
// (src/collectives/tcp/tcp_algorithms.h; rebuilt independently here).
enum class Fold { kLeft, kTcpTree };

// How a backend associates allreduce's reduction: the left fold of each group's members, then
// the groups' results combined `across`. Gloo, MPI and shared memory promise rank order, one
// group of every member; the TCP plane its tree over members; the hierarchical communicator
// folds inside each host, then over the hosts as its cross-host groups do. `flat`: how the
// set's flat communicator, which carries reducescatter, combines the members.
struct Association {
  std::vector<std::vector<int>> groups;
  Fold across = Fold::kLeft;
  Fold flat = Fold::kLeft;
};

Association rank_order(int size);
// The TCP plane's tree over `size` members.
Association tcp_tree(int size);

struct Case {
  const char* name;
  void (*run)(Communicator& comm, const Association& association);
};

// Every case, in the order every member runs them.
const std::vector<Case>& cases();

// Member r's input of `count` elements of `dtype`: small integers (exact in every dtype) or,
// for float32 / float64, full-mantissa values of varied magnitude whose sums round differently
// when re-associated. Reproducible on every member without communication.
std::vector<uint8_t> input(int member, DataType dtype, size_t count);

// Every member's input reduced with `op` in `association`'s order, by krug's own kernels.
std::vector<uint8_t> reference(DataType dtype, ReduceOp op, size_t count,
                               const Association& association);

}  // namespace krug::collectives::conformance
