// The pending nonblocking MPI operations of one communicator call, waited on with a deadline.
//
// MPI's blocking calls wait forever on a dead peer; krug's contract is that every blocking call
// has a deadline. So the MPI communicator posts MPI_Isend / MPI_Irecv (or a nonblocking
// collective) and waits here, polling MPI_Testsome: the call fails once no request has completed
// for `timeout`, naming the peers it still waits for.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace krug::collectives::mpi {

// Calls f(offset, n) for each piece of `bytes` bytes, in order, of at most `max_piece` bytes:
// MPI's counts are int, so a buffer goes as several messages.
template <typename F>
void for_each_piece(size_t bytes, size_t max_piece, F&& f) {
  for (size_t offset = 0; offset < bytes; offset += max_piece)
    f(offset, static_cast<int>(std::min(max_piece, bytes - offset)));
}

class Requests {
 public:
  // `max_message_bytes`: buffers longer than this go as several messages (MPI counts are int).
  Requests(MPI_Comm comm, size_t max_message_bytes)
      : comm_(comm), max_message_bytes_(max_message_bytes) {}
  // Pending requests are cancelled and freed (a call that throws leaves its communicator
  // unusable; this only keeps MPI from writing into buffers after the call returned).
  ~Requests();
  Requests(const Requests&) = delete;
  Requests& operator=(const Requests&) = delete;

  // Post `bytes` to / from communicator rank `peer`, in pieces of at most max_message_bytes.
  // Both sides split a buffer the same way when they agree on its length.
  void send(const void* data, size_t bytes, int peer, int tag);
  void recv(void* data, size_t bytes, int peer, int tag);
  // Adds a request posted elsewhere (a nonblocking collective); -1 = every rank.
  void add(MPI_Request request, int peer, const char* what);

  // Returns when every request completed. Throws krug::Error when MPI reports an error, or when
  // no request completed for `timeout`: "<what> on rank R of N: MPI ... " / "no progress ...".
  void wait(std::chrono::milliseconds timeout, const std::string& what, int rank, int size);
  bool empty() const { return requests_.empty(); }

 private:
  struct Info {
    int peer;          // communicator rank, -1 for a collective
    const char* kind;  // "send to", "receive from", or a collective's name
  };
  std::string pending_description() const;

  MPI_Comm comm_;
  size_t max_message_bytes_;
  std::vector<MPI_Request> requests_;  // MPI_REQUEST_NULL once complete
  std::vector<Info> info_;
};

}  // namespace krug::collectives::mpi
