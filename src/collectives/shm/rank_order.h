// The association every backend reduces in: dst = sources(0) op sources(1) op ... op
// sources(size - 1), element-wise in rank order, so results are bitwise the same whichever
// shared-memory path (communicator or direct lane) computed them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "krug/types.h"
#include "reduce/reduce.h"

namespace krug::collectives::shm {

// `dst` may be sources(0) or sources(1); `size` >= 2.
template <typename Sources>
void reduce_in_rank_order(DataType dtype, ReduceOp op, uint8_t* dst, int size, size_t count,
                          Sources&& sources) {
  reduce::reduce(dtype, op, dst, sources(0), sources(1), count);
  for (int m = 2; m < size; ++m) reduce::reduce_into(dtype, op, dst, sources(m), count);
}

}  // namespace krug::collectives::shm
