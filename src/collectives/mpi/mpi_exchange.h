// The ordered collectives' point-to-point messages (collectives/ordered_reduce.h) over
// MPI_Isend / MPI_Irecv, waited on with a deadline (mpi_requests.h).
#pragma once

#include <mpi.h>

#include <chrono>
#include <string>

#include "collectives/mpi/mpi_requests.h"
#include "collectives/ordered_reduce.h"

namespace krug::collectives::mpi {

class MpiExchange : public Exchange {
 public:
  // `tag` marks every message of the call; `what` names it in errors ("reduce-scatter on rank
  // R of N: ...").
  MpiExchange(MPI_Comm comm, int rank, int size, size_t max_message_bytes,
              std::chrono::milliseconds timeout, int tag, std::string what)
      : rank_(rank),
        size_(size),
        timeout_(timeout),
        tag_(tag),
        what_(std::move(what)),
        sends_(comm, max_message_bytes),
        recvs_{Requests(comm, max_message_bytes), Requests(comm, max_message_bytes)} {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // MPI needs no registration, and one tag serves every step: messages of one (peer, tag)
  // match in the order they were posted (MPI's non-overtaking rule), so step s's segment never
  // lands in step s+1's buffer.
  void begin(std::span<const Region>, size_t) override {}
  void recv(void* data, size_t bytes, int peer, size_t step) override {
    recvs_[step % 2].recv(data, bytes, peer, tag_);
  }
  void send(const void* data, size_t bytes, int peer, size_t) override {
    sends_.send(data, bytes, peer, tag_);
  }
  // At most two steps' receives are in flight (Exchange's contract): one Requests for each.
  void wait_recvs(size_t step) override { recvs_[step % 2].wait(timeout_, what_, rank_, size_); }
  void wait_sends() override { sends_.wait(timeout_, what_, rank_, size_); }

 private:
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  int tag_;
  std::string what_;
  Requests sends_;
  Requests recvs_[2];
};

}  // namespace krug::collectives::mpi
