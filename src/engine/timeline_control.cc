// Starting and stopping the timeline while the engine runs (Horovod's hvd.start_timeline and
// hvd.stop_timeline). The observer list and the executor belong to the loop, so the switch
// happens with loop_mu_ held, between two rounds; opening and closing the files (a disk flush)
// happen outside it, so the loop never waits on them. timeline_mu_ orders concurrent calls: a
// file is closed before another call may open it again.
#include <fmt/format.h>

#include <mutex>

#include "engine/engine_impl.h"
#include "engine/timeline_observer.h"

namespace krug::engine {

std::shared_ptr<TimelineObserver> Engine::Impl::swap_timeline(
    std::shared_ptr<TimelineObserver> timeline) {
  auto previous = std::exchange(timeline_, std::move(timeline));
  if (previous) observers_.remove(previous.get());
  if (timeline_) observers_.add(timeline_);
  executor_.set_timeline(timeline_ ? &timeline_->timeline() : nullptr);
  return previous;
}

void Engine::Impl::start_timeline(const std::string& path, bool mark_cycles) {
  if (path.empty())
    throw InvalidArgument("start_timeline(): the file path is empty; pass the file to write");
  // Horovod's rule: only the coordinator writes the timeline (it sees every rank's readiness).
  if (config_.rank != 0) return;
  std::lock_guard switching(timeline_mu_);
  if (timeline_ && timeline_->path() == path) {
    // The file being written: it goes on (as Horovod's does), with this call's mark_cycles.
    std::lock_guard lock(loop_mu_);
    return timeline_->set_mark_cycles(mark_cycles);
  }
  std::shared_ptr<TimelineObserver> next;
  try {
    next = std::make_shared<TimelineObserver>(path, mark_cycles);
  } catch (const Error& e) {
    throw InvalidArgument(
        fmt::format("start_timeline() on rank 0 ({}): {}; pass a path in a "
                    "directory this process may write",
                    config_.hostname, e.what()));
  }
  std::shared_ptr<TimelineObserver> previous;
  {
    std::lock_guard lock(loop_mu_);
    previous = swap_timeline(std::move(next));
  }
  // `previous` (KRUG_TIMELINE's, or an earlier start's) is closed here, a complete file.
}

void Engine::Impl::stop_timeline() {
  std::lock_guard switching(timeline_mu_);
  std::shared_ptr<TimelineObserver> previous;
  {
    std::lock_guard lock(loop_mu_);
    previous = swap_timeline(nullptr);
  }
  // Closed here, outside the loop's lock: its writer drains and the JSON array is closed.
}

void Engine::start_timeline(const std::string& path, bool mark_cycles) {
  impl_->start_timeline(path, mark_cycles);
}

void Engine::stop_timeline() {
  impl_->stop_timeline();
}

}  // namespace krug::engine
