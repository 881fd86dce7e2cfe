#include "run/launch/process.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace krug::run {

RankProcess::RankProcess(RankProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), status_(std::exchange(other.status_, std::nullopt)) {}

RankProcess::~RankProcess() {
  if (pid_ <= 0 || reaped()) return;
  signal_group(SIGKILL);
  int st = 0;
  while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
}

int RankProcess::wait() {
  if (!reaped()) {
    int st = 0;
    pid_t r;
    do r = ::waitpid(pid_, &st, 0);
    while (r < 0 && errno == EINTR);
    status_ = r == pid_ ? st : 0;
  }
  return *status_;
}

bool RankProcess::try_reap() {
  if (pid_ <= 0 || reaped()) return false;
  int st = 0;
  pid_t r;
  do r = ::waitpid(pid_, &st, WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r != pid_) return false;
  status_ = st;
  return true;
}

void RankProcess::signal_group(int sig) const {
  if (pid_ > 0) ::kill(-pid_, sig);
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

std::string describe_wait_status(int status) {
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), signal_name(WTERMSIG(status)));
  return fmt::format("exited with status {}", WEXITSTATUS(status));
}

std::string describe_remote_status(int status) {
  if (WIFSIGNALED(status))
    return fmt::format("lost its ssh client: ssh was killed by signal {} ({})", WTERMSIG(status),
                       signal_name(WTERMSIG(status)));
  const int code = WEXITSTATUS(status);
  if (code == 255)
    return "lost its ssh connection (ssh exited with status 255: the host went down, its network "
           "link was cut, or sshd ended the session)";
  if (code == 127)
    return "exited with status 127 on its host (the command, or krugrun at the same path as "
           "here, was not found there)";
  if (code > 128 && code < 128 + 65)
    return fmt::format("was killed by signal {} ({}) on its host", code - 128,
                       signal_name(code - 128));
  return fmt::format("exited with status {}", code);
}

int exit_code_of(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

}  // namespace krug::run
