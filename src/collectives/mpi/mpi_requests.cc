#include "collectives/mpi/mpi_requests.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <thread>

#include "collectives/mpi/mpi_environment.h"
#include "krug/types.h"

namespace krug::collectives::mpi {

Requests::~Requests() {
  for (size_t i = 0; i < requests_.size(); ++i) {
    if (requests_[i] == MPI_REQUEST_NULL) continue;
    // A receive that matched nothing yet is cancelled at once; one that did (or a send) may
    // not be, and is left to MPI: freeing the request does not stop the transfer.
    MPI_Cancel(&requests_[i]);
    int done = 0;
    MPI_Test(&requests_[i], &done, MPI_STATUS_IGNORE);
    if (!done) MPI_Request_free(&requests_[i]);
  }
}

void Requests::send(const void* data, size_t bytes, int peer, int tag) {
  const auto* p = static_cast<const char*>(data);
  for_each_piece(bytes, max_message_bytes_, [&](size_t offset, int n) {
    MPI_Request r;
    // MPI's C API takes a non-const buffer only for historic reasons; a send never writes it.
    check(MPI_Isend(p + offset, n, MPI_BYTE, peer, tag, comm_, &r), "MPI_Isend");
    add(r, peer, "send to");
  });
}

void Requests::recv(void* data, size_t bytes, int peer, int tag) {
  auto* p = static_cast<char*>(data);
  for_each_piece(bytes, max_message_bytes_, [&](size_t offset, int n) {
    MPI_Request r;
    check(MPI_Irecv(p + offset, n, MPI_BYTE, peer, tag, comm_, &r), "MPI_Irecv");
    add(r, peer, "receive from");
  });
}

void Requests::add(MPI_Request request, int peer, const char* what) {
  requests_.push_back(request);
  info_.push_back({peer, what});
}

std::string Requests::pending_description() const {
  // "receive from ranks 1, 3; send to rank 2" (communicator ranks, each named once).
  std::map<std::string, std::vector<int>> by_kind;
  for (size_t i = 0; i < requests_.size(); ++i) {
    if (requests_[i] == MPI_REQUEST_NULL) continue;
    auto& peers = by_kind[info_[i].kind];
    if (std::find(peers.begin(), peers.end(), info_[i].peer) == peers.end())
      peers.push_back(info_[i].peer);
  }
  std::string text;
  for (auto& [kind, peers] : by_kind) {
    std::sort(peers.begin(), peers.end());
    if (!text.empty()) text += "; ";
    if (peers.size() == 1 && peers[0] < 0) {
      text += fmt::format("{} (every rank)", kind);
      continue;
    }
    text += fmt::format("{} rank{} ", kind, peers.size() > 1 ? "s" : "");
    for (size_t i = 0; i < peers.size(); ++i) text += fmt::format("{}{}", i ? ", " : "", peers[i]);
  }
  return text;
}

void Requests::wait(std::chrono::milliseconds timeout, const std::string& what, int rank,
                    int size) {
  using Clock = std::chrono::steady_clock;
  const int count = static_cast<int>(requests_.size());
  std::vector<int> indices(requests_.size());
  int left = static_cast<int>(std::count_if(requests_.begin(), requests_.end(),
                                            [](MPI_Request r) { return r != MPI_REQUEST_NULL; }));
  auto deadline = Clock::now() + timeout;
  while (left > 0) {
    int completed = 0;
    const int rc =
        MPI_Testsome(count, requests_.data(), &completed, indices.data(), MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS)
      throw Error(fmt::format("mpi {} failed on rank {} of {} ({}): {}", what, rank, size,
                              pending_description(), error_string(rc)));
    if (completed == MPI_UNDEFINED) break;  // nothing active is left
    if (completed > 0) {
      left -= completed;
      deadline = Clock::now() + timeout;  // a peer that makes progress is alive
      continue;
    }
    if (Clock::now() >= deadline)
      throw Error(fmt::format(
          "mpi {} timed out on rank {} of {} (ranks of this process set): no progress for {} ms "
          "while waiting to {} (KRUG_TIMEOUT_SECONDS); a peer may have died or stopped calling",
          what, rank, size, timeout.count(), pending_description()));
    // Open MPI progresses transfers only inside its calls, so this polls; yielding keeps an
    // oversubscribed host (more ranks than cores) moving.
    std::this_thread::yield();
  }
  requests_.clear();
  info_.clear();
}

}  // namespace krug::collectives::mpi
