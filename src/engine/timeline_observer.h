// The timeline (KRUG_TIMELINE, rank 0) as an engine observer: each tensor's NEGOTIATE_<OP>
// phase from submission to decision, QUEUE until its collective starts, the collective, and a
// marker per negotiation round.
#pragma once

#include <string>

#include "engine/observer.h"
#include "observe/timeline.h"

namespace krug::engine {

class TimelineObserver : public CycleObserver {
 public:
  // Throws krug::Error naming `path` if it cannot be written.
  TimelineObserver(const std::string& path, bool mark_cycles)
      : timeline_(path), mark_cycles_(mark_cycles) {}

  // Where the executor records the phases inside a collective (fusion copies, the reduction).
  observe::Timeline& timeline() { return timeline_; }

  Interests interests() const override { return {.tensors = true}; }
  void on_submitted(const controller::Request& q, Clock::time_point now) override;
  void on_round(Clock::time_point now) override;
  void on_decided(const std::string& name, controller::OpType op, Clock::time_point now) override;
  void on_started(const std::string& name, Clock::time_point now) override;
  void on_phase_begin(const std::string& name, std::string_view phase,
                      Clock::time_point now) override;
  void on_phase_end(const std::string& name, std::string_view phase,
                    Clock::time_point now) override;

 private:
  observe::Timeline timeline_;
  bool mark_cycles_;  // KRUG_TIMELINE_MARK_CYCLES
};

// "ALLREDUCE" for an allreduce: the name of an op's phases on the timeline.
std::string phase_name(controller::OpType op);

}  // namespace krug::engine
