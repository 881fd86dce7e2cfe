// The timeline (rank 0) as an engine observer: each tensor's NEGOTIATE_<OP> phase from
// submission to decision, QUEUE until its collective starts, the collective, and a marker per
// negotiation round. Started by KRUG_TIMELINE at init, or at run time (Engine::start_timeline).
#pragma once

#include <string>
#include <string_view>
#include <unordered_set>

#include "engine/observer.h"
#include "observe/timeline.h"

namespace krug::engine {

// KRUG_TIMELINE=DYNAMIC (Horovod's value): no file at init; start_timeline() opens one later.
inline constexpr std::string_view kTimelineAtRunTime = "DYNAMIC";

class TimelineObserver : public CycleObserver {
 public:
  // Throws krug::Error naming `path` if it cannot be written.
  TimelineObserver(const std::string& path, bool mark_cycles)
      : path_(path), timeline_(path), mark_cycles_(mark_cycles) {}

  // Where the executor records the phases inside a collective (fusion copies, the reduction).
  observe::Timeline& timeline() { return timeline_; }
  const std::string& path() const { return path_; }
  // KRUG_TIMELINE_MARK_CYCLES, or start_timeline's mark_cycles; with the loop's lock held.
  void set_mark_cycles(bool mark) { mark_cycles_ = mark; }

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
  const std::string path_;
  observe::Timeline timeline_;
  bool mark_cycles_;
  // Names whose NEGOTIATE phase this timeline began. One started at run time hears decisions
  // on names submitted before it; ending their phase would leave an end without a begin.
  std::unordered_set<std::string> negotiating_;
};

// "ALLREDUCE" for an allreduce: the name of an op's phases on the timeline.
std::string phase_name(controller::OpType op);

}  // namespace krug::engine
