#include "common/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "krug/types.h"

namespace krug {
namespace {

using Env = std::map<std::string, std::string>;

Config load(const Env& env) {
  return load_config([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// The message of the Error that loading `env` throws ("" and a failure if none is thrown).
std::string error_of(const Env& env) {
  try {
    load(env);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

TEST(ConfigTest, DefaultsWhenNothingIsSet) {
  const Config c = load({});
  const Config d;
  EXPECT_EQ(c.fusion_threshold_bytes, 128 * 1024 * 1024);
  EXPECT_EQ(c.cycle_time, d.cycle_time);
  EXPECT_EQ(c.cycle_time, Milliseconds(1.0));
  EXPECT_EQ(c.busy_poll, std::chrono::microseconds(50));
  EXPECT_EQ(c.cache_capacity, d.cache_capacity);
  EXPECT_EQ(c.timeout, d.timeout);
  EXPECT_EQ(c.timeout, Seconds(30.0));
  EXPECT_EQ(c.timeline_path, "");
  EXPECT_TRUE(c.timeline_mark_cycles);
  EXPECT_EQ(c.stall_check_time, d.stall_check_time);
  EXPECT_EQ(c.stall_shutdown_time.count(), 0);
  EXPECT_FALSE(c.stall_check_disable);
  EXPECT_EQ(c.log_level, "warning");
  EXPECT_EQ(c.data_plane, DataPlane::kAuto)
      << "unset: init() picks mpi under mpirun, shm or gloo otherwise";
  EXPECT_EQ(c.hierarchical_allreduce, std::nullopt) << "auto";
  EXPECT_EQ(c.rank, -1);
  EXPECT_EQ(c.size, -1);
  EXPECT_EQ(c.local_rank, -1);
  EXPECT_EQ(c.cross_size, -1);
  EXPECT_EQ(c.rendezvous_port, 0);
  EXPECT_EQ(c.secret, "");
  EXPECT_FALSE(c.hostname.empty()) << "defaults to gethostname()";
}

TEST(ConfigTest, EveryTypeParses) {
  const Config c = load({
      {"KRUG_FUSION_THRESHOLD", "4096"},
      {"KRUG_CYCLE_TIME", "2.5"},
      {"KRUG_CACHE_CAPACITY", "0"},
      {"KRUG_BUSY_POLL_MICROSECONDS", "7"},
      {"KRUG_TIMEOUT_SECONDS", "5e-1"},
      {"KRUG_TIMELINE", "/tmp/trace.json"},
      {"KRUG_TIMELINE_MARK_CYCLES", "yes"},
      {"KRUG_STALL_CHECK_TIME_SECONDS", "10"},
      {"KRUG_STALL_SHUTDOWN_TIME_SECONDS", "20.5"},
      {"KRUG_STALL_CHECK_DISABLE", "on"},
      {"KRUG_LOG_LEVEL", "DEBUG"},
      {"KRUG_CPU_OPERATIONS", "Mpi"},
      {"KRUG_GLOO_IFACE", "eth0"},
      {"KRUG_HIERARCHICAL_ALLREDUCE", "1"},
      {"KRUG_RANK", "3"},
      {"KRUG_SIZE", "4"},
      {"KRUG_LOCAL_RANK", "1"},
      {"KRUG_LOCAL_SIZE", "2"},
      {"KRUG_CROSS_RANK", "1"},
      {"KRUG_CROSS_SIZE", "2"},
      {"KRUG_HOSTNAME", "node-7"},
      {"KRUG_RENDEZVOUS_ADDR", "10.0.0.1"},
      {"KRUG_RENDEZVOUS_PORT", "29500"},
      {"KRUG_SECRET", "s3cr3t"},
      {"KRUG_GPU_OPERATIONS", "Host"},
      {"KRUG_GPU_SHARE_DEVICE", "true"},
      {"KRUG_START_TIMEOUT", "4.5"},
  });
  EXPECT_EQ(c.fusion_threshold_bytes, 4096);
  EXPECT_DOUBLE_EQ(c.cycle_time.count(), 2.5);
  EXPECT_EQ(whole_ms(c.cycle_time), std::chrono::milliseconds(2));
  EXPECT_EQ(c.busy_poll, std::chrono::microseconds(7));
  EXPECT_EQ(c.cache_capacity, 0);
  EXPECT_DOUBLE_EQ(c.timeout.count(), 0.5);
  EXPECT_EQ(whole_ms(c.timeout), std::chrono::milliseconds(500));
  EXPECT_EQ(c.timeline_path, "/tmp/trace.json");
  EXPECT_TRUE(c.timeline_mark_cycles);
  EXPECT_DOUBLE_EQ(c.stall_check_time.count(), 10);
  EXPECT_DOUBLE_EQ(c.stall_shutdown_time.count(), 20.5);
  EXPECT_TRUE(c.stall_check_disable);
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.data_plane, DataPlane::kMpi) << "parsed; the engine checks mpirun started the job";
  EXPECT_EQ(c.iface, "eth0");
  EXPECT_EQ(c.hierarchical_allreduce, std::optional<bool>(true));
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.size, 4);
  EXPECT_EQ(c.local_rank, 1);
  EXPECT_EQ(c.local_size, 2);
  EXPECT_EQ(c.cross_rank, 1);
  EXPECT_EQ(c.cross_size, 2);
  EXPECT_EQ(c.hostname, "node-7");
  EXPECT_EQ(c.rendezvous_addr, "10.0.0.1");
  EXPECT_EQ(c.rendezvous_port, 29500);
  EXPECT_EQ(c.secret, "s3cr3t");
  EXPECT_EQ(c.gpu_operations, "host");
  EXPECT_TRUE(c.gpu_share_device);
  EXPECT_DOUBLE_EQ(c.start_timeout.count(), 4.5);
}

TEST(ConfigTest, BadValuesNameTheVariableTheValueAndWhatIsAccepted) {
  const std::pair<std::string, std::string> cases[] = {
      {"KRUG_FUSION_THRESHOLD", "12x"},  {"KRUG_FUSION_THRESHOLD", ""},
      {"KRUG_FUSION_THRESHOLD", "-1"},   {"KRUG_FUSION_THRESHOLD", " 12"},
      {"KRUG_FUSION_THRESHOLD", "64MB"}, {"KRUG_FUSION_THRESHOLD", "99999999999999999999"},
      {"KRUG_CYCLE_TIME", "0"},          {"KRUG_CYCLE_TIME", "1e400"},
      {"KRUG_CYCLE_TIME", "fast"},       {"KRUG_CYCLE_TIME", "nan"},
      {"KRUG_CYCLE_TIME", "inf"},        {"KRUG_CYCLE_TIME", "1.5ms"},
      {"KRUG_TIMEOUT_SECONDS", "-3"},    {"KRUG_STALL_CHECK_TIME_SECONDS", "-1"},
      {"KRUG_CACHE_CAPACITY", "1.5"},    {"KRUG_TIMELINE_MARK_CYCLES", "maybe"},
      {"KRUG_STALL_CHECK_DISABLE", ""},  {"KRUG_LOG_LEVEL", "loud"},
      {"KRUG_CPU_OPERATIONS", "nccl"},   {"KRUG_RANK", "-2"},
      {"KRUG_RANK", "99999999999"},      {"KRUG_SIZE", "0"},
      {"KRUG_RENDEZVOUS_PORT", "70000"}, {"KRUG_BUSY_POLL_MICROSECONDS", "1.5"},
      {"KRUG_BUSY_POLL_MICROSECONDS", "-1"},
      {"KRUG_HIERARCHICAL_ALLREDUCE", "2"},  {"KRUG_HIERARCHICAL_ALLREDUCE", ""},
      {"KRUG_HIERARCHICAL_ALLREDUCE", "automatic"},
      {"KRUG_GPU_OPERATIONS", "rccl"},   {"KRUG_GPU_OPERATIONS", "mpi"},
      {"KRUG_GPU_OPERATIONS", ""},       {"KRUG_GPU_SHARE_DEVICE", "yes please"},
      {"KRUG_START_TIMEOUT", "0"},       {"KRUG_START_TIMEOUT", "soon"},
      {"HOROVOD_START_TIMEOUT", "30s"},  {"HOROVOD_GPU_ALLREDUCE", "DDL"},
      {"HOROVOD_GPU_OPERATIONS", "host"},
  };
  for (const auto& [var, value] : cases) {
    SCOPED_TRACE(var + "=" + value);
    const std::string message = error_of({{var, value}});
    EXPECT_NE(message.find(var), std::string::npos) << message;
    EXPECT_NE(message.find("'" + value + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("expected"), std::string::npos) << message;
  }
}

TEST(ConfigTest, ErrorsSayWhatIsAccepted) {
  EXPECT_NE(error_of({{"KRUG_LOG_LEVEL", "loud"}}).find("trace, debug, info, warning, error, fatal"),
            std::string::npos);
  EXPECT_NE(error_of({{"KRUG_CPU_OPERATIONS", "nccl"}}).find("gloo, mpi, shm"), std::string::npos);
  EXPECT_NE(error_of({{"KRUG_CYCLE_TIME", "0"}}).find("> 0"), std::string::npos);
  EXPECT_NE(error_of({{"KRUG_FUSION_THRESHOLD", "x"}}).find("bytes"), std::string::npos);
  EXPECT_NE(error_of({{"KRUG_STALL_CHECK_DISABLE", "2"}}).find("yes, no"), std::string::npos);
}

// Gloo's and MPI's transports send in the clear: asking for them and for encryption is an error
// that names both settings, not a silent downgrade.
TEST(ConfigTest, EncryptionRefusesPlanesThatSendInTheClear) {
  EXPECT_TRUE(load({{"KRUG_ENCRYPT", "1"}}).encrypt);
  EXPECT_EQ(load({{"KRUG_ENCRYPT", "1"}, {"KRUG_CPU_OPERATIONS", "tcp"}}).data_plane,
            DataPlane::kTcp);
  for (const char* plane : {"gloo", "mpi"}) {
    const std::string msg = error_of({{"KRUG_ENCRYPT", "1"}, {"HOROVOD_CPU_OPERATIONS", plane}});
    EXPECT_NE(msg.find("KRUG_ENCRYPT=1 and HOROVOD_CPU_OPERATIONS=" + std::string(plane)),
              std::string::npos)
        << msg;
  }
  EXPECT_FALSE(load({{"KRUG_CPU_OPERATIONS", "gloo"}}).encrypt);
}

TEST(ConfigTest, DataPlaneNamesAreTheKnobsSpellings) {
  for (DataPlane plane : {DataPlane::kShm, DataPlane::kGloo, DataPlane::kMpi})
    EXPECT_EQ(parse_data_plane(data_plane_name(plane)), plane) << data_plane_name(plane);
  EXPECT_EQ(data_plane_name(DataPlane::kAuto), "");
  EXPECT_EQ(parse_data_plane(""), std::nullopt);
  EXPECT_EQ(parse_data_plane("hierarchical"), std::nullopt);
  EXPECT_EQ(load({{"HOROVOD_CPU_OPERATIONS", "GLOO"}}).data_plane, DataPlane::kGloo);
  EXPECT_EQ(load({{"KRUG_CPU_OPERATIONS", "shm"}}).data_plane, DataPlane::kShm);
}

// A boolean that may also be "auto": every boolean spelling, "auto" in any case, and the alias.
TEST(ConfigTest, HierarchicalAllreduceIsABooleanOrAuto) {
  const auto value = [](const char* text) {
    return load({{"KRUG_HIERARCHICAL_ALLREDUCE", text}}).hierarchical_allreduce;
  };
  EXPECT_EQ(value("auto"), std::nullopt);
  EXPECT_EQ(value("AUTO"), std::nullopt);
  EXPECT_EQ(value("1"), std::optional<bool>(true));
  EXPECT_EQ(value("on"), std::optional<bool>(true));
  EXPECT_EQ(value("0"), std::optional<bool>(false));
  EXPECT_EQ(value("False"), std::optional<bool>(false));
  EXPECT_EQ(load({{"HOROVOD_HIERARCHICAL_ALLREDUCE", "1"}}).hierarchical_allreduce,
            std::optional<bool>(true));
  const std::string message = error_of({{"HOROVOD_HIERARCHICAL_ALLREDUCE", "sometimes"}});
  EXPECT_NE(message.find("HOROVOD_HIERARCHICAL_ALLREDUCE='sometimes' is invalid: expected one "
                         "of auto, 1, 0"),
            std::string::npos)
      << message;
  for (const KnobDoc& k : knob_docs()) {
    if (k.name == "KRUG_HIERARCHICAL_ALLREDUCE") {
      EXPECT_EQ(k.default_value, "auto");
    }
  }
}

// Horovod's names of KRUG_GPU_OPERATIONS take Horovod's values: NCCL, or MPI and GLOO, which
// krug runs as host staging through the CPU data plane.
TEST(ConfigTest, GpuOperationsTakesHorovodsValuesFromItsAliases) {
  EXPECT_EQ(load({}).gpu_operations, "") << "unset: the engine picks by build";
  EXPECT_EQ(load({{"KRUG_GPU_OPERATIONS", "NCCL"}}).gpu_operations, "nccl");
  EXPECT_EQ(load({{"HOROVOD_GPU_OPERATIONS", "NCCL"}}).gpu_operations, "nccl");
  EXPECT_EQ(load({{"HOROVOD_GPU_OPERATIONS", "MPI"}}).gpu_operations, "host");
  EXPECT_EQ(load({{"HOROVOD_GPU_ALLREDUCE", "gloo"}}).gpu_operations, "host");
  EXPECT_EQ(load({{"KRUG_GPU_OPERATIONS", "host"}, {"HOROVOD_GPU_OPERATIONS", "NCCL"}})
                .gpu_operations,
            "host");
  EXPECT_EQ(load({{"HOROVOD_GPU_OPERATIONS", "MPI"}, {"HOROVOD_GPU_ALLREDUCE", "NCCL"}})
                .gpu_operations,
            "host")
      << "the first alias set wins";
  const std::string message = error_of({{"HOROVOD_GPU_ALLREDUCE", "DDL"}});
  EXPECT_NE(message.find("HOROVOD_GPU_ALLREDUCE='DDL' is invalid: expected one of nccl (nccl), "
                         "mpi (host), gloo (host)"),
            std::string::npos)
      << message;
  EXPECT_NE(error_of({{"KRUG_GPU_OPERATIONS", "gloo"}}).find("expected one of host, nccl"),
            std::string::npos);
}

// krugrun reads its own knobs without judging the workers', which it only passes on.
TEST(ConfigTest, LoadKnobsReadsOnlyTheNamedOnes) {
  const Env env = {{"HOROVOD_START_TIMEOUT", "45"}, {"KRUG_RANK", "bogus"}};
  const Config c = load_knobs({"KRUG_START_TIMEOUT"}, [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  EXPECT_DOUBLE_EQ(c.start_timeout.count(), 45);
  EXPECT_EQ(c.rank, -1);
  EXPECT_THROW(load(env), Error);
}

TEST(ConfigTest, ErrorNamesTheAliasThatWasSet) {
  const std::string message = error_of({{"HOROVOD_CYCLE_TIME", "fast"}});
  EXPECT_NE(message.find("HOROVOD_CYCLE_TIME='fast'"), std::string::npos) << message;
  EXPECT_EQ(message.find("KRUG_CYCLE_TIME"), std::string::npos) << message;
}

TEST(ConfigTest, KrugNameWinsOverHorovodAlias) {
  EXPECT_EQ(load({{"HOROVOD_FUSION_THRESHOLD", "100"}}).fusion_threshold_bytes, 100);
  EXPECT_EQ(load({{"HOROVOD_FUSION_THRESHOLD", "100"}, {"KRUG_FUSION_THRESHOLD", "200"}})
                .fusion_threshold_bytes,
            200);
  // The alias is not read at all when the KRUG_ name is set.
  EXPECT_EQ(load({{"HOROVOD_LOG_LEVEL", "bogus"}, {"KRUG_LOG_LEVEL", "error"}}).log_level, "error");
  EXPECT_DOUBLE_EQ(load({{"HOROVOD_GLOO_TIMEOUT_SECONDS", "7"}}).timeout.count(), 7);
  EXPECT_EQ(load({{"HOROVOD_GLOO_RENDEZVOUS_ADDR", "h"}}).rendezvous_addr, "h");
  EXPECT_EQ(load({{"HOROVOD_GLOO_RENDEZVOUS_PORT", "1234"}}).rendezvous_port, 1234);
}

TEST(ConfigTest, EveryHorovodAliasIsDeclared) {
  std::map<std::string, std::vector<std::string>> aliases_of;
  for (const KnobDoc& k : knob_docs()) aliases_of[k.name] = k.aliases;
  const std::pair<const char*, std::vector<std::string>> expected[] = {
      {"KRUG_FUSION_THRESHOLD", {"HOROVOD_FUSION_THRESHOLD"}},
      {"KRUG_CYCLE_TIME", {"HOROVOD_CYCLE_TIME"}},
      {"KRUG_CACHE_CAPACITY", {"HOROVOD_CACHE_CAPACITY"}},
      {"KRUG_BUSY_POLL_MICROSECONDS", {}},
      {"KRUG_DIRECT_LANE_BYTES", {}},
      {"KRUG_AUTOTUNE", {"HOROVOD_AUTOTUNE"}},
      {"KRUG_AUTOTUNE_LOG", {"HOROVOD_AUTOTUNE_LOG"}},
      {"KRUG_AUTOTUNE_WARMUP_SAMPLES", {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES"}},
      {"KRUG_AUTOTUNE_STEPS_PER_SAMPLE", {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"}},
      {"KRUG_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"}},
      {"KRUG_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"}},
      {"KRUG_TIMEOUT_SECONDS", {"HOROVOD_GLOO_TIMEOUT_SECONDS"}},
      {"KRUG_TIMELINE", {"HOROVOD_TIMELINE"}},
      {"KRUG_TIMELINE_MARK_CYCLES", {"HOROVOD_TIMELINE_MARK_CYCLES"}},
      {"KRUG_STALL_CHECK_TIME_SECONDS", {"HOROVOD_STALL_CHECK_TIME_SECONDS"}},
      {"KRUG_STALL_SHUTDOWN_TIME_SECONDS", {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"}},
      {"KRUG_STALL_CHECK_DISABLE", {"HOROVOD_STALL_CHECK_DISABLE"}},
      {"KRUG_LOG_LEVEL", {"HOROVOD_LOG_LEVEL"}},
      {"KRUG_CPU_OPERATIONS", {"HOROVOD_CPU_OPERATIONS"}},
      {"KRUG_GLOO_IFACE", {"HOROVOD_GLOO_IFACE"}},
      {"KRUG_HIERARCHICAL_ALLREDUCE", {"HOROVOD_HIERARCHICAL_ALLREDUCE"}},
      {"KRUG_RANK", {"HOROVOD_RANK"}},
      {"KRUG_SIZE", {"HOROVOD_SIZE"}},
      {"KRUG_LOCAL_RANK", {"HOROVOD_LOCAL_RANK"}},
      {"KRUG_LOCAL_SIZE", {"HOROVOD_LOCAL_SIZE"}},
      {"KRUG_CROSS_RANK", {"HOROVOD_CROSS_RANK"}},
      {"KRUG_CROSS_SIZE", {"HOROVOD_CROSS_SIZE"}},
      {"KRUG_HOSTNAME", {"HOROVOD_HOSTNAME"}},
      {"KRUG_RENDEZVOUS_ADDR", {"HOROVOD_GLOO_RENDEZVOUS_ADDR"}},
      {"KRUG_RENDEZVOUS_PORT", {"HOROVOD_GLOO_RENDEZVOUS_PORT"}},
      {"KRUG_SECRET", {}},
      {"KRUG_ENCRYPT", {}},
      {"KRUG_JOB_ID", {}},
      {"KRUG_ELASTIC", {"HOROVOD_ELASTIC"}},
      {"KRUG_ELASTIC_WORKER_ID", {}},
      {"KRUG_ELASTIC_TIMEOUT", {"HOROVOD_ELASTIC_TIMEOUT"}},
      {"KRUG_GPU_OPERATIONS", {"HOROVOD_GPU_OPERATIONS", "HOROVOD_GPU_ALLREDUCE"}},
      {"KRUG_GPU_SHARE_DEVICE", {}},
      {"KRUG_START_TIMEOUT", {"HOROVOD_START_TIMEOUT"}},
  };
  for (const auto& [name, aliases] : expected) {
    ASSERT_TRUE(aliases_of.count(name)) << name;
    EXPECT_EQ(aliases_of[name], aliases) << name;
  }
  EXPECT_EQ(aliases_of.size(), std::size(expected)) << "a knob without a test of its alias";
}

TEST(ConfigTest, BoolSpellings) {
  for (const char* yes : {"1", "true", "TRUE", "True", "yes", "YES", "on", "On"})
    EXPECT_TRUE(load({{"KRUG_STALL_CHECK_DISABLE", yes}}).stall_check_disable) << yes;
  for (const char* no : {"0", "false", "FALSE", "no", "No", "off", "OFF"})
    EXPECT_FALSE(load({{"KRUG_STALL_CHECK_DISABLE", no}}).stall_check_disable) << no;
  for (const char* bad : {"", "2", "y", "n", "enable", " true", "true "})
    EXPECT_THROW(load({{"KRUG_STALL_CHECK_DISABLE", bad}}), Error) << "'" << bad << "'";
}

TEST(ConfigTest, RankMustBeLessThanSize) {
  const std::string message = error_of({{"KRUG_RANK", "4"}, {"HOROVOD_SIZE", "4"}});
  EXPECT_NE(message.find("KRUG_RANK=4"), std::string::npos) << message;
  EXPECT_NE(message.find("HOROVOD_SIZE=4"), std::string::npos) << message;
  EXPECT_THROW(load({{"KRUG_LOCAL_RANK", "2"}, {"KRUG_LOCAL_SIZE", "2"}}), Error);
  EXPECT_THROW(load({{"KRUG_CROSS_RANK", "5"}, {"KRUG_CROSS_SIZE", "1"}}), Error);
  // Either one alone is fine: the other is not known yet.
  EXPECT_EQ(load({{"KRUG_RANK", "9"}}).rank, 9);
  EXPECT_EQ(load({{"KRUG_SIZE", "9"}}).size, 9);
}

TEST(ConfigTest, ReadsTheProcessEnvironmentByDefault) {
  ASSERT_EQ(setenv("KRUG_CACHE_CAPACITY", "7", 1), 0);
  const Config c = load_config();
  unsetenv("KRUG_CACHE_CAPACITY");
  EXPECT_EQ(c.cache_capacity, 7);
}

TEST(ConfigTest, DocTableIsComplete) {
  std::set<std::string> names;
  const Config defaults;
  for (const KnobDoc& k : knob_docs()) {
    EXPECT_TRUE(names.insert(k.name).second) << "duplicate " << k.name;
    EXPECT_EQ(k.name.rfind("KRUG_", 0), 0u) << k.name;
    for (const std::string& alias : k.aliases) EXPECT_EQ(alias.rfind("HOROVOD_", 0), 0u) << alias;
    EXPECT_FALSE(k.type.empty()) << k.name;
    EXPECT_FALSE(k.default_value.empty()) << k.name;
    EXPECT_GT(k.doc.size(), 10u) << k.name;
  }
  // Defaults shown are the defaults used.
  for (const KnobDoc& k : knob_docs()) {
    if (k.name == "KRUG_FUSION_THRESHOLD") {
      EXPECT_EQ(k.default_value, std::to_string(defaults.fusion_threshold_bytes));
    }
    if (k.name == "KRUG_LOG_LEVEL") {
      EXPECT_EQ(k.default_value, defaults.log_level);
    }
  }
}

// docs/configuration.md has one table row per knob, with its alias, type and default, so the
// page cannot drift from the table in the code.
TEST(ConfigTest, EveryKnobIsInDocsConfigurationMd) {
  const std::string path = std::string(KRUG_SOURCE_DIR) + "/docs/configuration.md";
  std::ifstream file(path);
  ASSERT_TRUE(file) << "cannot read " << path;
  std::map<std::string, std::string> rows;  // "| `KRUG_X` |..." of "## Knobs", keyed by KRUG_X
  bool in_table_section = false;
  for (std::string line; std::getline(file, line);) {
    if (line.rfind("## ", 0) == 0) in_table_section = line == "## Knobs";
    if (!in_table_section || line.rfind("| `KRUG_", 0) != 0) continue;
    const size_t end = line.find('`', 3);
    rows[line.substr(3, end - 3)] = line;
  }
  for (const KnobDoc& k : knob_docs()) {
    SCOPED_TRACE(k.name);
    ASSERT_TRUE(rows.count(k.name)) << "no row for " << k.name << " in " << path;
    const std::string& row = rows[k.name];
    for (const std::string& alias : k.aliases)
      EXPECT_NE(row.find("`" + alias + "`"), std::string::npos) << row;
    EXPECT_NE(row.find("`" + k.type + "`"), std::string::npos) << row;
    EXPECT_NE(row.find("`" + k.default_value + "`"), std::string::npos) << row;
    rows.erase(k.name);
  }
  for (const auto& [name, row] : rows) ADD_FAILURE() << "documented but not declared: " << name;
}

}  // namespace
}  // namespace krug
