#include "engine/timeline_observer.h"

#include <cctype>

namespace krug::engine {
namespace {

std::string negotiate_phase(controller::OpType op) {
  return "NEGOTIATE_" + phase_name(op);
}

}  // namespace

std::string phase_name(controller::OpType op) {
  std::string u(controller::op_name(op));
  for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return u;
}

void TimelineObserver::on_submitted(const controller::Request& q, Clock::time_point now) {
  negotiating_.insert(q.name);
  timeline_.begin(q.name, negotiate_phase(q.op), now);
}

void TimelineObserver::on_round(Clock::time_point now) {
  if (mark_cycles_) timeline_.mark_cycle(now);
}

void TimelineObserver::on_decided(const std::string& name, controller::OpType op,
                                  Clock::time_point now) {
  if (negotiating_.erase(name) > 0) timeline_.end(name, negotiate_phase(op), now);
  timeline_.begin(name, "QUEUE", now);
}

void TimelineObserver::on_started(const std::string& name, Clock::time_point now) {
  timeline_.end(name, "QUEUE", now);
}

void TimelineObserver::on_phase_begin(const std::string& name, std::string_view phase,
                                      Clock::time_point now) {
  timeline_.begin(name, phase, now);
}

void TimelineObserver::on_phase_end(const std::string& name, std::string_view phase,
                                    Clock::time_point now) {
  timeline_.end(name, phase, now);
}

}  // namespace krug::engine
