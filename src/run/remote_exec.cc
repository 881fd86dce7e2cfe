#include "run/remote_exec.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "run/hosts.h"

namespace krug::run {
namespace {

constexpr auto kGrace = std::chrono::seconds(5);

int fail(const std::string& message, int code) {
  std::fprintf(stderr, "krugrun on host %s: %s\n", local_hostname().c_str(), message.c_str());
  return code;
}

}  // namespace

int remote_exec_main(int argc, char** argv) {
  int i = 2;  // argv[1] is "__remote-exec"
  std::string cwd;
  if (i + 1 < argc && std::strcmp(argv[i], "--cwd") == 0) {
    cwd = argv[i + 1];
    i += 2;
  }
  for (; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    const char* eq = std::strchr(argv[i], '=');
    if (eq == nullptr) return fail(std::string("bad environment entry '") + argv[i] + "'", 126);
    ::setenv(std::string(static_cast<const char*>(argv[i]), eq).c_str(), eq + 1, 1);
  }
  if (i + 1 >= argc) return fail("no command to run", 126);
  char** command = argv + i + 1;
  if (!cwd.empty() && ::chdir(cwd.c_str()) != 0)
    return fail("cannot enter the working directory " + cwd + ": " + std::strerror(errno) +
                    " (krugrun runs remote ranks in its own working directory: it must exist on "
                    "every host)",
                126);

  sigset_t handled;
  ::sigemptyset(&handled);
  for (int sig : {SIGCHLD, SIGTERM, SIGHUP, SIGINT}) ::sigaddset(&handled, sig);
  ::sigprocmask(SIG_BLOCK, &handled, nullptr);
  int sfd = ::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) return fail(std::string("signalfd failed: ") + std::strerror(errno), 126);

  int status_pipe[2];
  if (::pipe2(status_pipe, O_CLOEXEC) != 0)
    return fail(std::string("pipe failed: ") + std::strerror(errno), 126);
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) return fail(std::string("fork failed: ") + std::strerror(errno), 126);
  if (child == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::execvp(command[0], command);
    int e = errno;
    ssize_t ignored = ::write(status_pipe[1], &e, sizeof(e));
    (void)ignored;
    ::_exit(127);
  }
  ::setpgid(child, child);
  ::close(status_pipe[1]);
  int child_errno = 0;
  ssize_t n;
  do n = ::read(status_pipe[0], &child_errno, sizeof(child_errno));
  while (n < 0 && errno == EINTR);
  ::close(status_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    ::waitpid(child, nullptr, 0);
    return fail(std::string("cannot start '") + command[0] + "': " + std::strerror(child_errno),
                127);
  }

  using Clock = std::chrono::steady_clock;
  bool stdin_open = true, stopping = false;
  Clock::time_point kill_at{};
  while (true) {
    pollfd fds[2] = {{sfd, POLLIN, 0}, {0, POLLIN, 0}};
    int timeout = -1;
    if (stopping)
      timeout = static_cast<int>(std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - Clock::now()).count()));
    int ready = ::poll(fds, stdin_open ? 2 : 1, timeout);
    if (ready < 0 && errno != EINTR) break;
    bool stop_now = false;
    if (stdin_open && fds[1].revents != 0) {
      char buf[256];
      ssize_t got = ::read(0, buf, sizeof(buf));
      if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) {
        stdin_open = false;  // ssh session over: krugrun is gone or stopping this rank
        stop_now = true;
      }
    }
    if (fds[0].revents != 0) {
      signalfd_siginfo info;
      while (::read(sfd, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info)))
        if (info.ssi_signo != SIGCHLD) stop_now = true;
      int st = 0;
      if (::waitpid(child, &st, WNOHANG) == child) {
        ::kill(-child, SIGKILL);  // descendants left in the group must not outlive the rank
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
    }
    if (stop_now && !stopping) {
      stopping = true;
      kill_at = Clock::now() + kGrace;
      ::kill(-child, SIGTERM);
    } else if (stopping && Clock::now() >= kill_at) {
      ::kill(-child, SIGKILL);
      kill_at = Clock::now() + std::chrono::hours(1);
    }
  }
  ::kill(-child, SIGKILL);
  int st = 0;
  ::waitpid(child, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace krug::run
