// Communicator for the ranks of a process set that share one host: data moves through one
// POSIX shared-memory segment instead of TCP.
//
// The segment holds, per member, a control block (step counters, pid) and two staging slots
// (double buffering: step s+1 fills one slot while peers still read step s from the other).
// A collective is a series of steps over the buffer in slot-sized pieces; each step, every
// member copies its piece into its slot, publishes its counter and waits for the others'.
//
// Allreduce: for small buffers every member reduces the whole piece itself from all slots (one
// synchronisation per step); for large ones each member reduces its own slice of the piece,
// writes it back into its slot, and every member copies all slices out (reduce-scatter +
// allgather, two synchronisations, n times less reduction work per member). Either way every
// element is reduced in rank order (r0 op r1 op ...), the same association as the Gloo and MPI
// communicators, so results are bitwise identical across backends and fusion layouts.
//
// Point-to-point messages (sendrecv, used by Adasum) go over a TCP communicator, made on the
// first sendrecv by a factory attached after construction (set_point_to_point). A failing
// member marks the segment aborted and wakes everyone, so peers fail within milliseconds rather
// than at the timeout; a member that dies is noticed by its pid.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/shm/shm_sync.h"
#include "transport/shm_segment.h"

namespace krug::collectives::shm {

struct Options {
  std::string job_id;                        // names the segment (see shm_segment.h)
  std::chrono::milliseconds timeout{30000};  // any one wait for a peer
  // Staging bytes per member per step. 256 KiB measured best on this project's 2-core machine
  // (16 MiB allreduce, 2 ranks: 7.1 GB/s vs 3.9-4.5 at 1 MiB and 5.9 at 64 KiB): a step's
  // slots stay in the cores' caches while peers read them (docs/benchmarks.md).
  size_t slot_bytes = size_t{256} << 10;
  // Allreduce buffers up to this size are reduced whole by every member (one sync per step).
  size_t small_allreduce_bytes = 32 * 1024;
};

class ShmCommunicator : public Communicator {
 public:
  // Collective over the `size` members that share `store`'s namespace, all on this host.
  ShmCommunicator(int rank, int size, rendezvous::Store& store, const Options& options);
  ~ShmCommunicator() override;
  // Makes the communicator sendrecv goes over, on the first sendrecv. Every member of the set
  // sends in the same operation (Adasum's exchanges), so the factory may be collective; made
  // only then, a job that never sends starts no TCP transport (Gloo's event loop wakes its
  // thread every 10 ms, which takes the core from training on a busy host). Without a
  // factory, sendrecv throws.
  using PointToPointFactory = std::function<std::unique_ptr<Communicator>()>;
  void set_point_to_point(PointToPointFactory factory) {
    make_point_to_point_ = std::move(factory);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op) override;
  bool has_allreduce_parts() const override { return true; }
  void allreduce_parts(const std::vector<FusedPart>& parts, DataType dtype, ReduceOp op,
                       double prescale, double postscale) override;
  void reducescatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes) override;
  void barrier() override;
  void sendrecv(const void* send_data, size_t send_bytes, int send_to, void* recv_data,
                size_t recv_bytes, int recv_from) override;
  const char* backend_name() const override { return "shm"; }

  // Bytes of shared memory a communicator of `size` members maps.
  static size_t segment_bytes(int size, const Options& options);

 private:
  struct Control;
  struct Header;

  Control& control(int member) const;
  Header& header() const;
  uint8_t* slot(uint32_t step, int member) const;

  // The step protocol. Each step, every member publishes `filled` (its slot holds the step's
  // data), then `reduced` (its slice of the result is in its slot), then `done` (it no longer
  // reads any slot of this step). Counters count steps, so after step s each is s + 1.
  void begin_step(const char* op);  // waits until every member is done with step s - 2
  void publish_filled();
  void publish_reduced();
  void publish_done();  // also ends the step
  // Waits until `member`'s `counter` reaches `target`; throws (after aborting) if it cannot.
  void wait_member(Counter Control::*counter, uint32_t target, int member, const char* op);
  void wait_filled(int member, const char* op);
  void wait_filled_all(const char* op);
  void wait_reduced_all(const char* op);

  // The parts path (allreduce_parts): each step gathers its piece of the parts straight into
  // this member's slot and scatters the result straight out of the slots.
  class Parts;
  void allreduce_parts_small(const Parts& parts, DataType dtype, ReduceOp op);
  void allreduce_parts_large(const Parts& parts, DataType dtype, ReduceOp op);
  // This member's slice [at, at + len) of the step at `first`, reduced into its slot.
  void reduce_own_from_inputs(const Parts& parts, size_t first, size_t at, size_t len,
                              DataType dtype, ReduceOp op);
  // The same, from the copy of its inputs already in its slot (`skip` bytes in).
  void reduce_own_from_slot(size_t skip, size_t len, DataType dtype, ReduceOp op);
  // Runs `body` and, if it throws, aborts the segment so that peers fail promptly too.
  template <typename Body>
  void guarded(const char* op, Body&& body);
  [[noreturn]] void fail(const char* op, int member, const std::string& why);
  void abort_all(const std::string& message);
  std::string check_peer(int member) const;

  int rank_;
  int size_;
  Options options_;
  std::chrono::nanoseconds spin_;
  transport::Segment segment_;
  PointToPointFactory make_point_to_point_;
  std::unique_ptr<Communicator> point_to_point_;
  std::vector<uint8_t> scratch_;  // a piece's result or own slice, when it cannot stay in a slot
  uint32_t step_ = 0;  // steps this member has begun; the same on every member between calls
};

}  // namespace krug::collectives::shm
