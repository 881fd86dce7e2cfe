// The elastic driver's workers (docs/elastic.md): one process per slot of a usable host, started
// here or over ssh, their output pumped to krugrun's, reaped when they exit. What a worker is in
// the job (its rank, whether it is leaving) is the driver's and the rounds' to decide.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "run/cli/hosts.h"
#include "run/cli/options.h"
#include "run/launch/fd.h"
#include "run/launch/output.h"
#include "run/launch/process.h"
#include "run/launch/rank_env.h"
#include "run/launch/ssh.h"

namespace krug::run {

struct Worker {
  std::string id;
  std::string host;
  int slot = 0;
  RankProcess process;
  StreamPump out, err;
  Fd keepalive;
  bool remote = false;
  int64_t seq = 0;                      // the init() whose join the driver awaits next
  bool joined = false;                  // its join for `seq` is in the store
  std::optional<int> rank;              // in the current round
  std::optional<std::string> removing;  // why the driver is taking it out of the job
  bool told_removed = false;
  bool finished = false;  // exited 0 as a member: the training function returned
};

// "worker w3 (rank 1) on host a", or without a rank "worker w3 on host a".
std::string describe(const Worker& w);

class WorkerPool {
 public:
  // `job` (its rendezvous port set once the server listens) outlives the pool.
  WorkerPool(const LaunchOptions& options, const JobInfo& job);

  // Starts worker w<N> on slot `slot` of `host`; `hosts` is the job's host list now (it decides
  // the address the worker reaches the rendezvous server by). Throws krug::Error when the
  // worker cannot be started.
  void start(const std::string& host, int slot, const std::vector<HostSlots>& hosts);

  // Waits up to `tick` for output of a worker, which it passes on, or for `wake_fd` to become
  // readable; returns whether it is.
  bool wait(int wake_fd, std::chrono::milliseconds tick);
  // Reaps the workers that exited, calling on_exit for each.
  void reap(const std::function<void(Worker&)>& on_exit);
  // Sends `sig` to every worker's process group.
  void signal(int sig);

  bool empty() const { return workers_.empty(); }
  size_t live() const;      // not reaped yet
  int active() const;       // live and not being removed
  bool pumps_open() const;  // output not at its end yet
  // Whether a live worker that stays holds slot `slot` of `host`.
  bool slot_taken(const std::string& host, int slot) const;

  auto begin() { return workers_.begin(); }
  auto end() { return workers_.end(); }

 private:
  std::string rendezvous_address_for(const std::string& host,
                                     const std::vector<HostSlots>& hosts) const;
  bool is_local(const std::string& host) const;

  const LaunchOptions& o_;
  const JobInfo& job_;
  SshOptions ssh_;
  std::string this_host_;
  std::vector<std::string> my_addresses_;
  EnvMap base_env_;
  int next_worker_ = 0;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace krug::run
