// The Communicator conformance suite (tests/conformance) over the backends that can run with
// members as threads of this process: Gloo and krug's TCP plane over loopback, shared memory
// (small slots, so buffers take many steps and both allreduce paths), and the hierarchical
// communicator over Gloo groups and over TCP groups with uneven, interleaved host layouts. 1 to
// 4 members on every backend, every case; 5 to 9 on the TCP plane's trees, which change shape
// with every power of two.
// MPI runs the same cases under mpirun (tests/multiproc/mpi_communicator_test.cc).
#include "conformance/communicator_conformance.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "collectives/gloo/gloo_communicator.h"
#include "collectives/hierarchical/hierarchical_communicator.h"
#include "collectives/shm/shm_communicator.h"
#include "collectives/tcp/tcp_communicator.h"
#include "rendezvous/store.h"

namespace krug::collectives {
namespace {

using namespace std::chrono_literals;
using conformance::Association;

// A hang guard only: a broken backend fails the case with an error instead of waiting forever.
constexpr auto kTimeout = 120s;

// kTcp: the TCP plane as the engine makes it (rank order at these sizes); kTcpTree and
// kHierarchicalTcp: its trees, forced at a few members. The Sealed ones: the same, encrypted
// (KRUG_ENCRYPT=1), which must not change a bit of any result.
enum class Backend {
  kGloo,
  kShm,
  kHierarchical,
  kTcp,
  kTcpTree,
  kHierarchicalTcp,
  kTcpSealed,
  kTcpTreeSealed
};

std::string backend_name(Backend b) {
  switch (b) {
    case Backend::kGloo:
      return "gloo";
    case Backend::kShm:
      return "shm";
    case Backend::kHierarchical:
      return "hierarchical";
    case Backend::kTcp:
      return "tcp";
    case Backend::kTcpTree:
      return "tcp_tree";
    case Backend::kHierarchicalTcp:
      return "hierarchical_tcp";
    case Backend::kTcpSealed:
      return "tcp_sealed";
    case Backend::kTcpTreeSealed:
      return "tcp_tree_sealed";
  }
  return "?";
}

// Host names of the hierarchical communicator's members: uneven and interleaved from 3 on.
std::vector<std::string> hosts_of(int size) {
  static const std::vector<std::vector<std::string>> layouts = {
      {"A"}, {"A", "B"}, {"A", "B", "A"}, {"A", "B", "A", "B"}};
  return layouts[static_cast<size_t>(size - 1)];
}

Association association_of(Backend b, int size) {
  switch (b) {
    case Backend::kGloo:
    case Backend::kShm:
    case Backend::kTcp:
    case Backend::kTcpSealed:
      return conformance::rank_order(size);
    case Backend::kTcpTree:
    case Backend::kTcpTreeSealed:
      return conformance::tcp_tree(size);
    case Backend::kHierarchical:
      return {HostLayout::from_host_names(hosts_of(size)).hosts};
    case Backend::kHierarchicalTcp:
      return {HostLayout::from_host_names(hosts_of(size)).hosts, conformance::Fold::kTcpTree,
              conformance::Fold::kTcpTree};
  }
  return {};
}

struct Job {
  std::shared_ptr<rendezvous::Store> store = std::make_shared<rendezvous::InMemoryStore>();
  std::string id =
      "conf" + std::to_string(::getpid()) + "x" + std::to_string(std::random_device{}());
  int size;
};

std::unique_ptr<Communicator> gloo(const Job& job, const std::string& scope, int rank, int size,
                                   const std::shared_ptr<gloo::transport::Device>& device) {
  return std::make_unique<GlooCommunicator>(
      rank, size, std::make_shared<rendezvous::PrefixStore>(scope + "/", job.store), device,
      kTimeout);
}

std::unique_ptr<Communicator> tcp(const Job& job, const std::string& scope, int rank, int size,
                                  const std::shared_ptr<tcp::Device>& device, bool tree) {
  TcpCommunicator::Options options;
  options.timeout = kTimeout;
  options.segment_bytes = 16 << 10;  // many pipeline steps on the direct path
  if (tree) options.direct_max_members = 1;
  return std::make_unique<TcpCommunicator>(
      scope, rank, size, std::make_shared<rendezvous::PrefixStore>(scope + "/", job.store), device,
      options);
}

// Member `rank`'s communicator; collective (every member makes its own at the same time).
std::unique_ptr<Communicator> make_member(Backend b, const Job& job, int rank) {
  auto device = make_gloo_device("127.0.0.1", "");
  // Each member its own listener and the job's secret, as each process of a job has.
  const bool sealed = b == Backend::kTcpSealed || b == Backend::kTcpTreeSealed;
  auto tcp_device = std::make_shared<tcp::Device>(
      "127.0.0.1", "conformance secret", rank, tcp::kHandshakeTimeout,
      sealed ? net::Protection::kEncrypt : net::Protection::kAuthenticate);
  switch (b) {
    case Backend::kTcp:
    case Backend::kTcpTree:
    case Backend::kTcpSealed:
    case Backend::kTcpTreeSealed:
      return tcp(job, "flat", rank, job.size, tcp_device,
                 b == Backend::kTcpTree || b == Backend::kTcpTreeSealed);
    case Backend::kHierarchicalTcp:
      return std::make_unique<HierarchicalCommunicator>(
          HostLayout::from_host_names(hosts_of(job.size)), rank,
          tcp(job, "flat", rank, job.size, tcp_device, true),
          [&job, tcp_device](const std::string& scope, int r, int n) {
            return tcp(job, "hier/" + scope, r, n, tcp_device, true);
          });
    case Backend::kGloo:
      return gloo(job, "flat", rank, job.size, device);
    case Backend::kShm: {
      shm::Options options;
      options.job_id = job.id;
      options.timeout = kTimeout;
      options.slot_bytes = 16 << 10;
      options.small_allreduce_bytes = 4 << 10;
      auto comm = std::make_unique<shm::ShmCommunicator>(rank, job.size, *job.store, options);
      // As the engine does: point to point over Gloo, made on the first sendrecv.
      comm->set_point_to_point(
          [&job, rank, device] { return gloo(job, "p2p", rank, job.size, device); });
      return comm;
    }
    case Backend::kHierarchical:
      return std::make_unique<HierarchicalCommunicator>(
          HostLayout::from_host_names(hosts_of(job.size)), rank,
          gloo(job, "flat", rank, job.size, device),
          [&job, device](const std::string& scope, int r, int n) {
            return gloo(job, "hier/" + scope, r, n, device);
          });
  }
  return nullptr;
}

class Conformance : public ::testing::TestWithParam<std::tuple<Backend, int, size_t>> {};

TEST_P(Conformance, Case) {
  const auto [backend, size, index] = GetParam();
  const auto& c = conformance::cases()[index];
  const Association association = association_of(backend, size);
  Job job;
  job.size = size;
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<std::thread> members;
  for (int r = 0; r < size; ++r)
    members.emplace_back([&, r] {
      try {
        auto comm = make_member(backend, job, r);
        EXPECT_EQ(comm->rank(), r);
        EXPECT_EQ(comm->size(), size);
        c.run(*comm, association);
        comm->barrier();  // nobody tears down its end while a peer still works on it
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : members) t.join();
  for (int r = 0; r < size; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "member " << r;
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<Backend, int, size_t>>& info) {
  return backend_name(std::get<0>(info.param)) + "_np" + std::to_string(std::get<1>(info.param)) +
         "_" + conformance::cases()[std::get<2>(info.param)].name;
}

INSTANTIATE_TEST_SUITE_P(
    Backends, Conformance,
    ::testing::Combine(::testing::Values(Backend::kGloo, Backend::kShm, Backend::kHierarchical,
                                         Backend::kTcp, Backend::kTcpTree,
                                         Backend::kHierarchicalTcp),
                       ::testing::Values(1, 2, 3, 4),
                       ::testing::Range(size_t{0}, conformance::cases().size())),
    case_name);

INSTANTIATE_TEST_SUITE_P(
    Encrypted, Conformance,
    ::testing::Combine(::testing::Values(Backend::kTcpSealed, Backend::kTcpTreeSealed),
                       ::testing::Values(2, 3),
                       ::testing::Range(size_t{0}, conformance::cases().size())),
    case_name);

INSTANTIATE_TEST_SUITE_P(
    TcpTrees, Conformance,
    ::testing::Combine(::testing::Values(Backend::kTcp), ::testing::Values(5, 6, 7, 8, 9),
                       ::testing::Range(size_t{0}, conformance::cases().size())),
    case_name);

}  // namespace
}  // namespace krug::collectives
