#include "engine/process_sets.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "collectives/gloo/gloo_communicator.h"
#include "collectives/hierarchical/hierarchical_communicator.h"
#include "collectives/mpi/mpi_backend.h"
#include "collectives/shm/shm_communicator.h"
#include "collectives/tcp/tcp_communicator.h"
#include "common/log.h"

namespace krug::engine {
namespace {

// KRUG_CPU_OPERATIONS=shm cannot serve a set across hosts: the error lists its members by host.
[[noreturn]] void throw_shm_across_hosts(int32_t id, const std::vector<int32_t>& ranks,
                                         const std::vector<std::string>& hosts) {
  std::vector<std::pair<std::string, std::vector<int32_t>>> by_host;  // in order of appearance
  for (size_t i = 0; i < ranks.size(); ++i) {
    auto it = std::find_if(by_host.begin(), by_host.end(),
                           [&](const auto& entry) { return entry.first == hosts[i]; });
    if (it == by_host.end()) it = by_host.insert(by_host.end(), {hosts[i], {}});
    it->second.push_back(ranks[i]);
  }
  std::vector<std::string> parts;
  for (const auto& [host, members] : by_host)
    parts.push_back(fmt::format("{}: [{}]", host, fmt::join(members, " ")));
  throw Error(
      fmt::format("KRUG_CPU_OPERATIONS=shm: process set {} has ranks on several hosts "
                  "({}), and shared memory joins only ranks of one host; unset "
                  "KRUG_CPU_OPERATIONS (shared memory inside a host, TCP across hosts) "
                  "or set it to tcp",
                  id, fmt::join(parts, ", ")));
}

}  // namespace

ProcessSets::ProcessSets(const Config& config, std::shared_ptr<rendezvous::Store> store,
                         const ControlPlane& control, std::string advertise)
    : config_(config),
      requested_(config.data_plane),
      store_(std::move(store)),
      control_(control),
      advertise_(std::move(advertise)) {
  hierarchical_ = agree_on_hierarchical_allreduce();
}

ProcessSets::~ProcessSets() = default;

std::optional<bool> ProcessSets::agree_on_hierarchical_allreduce() {
  auto text = [](std::optional<bool> v) { return std::string(v ? (*v ? "1" : "0") : "auto"); };
  const std::string mine = text(config_.hierarchical_allreduce);
  constexpr const char* kKey = "engine/hierarchical_allreduce";
  if (config_.rank == 0) {
    store_->set(kKey, std::vector<uint8_t>(mine.begin(), mine.end()));
    return config_.hierarchical_allreduce;
  }
  const auto bytes = store_->get(kKey, whole_ms(config_.timeout));
  const std::string coordinator(bytes.begin(), bytes.end());
  if (coordinator != mine)
    log::at(log::Level::kWarning, config_.rank,
            "KRUG_HIERARCHICAL_ALLREDUCE is {} here but {} on rank 0; every rank follows rank 0",
            mine, coordinator);
  if (coordinator == "auto") return std::nullopt;
  return coordinator == "1";
}

void ProcessSets::wait_for_every_rank_to_connect() {
  if (config_.size == 1) return;
  constexpr const char *kCount = "engine/connected", *kAll = "engine/all_connected";
  if (store_->add(kCount, 1) == config_.size) store_->set(kAll, {1});
  try {
    store_->wait({kAll}, whole_ms(config_.timeout));
  } catch (const rendezvous::StoreTimeout&) {
    throw Error(
        fmt::format("rank {} ({}) timed out after {} s waiting for every rank to connect "
                    "its data plane; see the other ranks' errors (raise "
                    "KRUG_TIMEOUT_SECONDS for slow starts)",
                    config_.rank, config_.hostname, config_.timeout.count()));
  }
}

std::string ProcessSets::add(int32_t id, const std::vector<int32_t>& ranks) {
  Set set;
  set.ranks = ranks;
  auto it = std::find(ranks.begin(), ranks.end(), config_.rank);
  if (it != ranks.end()) {
    set.my_index = static_cast<int>(it - ranks.begin());
    set.comm = make_communicator(id, ranks, set.my_index);
  }
  std::string algorithm;
  if (auto* h = dynamic_cast<collectives::HierarchicalCommunicator*>(set.comm.get()))
    algorithm = "hierarchical " + h->layout().describe();
  else if (set.comm)
    algorithm = "flat";
  sets_[id] = std::move(set);
  return algorithm;
}

ProcessSets::Set* ProcessSets::find(int32_t id) {
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : &it->second;
}

DataPlane ProcessSets::global_backend() const {
  auto it = sets_.find(0);
  const auto* global = it == sets_.end() ? nullptr : it->second.comm.get();
  const DataPlane network = requested_ == DataPlane::kGloo ? DataPlane::kGloo : DataPlane::kTcp;
  if (!global || dynamic_cast<const collectives::HierarchicalCommunicator*>(global)) return network;
  return parse_data_plane(global->backend_name()).value_or(network);
}

std::unique_ptr<collectives::Communicator> ProcessSets::make_gloo(int32_t id,
                                                                  const std::string& scope,
                                                                  int rank, int size) {
  auto prefixed = std::make_shared<rendezvous::PrefixStore>(
      scope.empty() ? fmt::format("gloo/{}/", id) : fmt::format("gloo/{}/{}/", id, scope), store_);
  // Gloo carries what shared memory does not: sets across hosts, point-to-point messages. Its
  // device starts an event-loop thread that wakes every 10 ms, so it is made on first use: a
  // job whose sets all use shared memory never wakes the cores its training runs on.
  std::call_once(device_once_, [&] {
    device_ = collectives::make_gloo_device(advertise_, config_.iface);
    // The only listener of krug that takes connections without the job secret's proof
    // (docs/security.md); said once, by rank 0, for the job.
    if (config_.rank == 0)
      log::at(log::Level::kWarning, 0,
              "KRUG_CPU_OPERATIONS=gloo: Gloo's connections are not authenticated; a machine "
              "that reaches a rank's Gloo port can join its collectives. krug's default TCP "
              "plane authenticates every connection (unset KRUG_CPU_OPERATIONS)");
  });
  return std::make_unique<collectives::GlooCommunicator>(rank, size, std::move(prefixed), device_,
                                                         whole_ms(config_.timeout));
}

std::unique_ptr<collectives::Communicator> ProcessSets::make_tcp(int32_t id,
                                                                 const std::string& scope, int rank,
                                                                 int size) {
  std::string name =
      scope.empty() ? fmt::format("tcp/{}/", id) : fmt::format("tcp/{}/{}/", id, scope);
  auto prefixed = std::make_shared<rendezvous::PrefixStore>(name, store_);
  // One listener per engine, opened on first use like Gloo's device; it makes no connection
  // until a collective needs one.
  std::call_once(tcp_once_, [&] {
    tcp_device_ = std::make_shared<collectives::tcp::Device>(
        advertise_, config_.secret, config_.rank, collectives::tcp::kHandshakeTimeout,
        net::protection_for(config_.encrypt));
  });
  collectives::TcpCommunicator::Options options;
  options.timeout = whole_ms(config_.timeout);
  return std::make_unique<collectives::TcpCommunicator>(std::move(name), rank, size,
                                                        std::move(prefixed), tcp_device_, options);
}

std::unique_ptr<collectives::Communicator> ProcessSets::make_network(int32_t id,
                                                                     const std::string& scope,
                                                                     int rank, int size) {
  if (requested_ == DataPlane::kGloo) return make_gloo(id, scope, rank, size);
  return make_tcp(id, scope, rank, size);
}

std::unique_ptr<collectives::shm::ShmCommunicator> ProcessSets::make_shm(int32_t id,
                                                                         const std::string& scope,
                                                                         int rank, int size) {
  rendezvous::PrefixStore prefixed(
      scope.empty() ? fmt::format("shm/{}/", id) : fmt::format("shm/{}/{}/", id, scope), store_);
  collectives::shm::Options options;
  options.job_id = config_.job_id;
  options.timeout = whole_ms(config_.timeout);
  return std::make_unique<collectives::shm::ShmCommunicator>(rank, size, prefixed, options);
}

std::unique_ptr<collectives::Communicator> ProcessSets::make_communicator(
    int32_t id, const std::vector<int32_t>& ranks, int index) {
  if (requested_ == DataPlane::kMpi) {
    // MPI sets keep their flat rank-ordered allreduce: the hierarchical one is built from Gloo
    // groups (see docs/architecture.md).
    collectives::mpi::Options options;
    options.timeout = whole_ms(config_.timeout);
    return collectives::mpi::make_communicator(ranks, index, id, options);
  }
  const int size = static_cast<int>(ranks.size());
  std::vector<std::string> hosts;
  for (int32_t r : ranks) hosts.push_back(control_.host_of(r));
  const bool one_host = std::all_of(hosts.begin(), hosts.end(),
                                    [&](const std::string& h) { return h == hosts.front(); });
  if (!network_only() && one_host) {
    auto shm = make_shm(id, "", index, size);
    shm->set_point_to_point([this, id, index, size] { return make_tcp(id, "", index, size); });
    return shm;
  }
  if (requested_ == DataPlane::kShm) throw_shm_across_hosts(id, ranks, hosts);
  return make_hierarchical(id, ranks, index, hosts);
}

std::unique_ptr<collectives::Communicator> ProcessSets::make_hierarchical(
    int32_t id, const std::vector<int32_t>& ranks, int index,
    const std::vector<std::string>& hosts) {
  const int size = static_cast<int>(ranks.size());
  auto layout = collectives::HostLayout::from_host_names(hosts);
  auto flat = make_network(id, "", index, size);
  // Every member decides alike: the same coordinator setting, host table and member list. The
  // choice depends on the topology only, never on timing or message size, because it fixes how
  // float sums are associated (see hierarchical_communicator.h).
  const bool hierarchical = hierarchical_.value_or(true) && layout.has_hierarchy();
  const bool report = index == 0;  // one line per set, from its first member
  if (!hierarchical) {
    if (report && hierarchical_.value_or(false) && size > 1)
      log::at(log::Level::kInfo, config_.rank,
              "process set {}: KRUG_HIERARCHICAL_ALLREDUCE=1, but a hierarchical allreduce needs "
              "several hosts with two ranks on one (members by host: {}); allreduce stays flat",
              id, layout.describe());
    return flat;
  }
  if (report)
    log::at(log::Level::kInfo, config_.rank,
            "process set {}: hierarchical allreduce ({}), members by host: {}", id,
            hierarchical_ ? "KRUG_HIERARCHICAL_ALLREDUCE=1" : "auto", layout.describe());
  const bool use_shm = !network_only();
  return std::make_unique<collectives::HierarchicalCommunicator>(
      std::move(layout), index, std::move(flat),
      [&](const std::string& scope, int rank,
          int group_size) -> std::unique_ptr<collectives::Communicator> {
        // Groups inside a host exchange through shared memory; they never send point to point.
        if (use_shm && scope.rfind("local/", 0) == 0)
          return make_shm(id, "hier/" + scope, rank, group_size);
        return make_network(id, "hier/" + scope, rank, group_size);
      });
}

}  // namespace krug::engine
