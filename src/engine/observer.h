// Observers of the engine: code beside the engine that reads what it does (the timeline, the
// autotuner, the stall inspector, the elastic health report). They run on the loop's thread
// and must not block. Only two may steer, through the engine's knobs (EngineKnobs): the
// autotuner (fusion threshold, cycle time) and the stall inspector (telling every rank of a
// stall, stopping a stalled job).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "controller/message.h"
#include "controller/readiness_stats.h"

namespace krug::engine {

using Clock = std::chrono::steady_clock;

// Every hook has an empty default: an observer overrides what it reads.
class CycleObserver {
 public:
  virtual ~CycleObserver() = default;

  // What the engine must do for this observer beyond the calls themselves (asked once, when
  // the engine starts): per-tensor calls and names of cached responses cost a lookup per
  // tensor, and counting bytes costs one per response.
  struct Interests {
    bool tensors = false;  // on_submitted, on_decided, on_started, on_phase_*
    bool bytes = false;    // on_executed
  };
  virtual Interests interests() const { return {}; }

  // This rank sent `q` for negotiation.
  virtual void on_submitted(const controller::Request& /*q*/, Clock::time_point /*now*/) {}
  // The coordinator is about to compute a negotiation round over new requests.
  virtual void on_round(Clock::time_point /*now*/) {}
  // Told by the coordinator after every negotiation round. `readiness`: when each rank
  // submitted each tensor of the global set, so far (tracked in elastic jobs only; empty
  // otherwise).
  virtual void on_cycle(Clock::time_point /*now*/,
                        const controller::ReadinessStats& /*readiness*/) {}
  // A tensor of this rank was decided (it waits behind earlier responses of the list), then
  // its collective starts; non-allreduce ops' executions as a named phase.
  virtual void on_decided(const std::string& /*name*/, controller::OpType /*op*/,
                          Clock::time_point /*now*/) {}
  virtual void on_started(const std::string& /*name*/, Clock::time_point /*now*/) {}
  virtual void on_phase_begin(const std::string& /*name*/, std::string_view /*phase*/,
                              Clock::time_point /*now*/) {}
  virtual void on_phase_end(const std::string& /*name*/, std::string_view /*phase*/,
                            Clock::time_point /*now*/) {}
  // A response list executed, moving `bytes` of payload.
  virtual void on_executed(int64_t /*bytes*/, Clock::time_point /*now*/) {}
  // When the loop must look again for this observer even if nothing happens (it sleeps
  // otherwise); nullopt: no need.
  virtual std::optional<Clock::time_point> wake_at() const { return std::nullopt; }
};

// The knobs observers may turn; the engine implements them.
class EngineKnobs {
 public:
  virtual ~EngineKnobs() = default;
  // New parameters on every rank (the coordinator sends them with its next response list).
  virtual void retune(int64_t fusion_threshold_bytes, double cycle_time_ms) = 0;
  // Stops the job on every rank with `reason`.
  virtual void stop(const std::string& reason) = 0;
  // Sends the stalls just reported to every rank with the next response list (each logs those
  // it takes part in: its own output then says what it waits for).
  virtual void announce_stalls(std::vector<controller::Stall> stalls) = 0;
};

// The engine's observers and what they want together.
class Observers {
 public:
  void add(std::shared_ptr<CycleObserver> observer) {
    want(*observer);
    all_.push_back(std::move(observer));
  }
  // Removes `observer` (a timeline stopped at run time); what the rest want is asked again, so
  // the loop stops paying for per-tensor calls nobody reads.
  void remove(const CycleObserver* observer) {
    std::erase_if(all_, [&](const auto& o) { return o.get() == observer; });
    tensors_ = bytes_ = false;
    for (const auto& o : all_) want(*o);
  }
  bool tensors() const { return tensors_; }
  bool bytes() const { return bytes_; }
  const std::vector<std::shared_ptr<CycleObserver>>& all() const { return all_; }
  // Calls fn(observer) on every observer.
  template <typename Fn>
  void each(const Fn& fn) const {
    for (const auto& o : all_) fn(*o);
  }

 private:
  void want(const CycleObserver& observer) {
    const auto wants = observer.interests();
    tensors_ = tensors_ || wants.tensors;
    bytes_ = bytes_ || wants.bytes;
  }

  std::vector<std::shared_ptr<CycleObserver>> all_;
  bool tensors_ = false;
  bool bytes_ = false;
};

}  // namespace krug::engine
