#include "controller/alltoall_splits.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

namespace krug::controller {

std::string alltoall_splits_problem(std::span<const int64_t> splits, int64_t rows,
                                    size_t set_size) {
  const int64_t total = std::accumulate(splits.begin(), splits.end(), int64_t{0});
  const bool negative = std::any_of(splits.begin(), splits.end(), [](int64_t s) { return s < 0; });
  if (splits.size() == set_size && total == rows && !negative) return {};
  return fmt::format(
      "splits [{}] must have one non-negative entry per rank of the process set ({}) summing to "
      "the first dimension ({})",
      fmt::join(splits, ", "), set_size, rows);
}

}  // namespace krug::controller
