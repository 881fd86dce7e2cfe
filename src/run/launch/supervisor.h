// Watches a job's ranks in one poll() loop: forwards their output, reaps them, and on the first
// failure (or SIGINT / SIGTERM to krugrun) stops the others: SIGTERM, then SIGKILL after a grace.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "run/cli/hosts.h"
#include "run/launch/fd.h"
#include "run/launch/output.h"
#include "run/launch/process.h"

namespace krug::run {

struct SupervisedRank {
  RankSlot slot;
  RankProcess process;
  StreamPump out;
  StreamPump err;
  bool remote = false;  // started over ssh: its status is ssh's
  Fd stdin_keepalive;   // closed when the rank is reaped (see StartedRank)
};

class Supervisor {
 public:
  // How long stopped ranks get between SIGTERM and SIGKILL.
  static constexpr std::chrono::seconds kGrace{5};
  // How long output of exited ranks may still be drained (a descendant may hold the pipe).
  static constexpr std::chrono::seconds kDrain{1};
  // A rank killed by a signal makes its peers fail, and a peer can be reaped first: the kernel
  // closes a dying process's sockets before it can be reaped. A rank found killed by a signal
  // krugrun did not send within this long of the first failure is taken as the cause instead.
  static constexpr std::chrono::seconds kCauseWindow{1};

  // `name`, when given, is how messages call the one supervised process (krugrun --mpi
  // supervises "mpirun"); otherwise each is "rank N on host H".
  Supervisor(std::vector<SupervisedRank> ranks, Fd signal_fd, bool verbose, std::string name = {});
  // Runs until every rank is gone; returns krugrun's exit code: 0 when all ranks exit 0, the
  // first failing rank's exit code (128 + signal if killed), or 128 + krugrun's own signal.
  int run();

 private:
  using Clock = std::chrono::steady_clock;
  enum class Stop { kNone, kFailure, kSignal };

  bool done() const;
  int poll_timeout_ms() const;
  void on_signals();
  void on_signal(int sig);
  void reap();
  bool killed(size_t index) const;  // ended by a signal on its host
  // Ended by a signal krugrun did not send it (krugrun's first is SIGTERM, at a stop).
  bool killed_from_outside(size_t index) const;
  void on_exit(size_t index);
  void begin_stop(Stop why);
  void signal_all(int sig);
  void check_deadlines();
  int summarize() const;
  std::string who(size_t index) const;
  std::string status_of(size_t index) const;

  std::vector<SupervisedRank> ranks_;
  Fd signal_fd_;
  bool verbose_;
  std::string name_;
  Stop stop_ = Stop::kNone;
  bool killed_ = false;
  Clock::time_point kill_at_{};
  Clock::time_point cause_window_end_{};
  std::optional<Clock::time_point> drain_until_;
  int own_signal_ = 0;                // the signal that made krugrun stop its ranks
  std::optional<size_t> root_cause_;  // first rank to fail
  std::vector<size_t> also_stopped_;  // ranks that failed afterwards, in order
};

}  // namespace krug::run
