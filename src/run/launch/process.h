// A started rank's process, owned: unless it has been reaped, destroying it kills its process
// group and reaps it, so no exit path of krugrun (exceptions included) leaves a rank behind.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace krug::run {

class RankProcess {
 public:
  // `pid` leads its own process group (pgid == pid).
  explicit RankProcess(pid_t pid) : pid_(pid) {}
  ~RankProcess();
  RankProcess(RankProcess&& other) noexcept;
  RankProcess& operator=(RankProcess&&) = delete;
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool reaped() const { return status_.has_value(); }
  // The waitpid status once reaped.
  std::optional<int> status() const { return status_; }
  // Reaps without blocking; returns true when the process has just been reaped.
  bool try_reap();
  // Blocks until the process has exited and returns its waitpid status.
  int wait();
  // Signals the whole process group, so children of a shell wrapper get it too. Also used after
  // the leader was reaped, to stop descendants it left behind (ESRCH is fine).
  void signal_group(int sig) const;

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// "exited with status 3" or "was killed by signal 9 (SIGKILL)".
std::string describe_wait_status(int status);
// The same for a rank started over ssh, whose status is ssh's: 255 is a lost connection and
// 128 + N a rank killed by signal N on its host (the remote wrapper's convention).
std::string describe_remote_status(int status);
// The shell convention: the exit status, or 128 + signal number.
int exit_code_of(int status);
// "SIGKILL"; "signal N" for unknown numbers.
std::string signal_name(int sig);

}  // namespace krug::run
