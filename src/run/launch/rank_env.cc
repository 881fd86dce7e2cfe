#include "run/launch/rank_env.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <system_error>

extern char** environ;

namespace krug::run {

EnvMap current_environment() {
  EnvMap env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

EnvMap rank_environment(const EnvMap& base, const LaunchOptions& options, const RankSlot& slot,
                        const JobInfo& job) {
  EnvMap env = base;
  for (const auto& [k, v] : options.knob_env) env[k] = v;
  for (const auto& [k, v] : options.set_env) env[k] = v;

  auto both = [&env](const std::string& krug, const std::string& horovod, const std::string& v) {
    env[krug] = v;
    env[horovod] = v;
  };
  both("KRUG_RANK", "HOROVOD_RANK", std::to_string(slot.rank));
  both("KRUG_SIZE", "HOROVOD_SIZE", std::to_string(slot.size));
  both("KRUG_LOCAL_RANK", "HOROVOD_LOCAL_RANK", std::to_string(slot.local_rank));
  both("KRUG_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE", std::to_string(slot.local_size));
  both("KRUG_CROSS_RANK", "HOROVOD_CROSS_RANK", std::to_string(slot.cross_rank));
  both("KRUG_CROSS_SIZE", "HOROVOD_CROSS_SIZE", std::to_string(slot.cross_size));
  both("KRUG_HOSTNAME", "HOROVOD_HOSTNAME", slot.host);
  both("KRUG_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_ADDR", job.rendezvous_addr);
  both("KRUG_RENDEZVOUS_PORT", "HOROVOD_GLOO_RENDEZVOUS_PORT", std::to_string(job.rendezvous_port));
  env["KRUG_SECRET"] = job.secret;
  env["KRUG_JOB_ID"] = job.job_id;
  env["HOROVOD_CONTROLLER"] = "gloo";
  // No HOROVOD_CPU_OPERATIONS: it is an alias of KRUG_CPU_OPERATIONS, and setting it would stop
  // the engine choosing shared memory inside a host.
  // Rank output goes to a pipe, where Python would buffer it in blocks: lines would show up late
  // and out of order with the other ranks' (horovodrun sets it too).
  env.try_emplace("PYTHONUNBUFFERED", "1");
  if (!job.python_dir.empty()) {
    auto it = env.find("PYTHONPATH");
    env["PYTHONPATH"] = (it == env.end() || it->second.empty())
                            ? job.python_dir
                            : job.python_dir + ":" + it->second;
  }
  return env;
}

namespace {
constexpr double kWorkerJoinTimeoutS = 7 * 24 * 3600;
}  // namespace

EnvMap elastic_worker_environment(const EnvMap& base, const LaunchOptions& options,
                                  const std::string& host, const std::string& worker_id,
                                  const JobInfo& job) {
  RankSlot slot;
  slot.host = host;
  EnvMap env = rank_environment(base, options, slot, job);
  for (const char* name : {"RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE"}) {
    env.erase(fmt::format("KRUG_{}", name));
    env.erase(fmt::format("HOROVOD_{}", name));
  }
  env["KRUG_ELASTIC"] = "1";
  env["HOROVOD_ELASTIC"] = "1";
  env["KRUG_ELASTIC_WORKER_ID"] = worker_id;
  // The driver bounds every wait it can judge (--elastic-timeout) and stops the workers itself,
  // naming the cause; a new worker may wait for the others' next commit however far apart
  // commits are. The worker's own bound is only a safety net should the driver vanish.
  env["KRUG_ELASTIC_TIMEOUT"] =
      fmt::format("{}", std::max(options.elastic.elastic_timeout_s + 60, kWorkerJoinTimeoutS));
  return env;
}

std::string build_python_dir() {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  std::filesystem::path dir = exe.parent_path() / "python";
  return std::filesystem::is_directory(dir, ec) ? dir.string() : std::string();
}

std::vector<std::string> to_envp(const EnvMap& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::string make_job_id() {
  std::random_device rd;  // the OS RNG; uniqueness, not secrecy, is what matters here
  return fmt::format("{:08x}", static_cast<uint32_t>(rd()));
}

}  // namespace krug::run
