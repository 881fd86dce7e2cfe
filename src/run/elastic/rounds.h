// The elastic driver's rendezvous rounds (docs/elastic.md): each worker's init() asks for its rank
// in the next round through the store; once every live worker has asked, the leaving ones are
// told so and the others form the round, if there are at least --min-np of them. Also the hosts
// version the workers watch, whose change interrupts them at their next commit.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/elastic_protocol.h"
#include "rendezvous/store.h"
#include "run/cli/options.h"
#include "run/elastic/workers.h"

namespace krug::run {

// What the rounds ask of the driver: to stop the job with this exit code, saying why.
struct StopRequest {
  int code = 1;
  std::string message;
};

class ElasticRounds {
 public:
  using Clock = std::chrono::steady_clock;

  // Publishes the first hosts version.
  ElasticRounds(rendezvous::Store& store, const ElasticOptions& options);

  // The job's hosts changed (`addition`: a worker was added): the workers' next commit is
  // interrupted so that a round can take the change in.
  void hosts_changed(bool addition);

  // Notes which live workers have asked for their next rank.
  void collect_joins(WorkerPool& workers);

  // Forms the next round if every live worker has asked for it; `finished`: a worker completed
  // training, so the job is over and those asking leave. `host_order` orders new workers.
  struct Outcome {
    std::optional<StopRequest> stop;
    bool started = false;  // a round started
  };
  Outcome form(WorkerPool& workers, const std::vector<HostSlots>& host_order, bool finished,
               Clock::time_point now);

  int64_t round() const { return round_; }  // -1 before the first
  int resets() const { return resets_; }

 private:
  void publish_hosts_version();
  void tell(Worker& w, const rendezvous::elastic::Assignment& a);
  std::optional<StopRequest> broken_round_timed_out(const std::vector<Worker*>& waiting,
                                                    const std::vector<Worker*>& absent,
                                                    double waited) const;
  std::vector<Worker*> release_removed(const std::vector<Worker*>& waiting, bool finished);
  std::optional<StopRequest> too_few_members(size_t count, double waited);
  void start_round(const std::vector<Worker*>& members, WorkerPool& workers,
                   const std::vector<HostSlots>& host_order);

  rendezvous::Store& store_;
  const ElasticOptions& e_;
  rendezvous::elastic::HostsVersion version_;
  int64_t round_ = -1;
  int resets_ = 0;
  std::optional<Clock::time_point> waiting_since_;
  bool warned_min_np_ = false;
};

}  // namespace krug::run
