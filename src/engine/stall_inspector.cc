#include "engine/stall_inspector.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "common/log.h"

namespace krug::engine {
namespace {

// A knob's seconds on the clock, rounded up (a check at t + span(s) must see s reached), and
// capped at 30 years, which the clock's 64-bit nanoseconds hold.
Clock::duration span(double seconds) {
  return std::chrono::ceil<Clock::duration>(Seconds(std::min(seconds, 1e9)));
}

Clock::time_point after(Clock::time_point t, double seconds) {
  return t + span(seconds);
}

bool takes_part(int rank, const controller::Stall& s) {
  auto has = [rank](const std::vector<int32_t>& ranks) {
    return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
  };
  return has(s.ready_ranks) || has(s.missing_ranks);
}

}  // namespace

std::string stall_warning(double check_seconds, const std::vector<controller::Stall>& stalls) {
  return fmt::format(
      "stalled operations: some ranks submitted them, others have not after {} s "
      "(a rank may be stuck, or ranks submit different names):{}",
      check_seconds, controller::describe(stalls));
}

void log_stalls_of_rank(int rank, double check_seconds,
                        const std::vector<controller::Stall>& stalls) {
  std::vector<controller::Stall> own;
  std::copy_if(stalls.begin(), stalls.end(), std::back_inserter(own),
               [rank](const controller::Stall& s) { return takes_part(rank, s); });
  if (!own.empty()) log::at(log::Level::kWarning, rank, "{}", stall_warning(check_seconds, own));
}

double StallInspector::warn_after() const {
  const double check = config_.stall_check_time.count();
  const double stop = config_.stall_shutdown_time.count();
  return stop > 0 ? std::min(check, stop) : check;
}

void StallInspector::on_cycle(Clock::time_point now, const controller::ReadinessStats&) {
  if (!negotiator_.has_pending() || now < next_check_) return;
  const double check = config_.stall_check_time.count();
  const double stop = config_.stall_shutdown_time.count();
  auto stalls = negotiator_.stalls(now, warn_after());
  if (!stalls.empty() && (now >= next_warning_ || any_new(stalls))) {
    log::at(log::Level::kWarning, config_.rank, "{}", stall_warning(check, stalls));
    knobs_.announce_stalls(stalls);
    next_warning_ = after(now, check);
  }
  reported_.clear();
  for (const auto& s : stalls) reported_.emplace(s.process_set, s.name);
  if (stop > 0 && !negotiator_.stalls(now, stop).empty()) {
    knobs_.stop(
        fmt::format("stalled for more than {} s (KRUG_STALL_SHUTDOWN_TIME_SECONDS), "
                    "stopping the job:{}",
                    stop, controller::describe(stalls)));
    return;
  }
  next_check_ = next_check(now, !stalls.empty());
}

bool StallInspector::any_new(const std::vector<controller::Stall>& stalls) const {
  return std::any_of(stalls.begin(), stalls.end(), [this](const controller::Stall& s) {
    return !reported_.contains(Key{s.process_set, s.name});
  });
}

Clock::time_point StallInspector::next_check(Clock::time_point now, bool stalled) const {
  std::optional<Clock::time_point> at;
  auto consider = [&](Clock::time_point t) { at = at ? std::min(*at, t) : t; };
  if (stalled) consider(next_warning_);
  // The next operation to become a stall is the longest-waiting of those that are not yet; one
  // that completes meanwhile only makes this check early.
  const double warn = warn_after();
  if (auto first = negotiator_.oldest_pending(now - span(warn))) consider(after(*first, warn));
  const double stop = config_.stall_shutdown_time.count();
  if (auto oldest = negotiator_.oldest_pending(); oldest && stop > 0)
    consider(after(*oldest, stop));
  // Never the same instant again: a limit that rounding put a hair away is met a moment later.
  return std::max(at.value_or(now), now + std::chrono::milliseconds(1));
}

std::optional<Clock::time_point> StallInspector::wake_at() const {
  if (!negotiator_.has_pending()) return std::nullopt;
  return next_check_;
}

}  // namespace krug::engine
