#include "api/mpi_job.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "collectives/mpi/mpi_backend.h"
#include "common/log.h"
#include "common/strict_parse.h"
#include "krug/types.h"

namespace krug {
namespace {

// Rank 0's server and its address: loopback when every rank is on this host (nothing to expose
// to the network), else every interface, advertised under this host's name.
void start_server(const Config& config, bool single_host, MpiBootstrap& b) {
  b.secret = rendezvous::make_job_secret();
  b.server = std::make_unique<rendezvous::RendezvousServer>(
      single_host ? "127.0.0.1" : "", 0, b.secret,
      [rank = config.rank](const std::string& m) {
        log::at(log::Level::kWarning, rank, "rendezvous: {}", m);
      },
      net::protection_for(config.encrypt));
  b.addr = single_host ? "127.0.0.1" : config.hostname;
  b.port = b.server->port();
}

// Rank 0 starts the server and sends "ok\n<addr>\n<port>\n<secret>", or "error\n<why>" so that
// the other ranks fail with rank 0's reason instead of waiting in the broadcast forever. None of
// the strings can contain a newline (a host name, a port number, a hex secret).
void start_and_share_server(const Config& config, bool single_host, MpiBootstrap& b) {
  std::string message;
  if (config.rank == 0) {
    try {
      start_server(config, single_host, b);
      message = fmt::format("ok\n{}\n{}\n{}", b.addr, b.port, b.secret);
    } catch (const std::exception& e) {
      message = fmt::format("error\n{}", e.what());
    }
  }
  message = collectives::mpi::broadcast_from_world_root(message);
  if (message.rfind("error\n", 0) == 0)
    throw Error(fmt::format("krug: rank 0 could not start the job's rendezvous server: {}",
                            message.substr(6)));
  std::vector<std::string> parts;
  for (size_t at = 0; at <= message.size();) {
    const size_t nl = std::min(message.find('\n', at), message.size());
    parts.push_back(message.substr(at, nl - at));
    at = nl + 1;
  }
  const auto port = parts.size() == 4 ? parse_int64_strict(parts[2]) : std::nullopt;
  if (parts[0] != "ok" || !port)
    throw Error("krug: malformed rendezvous address from rank 0 over MPI");
  b.addr = parts[1];
  b.port = static_cast<int>(*port);
  b.secret = parts[3];
}

}  // namespace

bool started_by_mpirun(const Config& config, const GetEnv& getenv) {
  const GetEnv& env = getenv ? getenv : GetEnv([](const char* n) { return std::getenv(n); });
  return config.rank < 0 && env("OMPI_COMM_WORLD_SIZE") != nullptr;
}

void configure_from_mpi(Config& config, MpiBootstrap& bootstrap) {
  const auto world = collectives::mpi::world_topology();
  if (config.size >= 0 && config.size != world.size)
    throw Error(
        fmt::format("krug: KRUG_SIZE={} but mpirun started {} processes; leave KRUG_SIZE "
                    "unset under mpirun",
                    config.size, world.size));
  config.rank = world.rank;
  config.size = world.size;
  config.local_rank = world.local_rank;
  config.local_size = world.local_size;
  config.cross_rank = world.cross_rank;
  config.cross_size = world.cross_size;
  // MPI's transport sends in the clear: an encrypted job keeps krug's own planes.
  if (config.data_plane == DataPlane::kAuto && !config.encrypt) config.data_plane = DataPlane::kMpi;
  // krugrun --mpi runs the rendezvous server and passes its address; a job of one needs none.
  if (!config.rendezvous_addr.empty() || config.size == 1) return;
  if (bootstrap.port == 0)
    start_and_share_server(config, world.local_size == world.size, bootstrap);
  config.rendezvous_addr = bootstrap.addr;
  config.rendezvous_port = bootstrap.port;
  config.secret = bootstrap.secret;
}

}  // namespace krug
