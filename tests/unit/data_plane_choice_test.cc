// Which data plane a job gets: init() recognises a process that mpirun started, and the engine
// refuses the data planes it cannot run, with a message that says what to do. No processes:
// the environment is a fake, and the engine fails in its constructor, before any connection.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "api/mpi_job.h"
#include "collectives/mpi/mpi_backend.h"
#include "engine/engine.h"
#include "engine_test_util.h"
#include "rendezvous/store.h"

namespace krug {
namespace {

GetEnv fake_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(StartedByMpirun, OnlyWhenOpenMpiStartedItAndKrugrunGaveNoRank) {
  Config config;  // KRUG_RANK unset
  EXPECT_TRUE(started_by_mpirun(config, fake_env({{"OMPI_COMM_WORLD_SIZE", "2"}})));
  EXPECT_FALSE(started_by_mpirun(config, fake_env({})));
  config.rank = 1;  // krugrun (or the user) set KRUG_RANK: that wins
  EXPECT_FALSE(started_by_mpirun(config, fake_env({{"OMPI_COMM_WORLD_SIZE", "2"}})));
}

std::string engine_error(const std::string& cpu_operations) {
  Config c = engine::testing::rank_config(0, 2);
  c.data_plane = parse_data_plane(cpu_operations).value_or(DataPlane::kAuto);
  try {
    engine::Engine engine(c, std::make_shared<rendezvous::InMemoryStore>());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Each rank claims host hosts[r]; returns each rank's data plane for the global set, or its error.
std::vector<std::string> data_planes(const std::vector<std::string>& hosts,
                                     const std::string& cpu_operations) {
  const int size = static_cast<int>(hosts.size());
  auto store = std::make_shared<rendezvous::InMemoryStore>();
  std::vector<std::string> result(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      Config c = engine::testing::rank_config(r, size);
      c.hostname = hosts[r];
      c.data_plane = parse_data_plane(cpu_operations).value_or(DataPlane::kAuto);
      c.timeout = Seconds(5.0);
      try {
        engine::Engine engine(c, store);
        result[r] = data_plane_name(engine.config().data_plane);
        engine.shutdown();
      } catch (const Error& e) {
        result[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return result;
}

TEST(DataPlaneChoice, SharedMemoryWhenEveryRankIsOnOneHostUnlessTcpIsAskedFor) {
  EXPECT_EQ(data_planes({"a", "a", "a"}, ""), (std::vector<std::string>{"shm", "shm", "shm"}));
  EXPECT_EQ(data_planes({"a", "a"}, "shm"), (std::vector<std::string>{"shm", "shm"}));
  EXPECT_EQ(data_planes({"a", "a"}, "tcp"), (std::vector<std::string>{"tcp", "tcp"}));
  EXPECT_EQ(data_planes({"a", "a"}, "gloo"), (std::vector<std::string>{"gloo", "gloo"}));
  // Across hosts the global set is krug's TCP plane's (its groups inside a host use shared
  // memory), or Gloo's where asked for.
  EXPECT_EQ(data_planes({"a", "b"}, ""), (std::vector<std::string>{"tcp", "tcp"}));
  EXPECT_EQ(data_planes({"a", "b"}, "gloo"), (std::vector<std::string>{"gloo", "gloo"}));
}

TEST(DataPlaneChoice, SharedMemoryAskedForAcrossHostsFailsNamingTheHosts) {
  for (const std::string& error : data_planes({"a", "a", "b"}, "shm")) {
    EXPECT_NE(error.find("KRUG_CPU_OPERATIONS=shm"), std::string::npos) << error;
    EXPECT_NE(error.find("several hosts"), std::string::npos) << error;
    EXPECT_NE(error.find("a: [0 1]"), std::string::npos) << error;
  }
}

// This test process was not started by mpirun, so the MPI data plane cannot reach other ranks.
TEST(DataPlaneChoice, MpiWithoutMpirunSaysHowToStartTheJob) {
  const std::string error = engine_error("mpi");
  if (collectives::mpi::built()) {
    EXPECT_NE(error.find("not started by mpirun"), std::string::npos) << error;
    EXPECT_NE(error.find("krugrun --mpi -np 2"), std::string::npos) << error;
  } else {
    EXPECT_NE(error.find("built without the MPI backend"), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace krug
