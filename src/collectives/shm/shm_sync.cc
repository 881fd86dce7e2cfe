#include "collectives/shm/shm_sync.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <csignal>
#include <ctime>

namespace krug::collectives::shm {
namespace {

uint32_t* word_of(std::atomic<uint32_t>& value) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  return reinterpret_cast<uint32_t*>(&value);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

void futex_wait(uint32_t* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) return;
  const auto ns = timeout.count();
  const timespec t{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  ::syscall(SYS_futex, word, FUTEX_WAIT, expected, &t, nullptr, 0);
}

void futex_wake_all(uint32_t* word) {
  ::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void publish(Counter& counter, uint32_t value) {
  // Sequentially consistent store then load, against the waiter's increment of `sleepers`
  // followed by futex_wait's check of `value`: one of the two sides always sees the other.
  counter.value.store(value, std::memory_order_seq_cst);
  if (counter.sleepers.load(std::memory_order_seq_cst) != 0) wake_all(counter);
}

void wake_all(Counter& counter) {
  futex_wake_all(word_of(counter.value));
}

std::string wait_for(Counter& counter, uint32_t target, const WaitContext& context) {
  using Clock = std::chrono::steady_clock;
  if (reached(counter.value.load(std::memory_order_acquire), target)) return {};
  const auto spin_until = Clock::now() + context.spin;
  while (Clock::now() < spin_until) {
    for (int i = 0; i < 64; ++i) {
      if (reached(counter.value.load(std::memory_order_acquire), target)) return {};
      cpu_relax();
    }
  }
  // Sleep in slices, so a dead peer, an abort or the deadline is noticed within one slice.
  constexpr auto kSlice = std::chrono::milliseconds(50);
  counter.sleepers.fetch_add(1, std::memory_order_seq_cst);
  std::string stopped;
  for (;;) {
    const uint32_t seen = counter.value.load(std::memory_order_seq_cst);
    if (reached(seen, target)) break;
    const auto now = Clock::now();
    if (now >= context.deadline) {
      stopped = "timeout";
      break;
    }
    const auto slice = std::min<Clock::duration>(kSlice, context.deadline - now);
    futex_wait(word_of(counter.value), seen,
               std::chrono::duration_cast<std::chrono::nanoseconds>(slice));
    if (reached(counter.value.load(std::memory_order_acquire), target)) break;
    if (context.check) {
      stopped = context.check();
      if (!stopped.empty()) break;
    }
  }
  counter.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_acquire);
  return stopped;
}

bool process_alive(pid_t pid) { return pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH; }

}  // namespace krug::collectives::shm
