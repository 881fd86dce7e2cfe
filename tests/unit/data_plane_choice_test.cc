// Which data plane a job gets: init() recognises a process that mpirun started, and the engine
// refuses the data planes it cannot run, with a message that says what to do. No processes:
// the environment is a fake, and the engine fails in its constructor, before any connection.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

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
  c.cpu_operations = cpu_operations;
  try {
    engine::Engine engine(c, std::make_shared<rendezvous::InMemoryStore>());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DataPlaneChoice, SharedMemoryIsRejectedAsNotInThisBuild) {
  const std::string error = engine_error("shm");
  EXPECT_NE(error.find("KRUG_CPU_OPERATIONS=shm"), std::string::npos) << error;
  EXPECT_NE(error.find("not in this build"), std::string::npos) << error;
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
