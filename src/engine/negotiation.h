// Negotiation traffic. A worker sends its requests to the coordinator, at once when nothing of
// its own awaits a response and otherwise once per cycle time (so a burst fuses), and reads the
// decided response lists. The coordinator feeds every rank's requests to the negotiator and
// broadcasts what it decides. Both end with a shutdown notice once drained.
#pragma once

#include <poll.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "controller/negotiator.h"
#include "controller/response_cache.h"
#include "engine/control_plane.h"
#include "engine/observer.h"

namespace krug::engine {

class Negotiation {
 public:
  // Where decided lists and failures go: the engine.
  class Sink {
   public:
    virtual ~Sink() = default;
    virtual void process(controller::ResponseList list) = 0;  // executes them in order
    virtual void fatal(std::string message, bool tell_peers) = 0;
    virtual bool stopped() const = 0;
  };

  // All arguments outlive this. `config`'s cycle time is read at every round (the autotuner
  // changes it).
  Negotiation(const Config& config, ControlPlane& control, controller::ResponseCache& cache,
              const Observers& observers, Sink& sink);

  // An operation of this rank to negotiate: as a cache id when `cache_id` >= 0. Inline: it runs
  // once per tensor per step.
  void request(const controller::Request& q, int64_t cache_id) {
    if (cache_id >= 0)
      outgoing_hits_.push_back(static_cast<uint32_t>(cache_id));
    else
      outgoing_.push_back(q);
  }
  // From now on the rank drains: once nothing of its own is in flight, or at `deadline`, it
  // says so (the coordinator then tells everyone).
  void begin_shutdown(Clock::time_point deadline);
  // One round. A worker sends what it may; the coordinator negotiates and broadcasts. A
  // worker's request list may hold its doorbell back: the caller rings it
  // (ControlPlane::ring_doorbells).
  // `drained`: nothing of this rank's is in flight.
  void advance(Clock::time_point now, bool drained);
  // The lists peers sent; `fds`: the control plane's sockets as polled (with revents).
  void receive(const std::vector<pollfd>& fds);
  // `count` of this rank's operations completed.
  void completed(size_t count);

  bool has_outgoing() const { return !outgoing_.empty() || !outgoing_hits_.empty(); }
  bool shutting_down() const { return shutdown_deadline_ != Clock::time_point{}; }
  // When the loop must look again even if nothing arrives (a batch held back by the cycle
  // time, the shutdown deadline); nullopt: not before something arrives.
  std::optional<Clock::time_point> due() const;
  uint64_t lists_seen() const { return lists_seen_; }  // request or response lists received

  // Coordinator only (null on workers).
  const controller::Negotiator* negotiator() const { return negotiator_.get(); }
  void set_fusion_threshold(int64_t bytes);
  // New tuned parameters ride on the next response list to every rank (coordinator).
  void send_tuning(int64_t fusion_threshold_bytes, double cycle_time_ms);
  // So do the stall inspector's reports; a list goes out for them alone (coordinator).
  void send_stalls(std::vector<controller::Stall> stalls) { stalls_to_send_ = std::move(stalls); }

 private:
  void send_requests(Clock::time_point now, bool drained);
  void coordinate(Clock::time_point now, bool drained);
  void receive_responses(const std::vector<pollfd>& fds);
  void receive_requests(const std::vector<pollfd>& fds);
  // A worker asked to shut down: every rank is told.
  void worker_shut_down(int rank);
  // For a shutdown notice: the operations some ranks still wait for (they fail with it), each
  // with the ranks that never submitted it; empty when none.
  std::string still_pending(Clock::time_point now) const;
  std::chrono::microseconds cycle() const;

  const Config& config_;
  ControlPlane& control_;
  const Observers& observers_;
  Sink& sink_;
  std::unique_ptr<controller::Negotiator> negotiator_;  // coordinator only
  std::vector<controller::Request> outgoing_;
  std::vector<uint32_t> outgoing_hits_;
  int awaiting_response_ = 0;
  Clock::time_point last_send_{};
  Clock::time_point shutdown_deadline_{};
  bool shutdown_sent_ = false;
  bool dirty_ = false;  // the negotiator has requests it has not computed over
  std::optional<std::pair<int64_t, double>> tuning_to_send_;
  std::vector<controller::Stall> stalls_to_send_;
  uint64_t lists_seen_ = 0;
};

}  // namespace krug::engine
