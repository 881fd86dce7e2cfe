// Adasum allreduce: adaptive summation of gradients (Maleki et al., 2020, "Scaling Distributed
// Training with Adaptive Summation").
//
// For two vectors,
//   Adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b,
// with a zero vector's coefficient taken as 1 (Adasum(0, b) = b, Adasum(0, 0) = 0). Orthogonal
// vectors are summed, identical vectors averaged. For 2^k ranks it is applied as a binary tree:
// level l combines the partial results of the rank blocks [i * 2^l, (i + 1) * 2^l) pairwise,
// the lower block's vector as `a`.
//
// The tree runs over the communicator's point-to-point calls as in the paper's recursive
// algorithm, with vector halving and distance doubling: at level l each rank exchanges half of
// its current segment with the rank 2^l away, so that it holds matching pieces of both
// operands; the piece-wise dot products and squared norms (accumulated in double) are summed
// over the 2^(l+1) ranks that together hold the whole vectors with small recursive-doubling
// allreduces of three scalars per tensor; each rank then combines its piece. After k levels
// every rank owns 1/2^k of the result, and the halvings are undone in reverse (distance
// halving allgather). Each rank sends about 2n elements in all, like a ring allreduce.
//
// A fused buffer holds several tensors: Adasum applies per tensor (dot products and norms of
// each tensor alone), so the caller passes the element count of every tensor in the buffer.
//
// Written by hand from the paper: no library offers Adasum over an arbitrary transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "krug/types.h"

namespace krug::collectives {

// Why Adasum cannot run on `dtype` over a process set of `set_size` ranks (empty if it can).
// `process_set` only names the set in the message.
std::string adasum_unsupported(DataType dtype, int set_size, int32_t process_set);

// In place over `data`, which holds consecutive tensors of `tensor_counts[i]` elements each,
// on every rank of `comm` (all ranks pass the same counts). float16, bfloat16, float32 and
// float64; throws krug::Error (adasum_unsupported's message) for anything else or a process
// set whose size is not a power of two. Results are bitwise identical on every rank and
// deterministic for a given rank count and inputs.
void adasum_allreduce(Communicator& comm, void* data, DataType dtype,
                      const std::vector<size_t>& tensor_counts, int32_t process_set = 0);

// The two-vector rule on doubles, used by the tree: returns the coefficients (ca, cb) for
// dot = a.b, anorm2 = |a|^2, bnorm2 = |b|^2.
struct AdasumCoefficients {
  double a = 1.0;
  double b = 1.0;
};
AdasumCoefficients adasum_coefficients(double dot, double anorm2, double bnorm2);

}  // namespace krug::collectives
