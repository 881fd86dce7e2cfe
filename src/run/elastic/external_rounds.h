// Elastic rounds for workers that another engine starts (krug.spark.run_elastic, krug.ray's
// elastic mode): krugrun's round forming (docs/elastic.md, "What happens when") without its
// process management. The launcher tells it which workers exist and when one ends; it answers
// their init() calls through the job's store: each round's ranks, or removal once the job is
// done. Pure logic over a Store, unit-tested with an in-memory one.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/elastic_protocol.h"
#include "rendezvous/store.h"
#include "run/elastic/plan.h"

namespace krug::run {

struct ExternalRoundsOptions {
  int min_np = 1;                  // a round forms only with at least this many workers
  int reset_limit = -1;            // stop at the (N+1)-th reset; -1: never
  double elastic_timeout_s = 600;  // wait for min_np workers, or for survivors to come back
};

class ExternalRounds {
 public:
  using Clock = std::chrono::steady_clock;
  struct Stop {
    int code = 0;  // 0: training finished; 1: a limit was hit
    std::string message;
  };

  ExternalRounds(rendezvous::Store& store, ExternalRoundsOptions options);

  // A worker with KRUG_ELASTIC_WORKER_ID=`id` was started on `host`. New workers after the first
  // round bump the host version, so the members' next commit() raises HostsUpdatedInterrupt.
  void add_worker(const std::string& id, const std::string& host);
  // Its process ended: status 0 means its training function returned (the job is done), any
  // other status that it failed; the survivors' collectives fail and they re-form without it.
  void worker_exited(const std::string& id, int status);
  // Answers the joins in the store; returns the message of a round formed now, if any.
  std::optional<std::string> tick(Clock::time_point now);
  // Set once the job must end: every worker finished, or a limit was hit.
  const std::optional<Stop>& stopped() const { return stop_; }

 private:
  struct Worker {
    std::string host;
    int slot = 0;
    int64_t seq = 0;
    bool joined = false;
    std::optional<int> rank;
    bool gone = false;
    bool told_removed = false;
  };
  void publish_hosts_version(bool addition);
  void tell(const std::string& id, Worker& w, const rendezvous::elastic::Assignment& a);
  std::optional<std::string> form_round(Clock::time_point now);
  // form_round's steps: stop the job when absent workers of a broken round are overdue; plan
  // the waiting workers (telling them to leave once training finished); assign the ranks.
  void stop_if_absent_too_long(const std::vector<std::string>& waiting,
                               const std::vector<std::string>& absent, double waited);
  std::vector<RoundMember> round_plan(const std::vector<std::string>& waiting);
  std::string start_round(const std::vector<RoundMember>& plan);

  rendezvous::Store& store_;
  ExternalRoundsOptions options_;
  std::map<std::string, Worker> workers_;
  std::vector<std::string> order_;  // worker ids in the order they were added
  std::vector<std::string> hosts_;  // hosts in the order they first appeared
  rendezvous::elastic::HostsVersion version_;
  int64_t round_ = -1;
  int resets_ = 0;
  bool any_finished_ = false;
  std::optional<Clock::time_point> waiting_since_;
  std::optional<Stop> stop_;
};

// `krugrun __elastic-rendezvous [--bind ADDR] [--min-np N] [--reset-limit N]
// [--elastic-timeout S]`: the rendezvous server (as `__rendezvous-server`, secret in
// KRUG_SECRET) plus ExternalRounds. Reads commands on stdin, one a line: `add ID HOST`,
// `exit ID STATUS`; writes events on stdout: `KRUG_RENDEZVOUS_PORT=P` first, `round TEXT` for
// each round, `stop CODE MESSAGE` when the job must end. Ends at stdin's end-of-file.
int elastic_rendezvous_main(int argc, char** argv);

}  // namespace krug::run
