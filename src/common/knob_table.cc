#include "common/knob_table.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <type_traits>

namespace krug::knobs {
namespace {

constexpr Bounds kNonNegative{.min = 0};
constexpr Bounds kPositive{.min = 0, .min_exclusive = true};
constexpr Bounds kAtLeastOne{.min = 1};
constexpr Bounds kPort{.min = 0, .max = 65535};

std::vector<Knob> make_table() {
  return {
      // Engine
      {.name = "KRUG_FUSION_THRESHOLD", .aliases = {"HOROVOD_FUSION_THRESHOLD"}, .unit = "bytes",
       .field = &Config::fusion_threshold_bytes, .bounds = kNonNegative,
       .doc = "Largest fusion buffer: tensors are batched into one collective up to this many "
              "bytes. 0 disables fusion."},
      {.name = "KRUG_CYCLE_TIME", .aliases = {"HOROVOD_CYCLE_TIME"}, .unit = "milliseconds",
       .field = &Config::cycle_time, .bounds = kPositive,
       .doc = "Longest the background loop waits for more work before negotiating a cycle; an "
              "enqueue wakes it earlier (or, with busy polling on, within this time unless a "
              "thread that waits for the operation runs it first)."},
      {.name = "KRUG_CACHE_CAPACITY", .aliases = {"HOROVOD_CACHE_CAPACITY"}, .unit = "count",
       .field = &Config::cache_capacity, .bounds = kNonNegative,
       .doc = "Entries in the response cache (the bit-vector fast path of negotiation). 0 "
              "disables the cache."},
      {.name = "KRUG_BUSY_POLL_MICROSECONDS", .aliases = {}, .unit = "microseconds",
       .field = &Config::busy_poll, .bounds = kNonNegative,
       .doc = "While a rank has operations in flight, the thread running its loop (the "
              "background thread, or a thread waiting for a handle) polls for the answer this "
              "long after the last message before it sleeps; with it on, waiting threads run the "
              "loop themselves. Only when this host has a core per rank. 0 turns it off."},
      {.name = "KRUG_DIRECT_LANE_BYTES", .aliases = {}, .unit = "bytes",
       .field = &Config::direct_lane_bytes, .bounds = kNonNegative,
       .doc = "Largest synchronous allreduce, broadcast or allgather (every rank's tensor "
              "together: 512 KiB a rank at 2 ranks, 64 KiB at 16; a broadcast, whose root alone "
              "posts its tensor, may take all of it; C++ API, hvd.allreduce, hvd.broadcast_; "
              "also an asynchronous one that a thread waits for alone at an idle engine) "
              "that skips negotiation when every rank (at most 16) is on one host "
              "and makes the same call at about the same time: the ranks meet on a shared-memory "
              "lane and run it there, or after 4 x KRUG_BUSY_POLL_MICROSECONDS go through the "
              "engine as usual. Needs busy polling. 0 turns it off."},
      {.name = "KRUG_TIMEOUT_SECONDS", .aliases = {"HOROVOD_GLOO_TIMEOUT_SECONDS"},
       .unit = "seconds",
       .field = &Config::timeout, .bounds = kPositive,
       .doc = "Deadline of every blocking step (rendezvous, connect, collective); a peer silent "
              "for this long is reported dead."},
      // Autotuner (observe/autotuner.h)
      {.name = "KRUG_AUTOTUNE", .aliases = {"HOROVOD_AUTOTUNE"}, .unit = "bool",
       .field = &Config::autotune,
       .doc = "Tune the fusion threshold and the cycle time online (Bayesian optimization of the "
              "bytes per second of real steps), then keep the best. See docs/autotune.md."},
      {.name = "KRUG_AUTOTUNE_LOG", .aliases = {"HOROVOD_AUTOTUNE_LOG"}, .unit = "path",
       .field = &Config::autotune_log, .default_text = "unset (no log)",
       .doc = "CSV file (written by rank 0) with every autotuning sample and the settled choice."},
      {.name = "KRUG_AUTOTUNE_WARMUP_SAMPLES", .aliases = {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES"},
       .unit = "count", .field = &Config::autotune_warmup_samples, .bounds = kNonNegative,
       .doc = "Samples discarded before tuning starts."},
      {.name = "KRUG_AUTOTUNE_STEPS_PER_SAMPLE", .aliases = {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"},
       .unit = "count", .field = &Config::autotune_steps_per_sample, .bounds = kAtLeastOne,
       .doc = "Cycles that executed collectives per sample."},
      {.name = "KRUG_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
       .aliases = {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"}, .unit = "count",
       .field = &Config::autotune_max_samples, .bounds = kAtLeastOne,
       .doc = "Scored samples after which the best parameters are fixed."},
      {.name = "KRUG_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
       .aliases = {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"}, .unit = "number",
       .field = &Config::autotune_gp_noise, .bounds = kPositive,
       .doc = "Noise variance the Gaussian process assumes, relative to the spread of the "
              "scores: larger trusts single samples less."},
      // Observability
      {.name = "KRUG_TIMELINE", .aliases = {"HOROVOD_TIMELINE"}, .unit = "path",
       .field = &Config::timeline_path, .default_text = "unset (off)",
       .doc = "Write a Chrome trace (chrome://tracing, Perfetto) of every tensor's phases to this "
              "file (rank 0). DYNAMIC (Horovod's value): no file until start_timeline()."},
      {.name = "KRUG_TIMELINE_MARK_CYCLES", .aliases = {"HOROVOD_TIMELINE_MARK_CYCLES"},
       .unit = "bool", .field = &Config::timeline_mark_cycles,
       .doc = "Mark the start of each background cycle in the timeline."},
      {.name = "KRUG_STALL_CHECK_TIME_SECONDS", .aliases = {"HOROVOD_STALL_CHECK_TIME_SECONDS"},
       .unit = "seconds", .field = &Config::stall_check_time, .bounds = kNonNegative,
       .doc = "Warn on every rank taking part, naming the operation and the ranks that have not "
              "submitted it, as soon as it has waited this long; again every period it waits."},
      {.name = "KRUG_STALL_SHUTDOWN_TIME_SECONDS",
       .aliases = {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"},
       .unit = "seconds", .field = &Config::stall_shutdown_time, .bounds = kNonNegative,
       .doc = "Stop krug on every rank once an operation has waited this long: each pending "
              "operation fails naming itself and the stalled ones with their missing ranks. 0 "
              "never does."},
      {.name = "KRUG_STALL_CHECK_DISABLE", .aliases = {"HOROVOD_STALL_CHECK_DISABLE"},
       .unit = "bool",
       .field = &Config::stall_check_disable, .doc = "Turn the stall inspector off."},
      {.name = "KRUG_LOG_LEVEL", .aliases = {"HOROVOD_LOG_LEVEL"}, .unit = "enum",
       .field = &Config::log_level,
       .choices = {"trace", "debug", "info", "warning", "error", "fatal"},
       .doc = "Least severe message written to stderr."},
      // Data plane
      {.name = "KRUG_CPU_OPERATIONS", .aliases = {"HOROVOD_CPU_OPERATIONS"}, .unit = "enum",
       .field = &Config::data_plane, .choices = {"gloo", "mpi", "shm", "tcp"},
       .default_text = "shm for a process set on one host, tcp across hosts; mpi when mpirun "
                       "started the job",
       .doc = "Communicator for CPU tensors: shm (POSIX shared memory; every rank of a process "
              "set must be on one host), tcp (krug's own TCP plane: authenticated connections "
              "made on first use, O(log n) peers per rank), gloo (Gloo's TCP full mesh), or mpi "
              "when the ranks were started by mpirun (krugrun --mpi, or mpirun directly; needs a "
              "build with Open MPI). Unset, each process set whose ranks share a host uses shm "
              "and the others tcp; tcp or gloo forces TCP everywhere."},
      {.name = "KRUG_GLOO_IFACE", .aliases = {"HOROVOD_GLOO_IFACE"}, .unit = "string",
       .field = &Config::iface, .default_text = "unset (Gloo picks one)",
       .doc = "Network interface the data plane binds to (e.g. eth0)."},
      {.name = "KRUG_HIERARCHICAL_ALLREDUCE", .aliases = {"HOROVOD_HIERARCHICAL_ALLREDUCE"},
       .unit = "bool or auto", .field = &Config::hierarchical_allreduce,
       .doc = "Allreduce in three steps: reduce inside each host, allreduce across hosts, "
              "spread inside each host, so only 1/(ranks on the host) of the data crosses the "
              "network per rank. auto (and 1) use it for a process set whose ranks are on "
              "several hosts with more than one rank on some host; 0 never does. See "
              "docs/architecture.md for how its float sums are associated."},
      {.name = "KRUG_GPU_OPERATIONS",
       .aliases = {"HOROVOD_GPU_OPERATIONS", "HOROVOD_GPU_ALLREDUCE"}, .unit = "enum",
       .field = &Config::gpu_operations, .choices = {"host", "nccl"},
       .alias_values = {{"nccl", "nccl"}, {"mpi", "host"}, {"gloo", "host"}},
       .default_text = "nccl in a build with NCCL, else host",
       .doc = "Data plane for CUDA tensors: nccl, or host (staging through pinned host buffers "
              "and the CPU data plane). Horovod's names take NCCL, or MPI and GLOO for host. "
              "nccl in a build without NCCL is an error at the first CUDA operation. Must be the "
              "same on every rank."},
      {.name = "KRUG_GPU_SHARE_DEVICE", .aliases = {}, .unit = "bool",
       .field = &Config::gpu_share_device,
       .doc = "Testing only: several ranks on one GPU over NCCL; each rank sets its own "
              "NCCL_HOSTID."},
      // Topology, set by krugrun for each worker.
      {.name = "KRUG_RANK", .aliases = {"HOROVOD_RANK"}, .unit = "int", .field = &Config::rank,
       .bounds = kNonNegative, .default_text = "unset",
       .doc = "This process's rank in the job; less than KRUG_SIZE. Set by krugrun."},
      {.name = "KRUG_SIZE", .aliases = {"HOROVOD_SIZE"}, .unit = "int", .field = &Config::size,
       .bounds = kAtLeastOne, .default_text = "unset",
       .doc = "Number of processes in the job. Set by krugrun."},
      {.name = "KRUG_LOCAL_RANK", .aliases = {"HOROVOD_LOCAL_RANK"}, .unit = "int",
       .field = &Config::local_rank, .bounds = kNonNegative, .default_text = "unset",
       .doc = "Rank among the processes on this host; less than KRUG_LOCAL_SIZE. Set by krugrun."},
      {.name = "KRUG_LOCAL_SIZE", .aliases = {"HOROVOD_LOCAL_SIZE"}, .unit = "int",
       .field = &Config::local_size, .bounds = kAtLeastOne, .default_text = "unset",
       .doc = "Number of processes on this host. Set by krugrun."},
      {.name = "KRUG_CROSS_RANK", .aliases = {"HOROVOD_CROSS_RANK"}, .unit = "int",
       .field = &Config::cross_rank, .bounds = kNonNegative, .default_text = "unset",
       .doc = "Index of this host among the hosts that have a process with this local rank; less "
              "than KRUG_CROSS_SIZE. Set by krugrun."},
      {.name = "KRUG_CROSS_SIZE", .aliases = {"HOROVOD_CROSS_SIZE"}, .unit = "int",
       .field = &Config::cross_size, .bounds = kAtLeastOne, .default_text = "unset",
       .doc = "Number of hosts that have a process with this local rank. Set by krugrun."},
      {.name = "KRUG_HOSTNAME", .aliases = {"HOROVOD_HOSTNAME"}, .unit = "string",
       .field = &Config::hostname, .default_text = "gethostname()",
       .doc = "Name of this host as other ranks reach it and as errors report it."},
      {.name = "KRUG_RENDEZVOUS_ADDR", .aliases = {"HOROVOD_GLOO_RENDEZVOUS_ADDR"},
       .unit = "string",
       .field = &Config::rendezvous_addr, .default_text = "unset",
       .doc = "Address of krugrun's rendezvous server. Set by krugrun."},
      {.name = "KRUG_RENDEZVOUS_PORT", .aliases = {"HOROVOD_GLOO_RENDEZVOUS_PORT"}, .unit = "port",
       .field = &Config::rendezvous_port, .bounds = kPort, .default_text = "unset (0)",
       .doc = "Port of krugrun's rendezvous server. Set by krugrun."},
      {.name = "KRUG_SECRET", .aliases = {} /* none: krugrun-only */, .unit = "string",
       .field = &Config::secret,
       .default_text = "unset",
       .doc = "Per-job secret that authenticates workers to the rendezvous server and to each "
              "other (HMAC). Set by krugrun; never logged."},
      {.name = "KRUG_ENCRYPT", .aliases = {}, .unit = "bool", .field = &Config::encrypt,
       .doc = "Encrypt every connection between processes of the job (AES-256-GCM with keys of "
              "each connection's own, from the job secret): the rendezvous store, the control "
              "plane and the TCP data plane. For networks the user does not trust; costs CPU "
              "time (docs/security.md). Set by krugrun --encrypt; every process of a job must "
              "agree."},
      {.name = "KRUG_JOB_ID", .aliases = {} /* none: krugrun-only */, .unit = "string",
       .field = &Config::job_id, .default_text = "unset",
       .doc = "Identifies the job's shared-memory segments (/dev/shm/krug-<id>-*), which krugrun "
              "removes when the job ends. Set by krugrun."},
      // Elastic mode (docs/elastic.md), set by krugrun's elastic driver for each worker.
      {.name = "KRUG_ELASTIC", .aliases = {"HOROVOD_ELASTIC"}, .unit = "bool",
       .field = &Config::elastic,
       .doc = "Elastic worker: init() asks krugrun's driver for this worker's rank in the next "
              "rendezvous round instead of reading KRUG_RANK / KRUG_SIZE. Set by krugrun."},
      {.name = "KRUG_ELASTIC_WORKER_ID", .aliases = {}, .unit = "string",
       .field = &Config::elastic_worker_id, .default_text = "unset",
       .doc = "This worker's name in the elastic driver's rendezvous. Set by krugrun."},
      {.name = "KRUG_ELASTIC_TIMEOUT", .aliases = {"HOROVOD_ELASTIC_TIMEOUT"}, .unit = "seconds",
       .field = &Config::elastic_timeout, .bounds = kPositive,
       .doc = "How long an elastic worker's init() waits for the driver to form the next round "
              "(krugrun --elastic-timeout)."},
      // krugrun's own.
      {.name = "KRUG_START_TIMEOUT", .aliases = {"HOROVOD_START_TIMEOUT"}, .unit = "seconds",
       .field = &Config::start_timeout, .bounds = kPositive,
       .doc = "krugrun: how long to reach each remote host over ssh, when --start-timeout is "
              "not given."},
  };
}

}  // namespace

bool in_bounds(double value, const Bounds& b) {
  return (b.min_exclusive ? value > b.min : value >= b.min) && value <= b.max;
}

std::string bounds_text(const Bounds& b) {
  const bool has_min = b.min != -std::numeric_limits<double>::infinity();
  const bool has_max = b.max != std::numeric_limits<double>::infinity();
  if (has_min && has_max) return fmt::format(" from {} to {}", b.min, b.max);
  if (has_min) return fmt::format(" {} {}", b.min_exclusive ? ">" : ">=", b.min);
  if (has_max) return fmt::format(" <= {}", b.max);
  return "";
}

const std::vector<Knob>& table() {
  static const std::vector<Knob> knobs = make_table();
  return knobs;
}

std::string default_text(const Knob& knob) {
  if (!knob.default_text.empty()) return std::string(knob.default_text);
  const Config defaults;
  std::string text = std::visit(
      [&](auto member) -> std::string {
        const auto& value = defaults.*member;
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, bool>)
          return value ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::optional<bool>>)
          return value ? (*value ? "true" : "false") : "auto";
        else if constexpr (std::is_same_v<T, DataPlane>)
          return std::string(data_plane_name(value));
        else if constexpr (is_duration<T>)
          return fmt::format("{}", value.count());  // in the knob's unit
        else
          return fmt::format("{}", value);
      },
      knob.field);
  return text.empty() ? "unset" : text;
}

std::string accepted_text(const Knob& knob, bool from_alias) {
  if (from_alias && !knob.alias_values.empty()) {
    std::vector<std::string> meanings;
    for (const AliasValue& v : knob.alias_values)
      meanings.push_back(fmt::format("{} ({})", v.horovod, v.krug));
    return fmt::format("one of {}", fmt::join(meanings, ", "));
  }
  if (!knob.choices.empty()) return fmt::format("one of {}", fmt::join(knob.choices, ", "));
  return std::visit(
      [&](auto member) -> std::string {
        using T = std::decay_t<decltype(Config{}.*member)>;
        if constexpr (std::is_same_v<T, bool>)
          return "one of 1, 0, true, false, yes, no, on, off";
        else if constexpr (std::is_same_v<T, std::optional<bool>>)
          return "one of auto, 1, 0, true, false, yes, no, on, off";
        else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, DataPlane>)
          return "any text";
        else if constexpr (is_duration<T>)
          return fmt::format("{}{} ({})",
                             std::is_integral_v<typename T::rep> ? "an integer" : "a number",
                             bounds_text(knob.bounds), knob.unit);
        else
          return fmt::format("{}{} ({})", std::is_integral_v<T> ? "an integer" : "a number",
                             bounds_text(knob.bounds), knob.unit);
      },
      knob.field);
}

}  // namespace krug::knobs
