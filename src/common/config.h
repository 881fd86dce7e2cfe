// Every krug knob, declared once: name, Horovod alias, type, default, validation and doc.
//
// Knobs are environment variables KRUG_* (HOROVOD_* aliases accepted for porting ease; KRUG_*
// wins when both are set). Parsing is strict: "12x" for a number is an error naming the knob.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "krug/types.h"

namespace krug {

// Durations as knobs are written: fractions of a second or of a millisecond are allowed.
using Seconds = std::chrono::duration<double>;
using Milliseconds = std::chrono::duration<double, std::milli>;

// A knob's duration in whole milliseconds, as deadlines take it (a fraction is dropped).
template <typename Rep, typename Period>
std::chrono::milliseconds whole_ms(std::chrono::duration<Rep, Period> d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d);
}

// The communicator for CPU tensors (KRUG_CPU_OPERATIONS).
enum class DataPlane {
  kAuto,  // not set: mpi in a process mpirun started (init() decides), otherwise the engine
          // picks shm or gloo per process set from its hosts
  kShm,   // POSIX shared memory: every rank of a set on one host
  kGloo,  // Gloo's TCP transport
  kTcp,   // krug's TCP plane (collectives/tcp)
  kMpi,   // Open MPI, ranks started by mpirun
};
// The knob's spelling: "shm", "tcp", "gloo", "mpi"; "" for kAuto.
std::string_view data_plane_name(DataPlane plane);
// The inverse of data_plane_name for the three backends; nullopt for anything else.
std::optional<DataPlane> parse_data_plane(std::string_view name);

struct Config {
  // Engine
  int64_t fusion_threshold_bytes = 128 * 1024 * 1024;  // KRUG_FUSION_THRESHOLD (bytes)
  Milliseconds cycle_time{1.0};                        // KRUG_CYCLE_TIME (ms)
  int64_t cache_capacity = 1024;                       // KRUG_CACHE_CAPACITY (0 disables)
  std::chrono::microseconds busy_poll{50};             // KRUG_BUSY_POLL_MICROSECONDS
  int64_t direct_lane_bytes = 1024 * 1024;             // KRUG_DIRECT_LANE_BYTES
  Seconds timeout{30.0};  // KRUG_TIMEOUT_SECONDS: any blocking step, dead-peer detection
  // Autotuner
  bool autotune = false;                   // KRUG_AUTOTUNE
  std::string autotune_log;                // KRUG_AUTOTUNE_LOG
  int64_t autotune_warmup_samples = 3;     // KRUG_AUTOTUNE_WARMUP_SAMPLES
  int64_t autotune_steps_per_sample = 10;  // KRUG_AUTOTUNE_STEPS_PER_SAMPLE
  int64_t autotune_max_samples = 20;       // KRUG_AUTOTUNE_BAYES_OPT_MAX_SAMPLES
  double autotune_gp_noise = 0.8;          // KRUG_AUTOTUNE_GAUSSIAN_PROCESS_NOISE
  // Observability
  std::string timeline_path;          // KRUG_TIMELINE
  bool timeline_mark_cycles = true;   // KRUG_TIMELINE_MARK_CYCLES
  Seconds stall_check_time{60.0};     // KRUG_STALL_CHECK_TIME_SECONDS
  Seconds stall_shutdown_time{0.0};   // KRUG_STALL_SHUTDOWN_TIME_SECONDS (0 = never)
  bool stall_check_disable = false;   // KRUG_STALL_CHECK_DISABLE
  std::string log_level = "warning";  // KRUG_LOG_LEVEL: trace|debug|info|warning|error|fatal
  // Data plane
  // KRUG_CPU_OPERATIONS. The engine's config() reports the one its global set uses.
  DataPlane data_plane = DataPlane::kAuto;
  std::string iface;  // KRUG_GLOO_IFACE: network interface for the data plane
  // KRUG_HIERARCHICAL_ALLREDUCE: true / false, or nullopt for "auto" (the engine decides per
  // process set from the hosts its ranks are on).
  std::optional<bool> hierarchical_allreduce;
  // KRUG_GPU_OPERATIONS: "host", "nccl", or "" (nccl in a build with NCCL, else host).
  std::string gpu_operations;
  bool gpu_share_device = false;  // KRUG_GPU_SHARE_DEVICE: several ranks on one GPU (testing)
  // Topology, set by krugrun (KRUG_RANK ...); -1 = not set
  int rank = -1, size = -1, local_rank = -1, local_size = -1, cross_rank = -1, cross_size = -1;
  std::string hostname;         // KRUG_HOSTNAME (default: gethostname)
  std::string rendezvous_addr;  // KRUG_RENDEZVOUS_ADDR
  int rendezvous_port = 0;      // KRUG_RENDEZVOUS_PORT
  std::string secret;           // KRUG_SECRET
  bool encrypt = false;         // KRUG_ENCRYPT: connections are sealed, not only authenticated
  std::string job_id;           // KRUG_JOB_ID
  // Elastic (docs/elastic.md): set by krugrun's elastic driver; init() then takes the topology
  // above from the driver's round assignment.
  bool elastic = false;            // KRUG_ELASTIC
  std::string elastic_worker_id;   // KRUG_ELASTIC_WORKER_ID
  Seconds elastic_timeout{600.0};  // KRUG_ELASTIC_TIMEOUT
  // krugrun's own
  Seconds start_timeout{30.0};  // KRUG_START_TIMEOUT: reaching each remote host over ssh
  // Not a knob: the address this rank advertises to its peers (control and data planes),
  // picked by init() from KRUG_GLOO_IFACE or the route to the rendezvous server. Empty: the
  // engine falls back to 127.0.0.1 on one host and the host name otherwise.
  std::string advertise_address;
};

// Reads every knob through `getenv` (std::getenv by default). Throws krug::Error naming the
// variable, the bad value and what is accepted.
using GetEnv = std::function<const char*(const char*)>;
Config load_config(const GetEnv& getenv = {});
// Reads only the knobs named (KRUG_* names), the others keeping their defaults: for krugrun,
// which reads its own knobs and passes the workers' on without judging them.
Config load_knobs(std::initializer_list<std::string_view> names, const GetEnv& getenv = {});

struct KnobDoc {
  std::string name;                  // KRUG_FUSION_THRESHOLD
  std::vector<std::string> aliases;  // HOROVOD_FUSION_THRESHOLD, or none
  std::string type;                  // "bytes", "milliseconds", "bool", ...
  std::string default_value;
  std::string doc;
};
// The knob table, for `krugrun --help-knobs` and docs/configuration.md.
std::vector<KnobDoc> knob_docs();

}  // namespace krug
