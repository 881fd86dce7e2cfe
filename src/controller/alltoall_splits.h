// The rule an alltoall's splits follow, written once: the bindings check it locally before
// enqueueing (krug::check_alltoall_splits) and the negotiator checks every rank's splits with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace krug::controller {

// Empty when `splits` has one non-negative entry per rank of a process set of `set_size` ranks
// and they sum to `rows` (the tensor's first dimension); otherwise what is wrong, for a message.
std::string alltoall_splits_problem(std::span<const int64_t> splits, int64_t rows, size_t set_size);

}  // namespace krug::controller
