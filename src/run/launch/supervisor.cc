#include "run/launch/supervisor.h"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "krug/types.h"

namespace krug::run {

Supervisor::Supervisor(std::vector<SupervisedRank> ranks, Fd signal_fd, bool verbose,
                       std::string name)
    : ranks_(std::move(ranks)),
      signal_fd_(std::move(signal_fd)),
      verbose_(verbose),
      name_(std::move(name)) {}

std::string Supervisor::who(size_t i) const {
  if (!name_.empty()) return name_;
  return fmt::format("rank {} on host {}", ranks_[i].slot.rank, ranks_[i].slot.host);
}

std::string Supervisor::status_of(size_t i) const {
  int status = *ranks_[i].process.status();
  return ranks_[i].remote ? describe_remote_status(status) : describe_wait_status(status);
}

int Supervisor::run() {
  // A signal that arrived while ranks were being started is pending in the signalfd and is
  // handled by the first iteration; so is a rank that already exited.
  reap();
  while (!done()) {
    std::vector<pollfd> fds;
    std::vector<StreamPump*> pumps;
    fds.push_back({signal_fd_.get(), POLLIN, 0});
    for (auto& r : ranks_)
      for (StreamPump* p : {&r.out, &r.err})
        if (p->open()) {
          fds.push_back({p->fd(), POLLIN, 0});
          pumps.push_back(p);
        }
    int n = ::poll(fds.data(), fds.size(), poll_timeout_ms());
    if (n < 0 && errno != EINTR)
      throw Error(std::string("krugrun: poll failed: ") + std::strerror(errno));
    if (n > 0) {
      if (fds[0].revents != 0) on_signals();
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents != 0) pumps[i - 1]->on_readable();
    }
    check_deadlines();
  }
  return summarize();
}

bool Supervisor::done() const {
  for (const auto& r : ranks_)
    if (!r.process.reaped()) return false;
  if (drain_until_ && Clock::now() >= *drain_until_) return true;
  for (const auto& r : ranks_)
    if (r.out.open() || r.err.open()) return false;
  return true;
}

int Supervisor::poll_timeout_ms() const {
  std::optional<Clock::time_point> next;
  if (stop_ != Stop::kNone && !killed_) next = kill_at_;
  if (drain_until_ && (!next || *drain_until_ < *next)) next = drain_until_;
  if (!next) return -1;  // nothing timed: sleep until a pipe or a signal wakes us
  auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now()).count();
  return static_cast<int>(std::max<int64_t>(left, 0));
}

void Supervisor::on_signals() {
  signalfd_siginfo info;
  while (::read(signal_fd_.get(), &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
    if (info.ssi_signo == SIGCHLD)
      reap();  // SIGCHLDs coalesce, so reap() checks every rank
    else
      on_signal(static_cast<int>(info.ssi_signo));
  }
}

void Supervisor::on_signal(int sig) {
  if (stop_ == Stop::kNone) {
    own_signal_ = sig;
    fmt::print(stderr,
               "krugrun: received {}, stopping all ranks (send it again to kill them now)\n",
               signal_name(sig));
    begin_stop(Stop::kSignal);
  } else if (!killed_) {
    fmt::print(stderr, "krugrun: received {} again, killing all ranks\n", signal_name(sig));
    signal_all(SIGKILL);
    killed_ = true;
  }
}

bool Supervisor::killed(size_t i) const {
  const int status = *ranks_[i].process.status();
  if (!ranks_[i].remote) return WIFSIGNALED(status);
  // ssh reports the remote wrapper's 128 + N; 255 is ssh's own failure.
  return WIFEXITED(status) && WEXITSTATUS(status) > 128 && WEXITSTATUS(status) != 255;
}

bool Supervisor::killed_from_outside(size_t i) const {
  if (!killed(i)) return false;
  const int status = *ranks_[i].process.status();
  const int sig = ranks_[i].remote ? WEXITSTATUS(status) - 128 : WTERMSIG(status);
  return sig != SIGTERM;
}

void Supervisor::reap() {
  std::vector<size_t> exited;
  for (size_t i = 0; i < ranks_.size(); ++i)
    if (ranks_[i].process.try_reap()) exited.push_back(i);
  // When one sweep finds several ranks gone, one killed by a signal is the likelier cause: the
  // others typically exited with an error because it vanished from under them. (Across sweeps,
  // on_exit's kCauseWindow does the same.)
  std::stable_partition(exited.begin(), exited.end(), [&](size_t i) { return killed(i); });
  for (size_t i : exited) on_exit(i);
  bool all = true;
  for (const auto& r : ranks_) all = all && r.process.reaped();
  if (all && !drain_until_) {
    // Descendants a rank left in its group must not outlive the job (nor hold its pipes open).
    signal_all(SIGKILL);
    drain_until_ = Clock::now() + kDrain;
  }
}

void Supervisor::on_exit(size_t i) {
  int status = *ranks_[i].process.status();
  bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  ranks_[i].stdin_keepalive.reset();
  if (verbose_) fmt::print(stderr, "krugrun: {} {}\n", who(i), status_of(i));
  if (ok) return;
  if (stop_ == Stop::kNone) {
    root_cause_ = i;
    cause_window_end_ = Clock::now() + kCauseWindow;
    fmt::print(stderr, "krugrun: {} {}{}\n", who(i), status_of(i),
               ranks_.size() > 1 ? "; stopping the other ranks" : "");
    begin_stop(Stop::kFailure);
  } else if (stop_ == Stop::kFailure && Clock::now() < cause_window_end_ &&
             killed_from_outside(i) && !killed_from_outside(*root_cause_)) {
    also_stopped_.insert(also_stopped_.begin(), *root_cause_);
    root_cause_ = i;
  } else {
    also_stopped_.push_back(i);
  }
}

void Supervisor::begin_stop(Stop why) {
  stop_ = why;
  signal_all(SIGTERM);
  kill_at_ = Clock::now() + kGrace;
}

void Supervisor::signal_all(int sig) {
  // Reaped ranks too: their groups may still hold descendants (a shell's background jobs).
  for (const auto& r : ranks_) r.process.signal_group(sig);
}

void Supervisor::check_deadlines() {
  if (stop_ != Stop::kNone && !killed_ && Clock::now() >= kill_at_) {
    bool any = false;
    for (const auto& r : ranks_) any = any || !r.process.reaped();
    if (any)
      fmt::print(stderr, "krugrun: ranks still running {} s after SIGTERM, sending SIGKILL\n",
                 kGrace.count());
    signal_all(SIGKILL);
    killed_ = true;
  }
}

int Supervisor::summarize() const {
  if (stop_ == Stop::kNone) return 0;
  // Ranks that ended badly after the stop began are consequences, not causes.
  const char* verb = stop_ == Stop::kFailure ? "also stopped" : "stopped";
  for (size_t i : also_stopped_) {
    const int st = *ranks_[i].process.status();
    // ssh ends with 255 when krugrun stops it: not a second lost connection.
    const bool closed_by_us = ranks_[i].remote && WIFEXITED(st) && WEXITSTATUS(st) == 255;
    fmt::print(stderr, "krugrun: {} {}: {}\n", who(i), verb,
               closed_by_us ? "its ssh session ended (ssh exited with status 255)" : status_of(i));
  }
  if (stop_ == Stop::kSignal) {
    const std::string what = name_.empty() ? fmt::format("{} ranks", ranks_.size()) : name_;
    fmt::print(stderr, "krugrun: stopped {} after {}\n", what, signal_name(own_signal_));
    return 128 + own_signal_;
  }
  // The root cause goes last: it is the line a user sees.
  int status = *ranks_[*root_cause_].process.status();
  fmt::print(stderr, "krugrun: {} {}\n", who(*root_cause_), status_of(*root_cause_));
  return exit_code_of(status);
}

}  // namespace krug::run
