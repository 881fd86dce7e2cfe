// krug's rank-ordered reduce-scatter, and the allreduce and in-place allgather built on it,
// written once over a small point-to-point interface that each transport implements.
//
// Each rank owns one chunk and reduces every rank's contribution to it in rank order
// (r0 op r1 op ... op rN-1), so a result is bitwise independent of where a tensor lands in the
// fusion buffer. Chunks move in pipelined segments: every send is posted up front, and while
// step s is reduced in one scratch half, step s+1's receives land in the other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "krug/types.h"

namespace krug::collectives {

// A buffer one collective call exchanges messages in.
struct Region {
  const void* data;
  size_t bytes;
};

// The point-to-point messages of one collective call (one object per call and phase). Messages
// are grouped in steps; a receive and its matching send name the same step.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Called once before any message: every buffer a message of this call lies in (transports
  // that register memory, like Gloo's, register these), and how many steps the call has.
  virtual void begin(std::span<const Region> regions, size_t steps) = 0;
  // Posts a nonblocking receive or send; `data` lies inside one of the regions. Receives come
  // before the sends they match where possible, so a send can go straight onto the wire.
  virtual void recv(void* data, size_t bytes, int peer, size_t step) = 0;
  virtual void send(const void* data, size_t bytes, int peer, size_t step) = 0;
  // Returns once every receive of `step` has landed. The receives of at most two steps are in
  // flight at once, and those of two steps in flight together lie in different regions.
  virtual void wait_recvs(size_t step) = 0;
  // Returns once every send posted so far has completed (its buffer may be reused).
  virtual void wait_sends() = 0;
};

// offsets[i] = sizes[0] + ... + sizes[i-1]; offsets[n] is the total.
std::vector<size_t> prefix_offsets(const std::vector<size_t>& sizes);
// Allreduce's chunk of each rank: count/size elements, one more for the first count%size ranks.
std::vector<size_t> split_counts(size_t count, int size);

// Every rank's part of `data` (its bytes_per_rank at its prefix offset, already in place) is
// sent to every other rank. All receives are posted before any send.
void allgather_in_place(Exchange& exchange, void* data, const std::vector<size_t>& bytes_per_rank);

// allgatherv: places this rank's `in` at its offset in `out`, then allgather_in_place.
void allgatherv(Exchange& exchange, const void* in, void* out,
                const std::vector<size_t>& bytes_per_rank);

// alltoallv's own part: copies the send_bytes[rank] bytes this rank sends itself from `in` to
// their place in `out` (in rank order, both). Returns the prefix offsets of send_bytes and of
// recv_bytes.
std::pair<std::vector<size_t>, std::vector<size_t>> copy_own_part(
    int rank, const void* in, const std::vector<size_t>& send_bytes, void* out,
    const std::vector<size_t>& recv_bytes);

// alltoallv: send_bytes[r] bytes of `in` (consecutive, in rank order) go to rank r, and
// recv_bytes[r] bytes from rank r land in `out` (the same). All receives are posted before any
// send; one step, which every rank takes, whatever its byte counts.
void alltoallv(Exchange& exchange, const void* in, const std::vector<size_t>& send_bytes, void* out,
               const std::vector<size_t>& recv_bytes);

// Holds the scratch memory of the reduce-scatter across calls; one per communicator.
class OrderedReducer {
 public:
  // `segment_bytes`: bytes per peer per pipeline step. Scratch is 2 * size * segment_bytes at
  // most; smaller buffers get smaller segments.
  explicit OrderedReducer(size_t segment_bytes) : segment_bytes_(segment_bytes) {}

  // Reduces the chunks described by `counts` (elements per rank, laid out in rank order in
  // `in`) across ranks; writes this rank's chunk to `out`, which may alias its part of `in`.
  void reduce_scatter(Exchange& exchange, const void* in, void* out,
                      const std::vector<size_t>& counts, DataType dtype, ReduceOp op);
  // reduce_scatter over split_counts(count) in place, then allgather_in_place.
  void allreduce(Exchange& reduce_scatter, Exchange& allgather, void* data, size_t count,
                 DataType dtype, ReduceOp op);

 private:
  uint8_t* scratch_for(size_t bytes);

  size_t segment_bytes_;
  std::unique_ptr<uint8_t[]> scratch_;
  size_t scratch_size_ = 0;
};

}  // namespace krug::collectives
