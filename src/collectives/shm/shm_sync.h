// Cross-process step counters in shared memory: publish a value, wait until a peer's counter
// reaches one, with a short spin, then a futex sleep, a deadline, and checks that the peer's
// process is still alive and that no member has aborted the communicator.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace krug::collectives::shm {

// One counter per cache line, so ranks publishing never share a line.
struct alignas(64) Counter {
  std::atomic<uint32_t> value{0};
  std::atomic<uint32_t> sleepers{0};  // waiters inside futex_wait: a publisher wakes only then
};

// Futex operations on a 32-bit word in memory the members share (not FUTEX_PRIVATE: they are
// different processes). futex_wait sleeps while *word == expected, up to `timeout`; it returns
// on a wake-up, a change of the word, a signal or the timeout alike.
void futex_wait(uint32_t* word, uint32_t expected, std::chrono::nanoseconds timeout);
void futex_wake_all(uint32_t* word);

// Wrap-safe "counter has reached target": counters grow by one per step and may wrap.
inline bool reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

// Stores `value` and wakes sleeping waiters.
void publish(Counter& counter, uint32_t value);
// Wakes every waiter of `counter` (used when aborting).
void wake_all(Counter& counter);

struct WaitContext {
  std::chrono::steady_clock::time_point deadline;
  // How long to spin before sleeping: short, because ranks often share cores with other
  // threads, where spinning only delays the peer being waited for.
  std::chrono::nanoseconds spin;
  // Returns a non-empty message when the wait must stop (a member aborted, the peer died).
  std::function<std::string()> check;
};

// Waits until `counter` reaches `target`. Returns an empty string on success, or why it stopped:
// the check's message, or "timeout".
std::string wait_for(Counter& counter, uint32_t target, const WaitContext& context);

// Whether the process `pid` still exists on this host.
bool process_alive(pid_t pid);

}  // namespace krug::collectives::shm
