#include "collectives/mpi/mpi_communicator.h"

#include <fmt/format.h>

#include <memory>
#include <string_view>
#include <utility>

#include "collectives/mpi/mpi_environment.h"
#include "collectives/mpi/mpi_exchange.h"
#include "collectives/mpi/mpi_requests.h"

namespace krug::collectives::mpi {
namespace {

// Each kind of exchange has its own tag: calls complete before the next starts, so this is not
// needed for matching, but it keeps a stray message from a failed call from matching another.
constexpr int kTagReduceScatter = 1;
constexpr int kTagAllgather = 2;
constexpr int kTagAlltoall = 3;
constexpr int kTagPointToPoint = 4;

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, const Options& options)
    : ExchangeCommunicator(options.segment_bytes), comm_(comm), options_(options) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

void MpiCommunicator::guarded(const char* what, const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    // Messages from Requests already name the call and the rank; others (a failed MPI_Isend)
    // get them here.
    if (std::string_view(e.what()).rfind("mpi ", 0) == 0) throw;
    throw Error(fmt::format("mpi {} failed on rank {} of {}: {}", what, rank_, size_, e.what()));
  }
}

std::unique_ptr<Exchange> MpiCommunicator::exchange(Phase phase) {
  const auto [tag, what] = [&]() -> std::pair<int, const char*> {
    switch (phase) {
      case Phase::kReduceScatter:
        return {kTagReduceScatter, "reduce-scatter"};
      case Phase::kAllgather:
        return {kTagAllgather, "allgather"};
      case Phase::kAlltoall:
        break;
    }
    return {kTagAlltoall, "alltoall"};
  }();
  return std::make_unique<MpiExchange>(comm_, rank_, size_, options_.max_message_bytes,
                                       options_.timeout, tag, what);
}

void MpiCommunicator::broadcast(void* data, size_t bytes, int root) {
  if (bytes == 0 || size_ == 1) return;
  guarded("broadcast", [&] {
    auto* p = static_cast<char*>(data);
    // One MPI_Ibcast per piece: its count is an int.
    for_each_piece(bytes, options_.max_message_bytes, [&](size_t offset, int n) {
      Requests requests(comm_, options_.max_message_bytes);
      MPI_Request r;
      check(MPI_Ibcast(p + offset, n, MPI_BYTE, root, comm_, &r), "MPI_Ibcast");
      requests.add(r, -1, "broadcast with");
      requests.wait(options_.timeout, "broadcast", rank_, size_);
    });
  });
}

void MpiCommunicator::barrier() {
  if (size_ == 1) return;
  guarded("barrier", [&] {
    Requests requests(comm_, options_.max_message_bytes);
    MPI_Request r;
    check(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
    requests.add(r, -1, "barrier with");
    requests.wait(options_.timeout, "barrier", rank_, size_);
  });
}

void MpiCommunicator::sendrecv(const void* send_data, size_t send_bytes, int send_to,
                               void* recv_data, size_t recv_bytes, int recv_from) {
  if (sendrecv_with_self(send_data, send_bytes, send_to, recv_data, recv_bytes, recv_from)) return;
  const std::string what =
      "point-to-point " + describe_sendrecv(send_bytes, send_to, recv_bytes, recv_from);
  guarded(what.c_str(), [&] {
    Requests requests(comm_, options_.max_message_bytes);
    if (recv_from >= 0 && recv_bytes > 0)
      requests.recv(recv_data, recv_bytes, recv_from, kTagPointToPoint);
    if (send_to >= 0 && send_bytes > 0)
      requests.send(send_data, send_bytes, send_to, kTagPointToPoint);
    requests.wait(options_.timeout, what, rank_, size_);
  });
}

std::unique_ptr<Communicator> make_communicator(const std::vector<int32_t>& world_ranks, int index,
                                                int tag, const Options& options) {
  Environment::get().ensure_initialized();
  MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  check(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group");
  const std::vector<int> ranks(world_ranks.begin(), world_ranks.end());
  int rc = MPI_Group_incl(world_group, static_cast<int>(ranks.size()), ranks.data(), &group);
  MPI_Group_free(&world_group);
  check(rc, "MPI_Group_incl");
  MPI_Comm comm = MPI_COMM_NULL;
  // Only members call it, unlike MPI_Comm_split: ranks outside a process set never learn of its
  // communicator. Tags must be below MPI_TAG_UB (at least 32767).
  rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag & 0x7fff, &comm);
  MPI_Group_free(&group);
  check(rc, fmt::format("MPI_Comm_create_group for {} ranks", ranks.size()));
  auto communicator = std::make_unique<MpiCommunicator>(comm, options);
  if (communicator->rank() != index || communicator->size() != static_cast<int>(ranks.size()))
    throw Error(fmt::format("MPI_Comm_create_group made rank {} of {}, expected {} of {}",
                            communicator->rank(), communicator->size(), index, ranks.size()));
  return communicator;
}

}  // namespace krug::collectives::mpi
