// Process sets and their communicators: the data plane each set is wired to, built alike on
// every member (shared memory, krug's TCP plane, Gloo, hierarchical or MPI).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "common/config.h"
#include "engine/control_plane.h"
#include "rendezvous/store.h"

namespace gloo::transport {
class Device;
}

namespace krug::collectives::shm {
class ShmCommunicator;
}
namespace krug::collectives::tcp {
class Device;
}

namespace krug::engine {

class ProcessSets {
 public:
  struct Set {
    std::vector<int32_t> ranks;
    int my_index = -1;  // -1: this rank is not a member
    std::unique_ptr<collectives::Communicator> comm;
  };

  // Agrees with rank 0 on KRUG_HIERARCHICAL_ALLREDUCE (through `store`), so every rank builds
  // the same communicators. `control` gives the host of every rank; `advertise` is the address
  // peers reach this rank's TCP transports at. Both outlive this object.
  ProcessSets(const Config& config, std::shared_ptr<rendezvous::Store> store,
              const ControlPlane& control, std::string advertise);
  ~ProcessSets();

  // Creates set `id` and, on its members, its communicator (a collective call on them, in the
  // same response order everywhere). Returns how this rank allreduces on it: "flat",
  // "hierarchical [0 1] [2 3]" or "" when it is not a member.
  std::string add(int32_t id, const std::vector<int32_t>& ranks);
  void remove(int32_t id) { sets_.erase(id); }
  Set* find(int32_t id);  // null for an unknown id
  // The data plane the global set uses, as the engine's Config::data_plane reports it: the
  // transport between hosts for a hierarchical set (TCP, or Gloo where asked for; its groups
  // inside a host use shared memory).
  DataPlane global_backend() const;
  // A rank whose side of every mesh is up may return from init(), finish and close its sockets
  // while a peer is still completing its side (a hierarchical set connects several meshes one
  // after another): no rank leaves init() before every rank has connected everything.
  void wait_for_every_rank_to_connect();
  // Communicators go away here, on the thread that ran their last collective.
  void clear() { sets_.clear(); }

 private:
  std::optional<bool> agree_on_hierarchical_allreduce();
  std::unique_ptr<collectives::Communicator> make_communicator(int32_t id,
                                                               const std::vector<int32_t>& ranks,
                                                               int index);
  std::unique_ptr<collectives::Communicator> make_hierarchical(
      int32_t id, const std::vector<int32_t>& ranks, int index,
      const std::vector<std::string>& hosts);
  // KRUG_CPU_OPERATIONS=tcp or gloo: TCP everywhere, no shared memory even inside a host.
  bool network_only() const {
    return requested_ == DataPlane::kGloo || requested_ == DataPlane::kTcp;
  }
  // The plane between hosts: krug's TCP plane, or Gloo's where KRUG_CPU_OPERATIONS=gloo.
  std::unique_ptr<collectives::Communicator> make_network(int32_t id, const std::string& scope,
                                                          int rank, int size);
  std::unique_ptr<collectives::Communicator> make_gloo(int32_t id, const std::string& scope,
                                                       int rank, int size);
  std::unique_ptr<collectives::Communicator> make_tcp(int32_t id, const std::string& scope,
                                                      int rank, int size);
  std::unique_ptr<collectives::shm::ShmCommunicator> make_shm(int32_t id, const std::string& scope,
                                                              int rank, int size);

  const Config& config_;
  // KRUG_CPU_OPERATIONS as the user set it (kAuto: shm or gloo per set).
  const DataPlane requested_;
  std::shared_ptr<rendezvous::Store> store_;
  const ControlPlane& control_;
  const std::string advertise_;
  // KRUG_HIERARCHICAL_ALLREDUCE as the coordinator has it (nullopt: auto).
  std::optional<bool> hierarchical_;
  std::once_flag device_once_;
  std::shared_ptr<gloo::transport::Device> device_;  // made by the first make_gloo
  std::once_flag tcp_once_;
  std::shared_ptr<collectives::tcp::Device> tcp_device_;  // made by the first make_tcp
  std::map<int32_t, Set> sets_;
};

}  // namespace krug::engine
