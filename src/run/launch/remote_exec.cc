#include "run/launch/remote_exec.h"

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
#include <optional>
#include <string>
#include <vector>

#include "krug/types.h"
#include "run/cli/hosts.h"
#include "run/launch/env_block.h"
#include "run/launch/fd.h"
#include "run/launch/thread_share.h"

namespace krug::run {
namespace {

constexpr auto kGrace = std::chrono::seconds(5);
// krugrun writes the environment before ssh even connects: it is there once the session starts.
constexpr auto kEnvironmentWait = std::chrono::seconds(60);

// Why the wrapper could not start the rank, and its exit code (126: set-up, 127: the command).
struct StartFailure {
  std::string message;
  int code;
};

int exit_code_of(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Reads exactly `n` bytes of stdin by `deadline`.
std::string read_stdin(size_t n, std::chrono::steady_clock::time_point deadline) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd in{0, POLLIN, 0};
    const int ready = ::poll(&in, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) throw StartFailure{"krugrun sent no environment within 60 s", 126};
    const ssize_t r = ::read(0, out.data() + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw StartFailure{"krugrun closed the session before sending the environment", 126};
    got += static_cast<size_t>(r);
  }
  return out;
}

// The environment block krugrun sent on stdin (run/launch/env_block.h), applied with setenv.
void apply_environment_from_stdin() {
  const auto deadline = std::chrono::steady_clock::now() + kEnvironmentWait;
  std::string header;
  for (std::string c = read_stdin(1, deadline); c != "\n"; c = read_stdin(1, deadline)) {
    if (header.size() > 20) throw StartFailure{"bad environment header from krugrun", 126};
    header += c;
  }
  try {
    const size_t bytes = parse_env_block_header(header);
    for (const auto& [name, value] : decode_env_block_body(read_stdin(bytes, deadline)))
      ::setenv(name.c_str(), value.c_str(), 1);
  } catch (const Error& e) {
    throw StartFailure{e.what(), 126};
  }
}

std::optional<std::string> env_value(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::optional<std::string>(value) : std::nullopt;
}

// The rank's share of this host's cores, which only this end of ssh knows, and OpenMP's short
// spin (run/launch/thread_share.h).
void share_cores_of_this_host() {
  for (const auto& [name, value] :
       shared_host_settings(env_value, env_value("KRUG_LOCAL_SIZE"), usable_cores()))
    ::setenv(name.c_str(), value.c_str(), 1);
}

// `__remote-exec [--cwd DIR] -- command...`: sets the environment krugrun sends on stdin, enters
// DIR and returns the command.
char** parse_and_apply(int argc, char** argv) {
  int i = 2;  // argv[1] is "__remote-exec"
  std::string cwd;
  if (i + 1 < argc && std::strcmp(argv[i], "--cwd") == 0) {
    cwd = argv[i + 1];
    i += 2;
  }
  if (i >= argc || std::strcmp(argv[i], "--") != 0)
    throw StartFailure{std::string("unexpected argument '") + (i < argc ? argv[i] : "") +
                           "' (krugrun and the krugrun on this host differ in version?)",
                       126};
  if (i + 1 >= argc) throw StartFailure{"no command to run", 126};
  apply_environment_from_stdin();
  share_cores_of_this_host();
  if (!cwd.empty() && ::chdir(cwd.c_str()) != 0)
    throw StartFailure{"cannot enter the working directory " + cwd + ": " + std::strerror(errno) +
                           " (krugrun runs remote ranks in its own working directory: it must "
                           "exist on every host)",
                       126};
  return argv + i + 1;
}

// Blocks the signals the wrapper handles and returns a signalfd that reports them.
Fd stop_signals_fd() {
  sigset_t handled;
  ::sigemptyset(&handled);
  for (int sig : {SIGCHLD, SIGTERM, SIGHUP, SIGINT}) ::sigaddset(&handled, sig);
  ::sigprocmask(SIG_BLOCK, &handled, nullptr);
  Fd sfd(::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sfd) throw StartFailure{std::string("signalfd failed: ") + std::strerror(errno), 126};
  return sfd;
}

// Starts `command` in its own process group, dying with the wrapper; an exec failure comes
// back through a close-on-exec pipe, so it is reported here rather than as a bare 127.
pid_t start_child(char** command) {
  int status_pipe[2];
  if (::pipe2(status_pipe, O_CLOEXEC) != 0)
    throw StartFailure{std::string("pipe failed: ") + std::strerror(errno), 126};
  Fd from_child(status_pipe[0]), to_parent(status_pipe[1]);
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) throw StartFailure{std::string("fork failed: ") + std::strerror(errno), 126};
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
    ssize_t ignored = ::write(to_parent.get(), &e, sizeof(e));
    (void)ignored;
    ::_exit(127);
  }
  ::setpgid(child, child);
  to_parent.reset();
  int child_errno = 0;
  ssize_t n;
  do n = ::read(from_child.get(), &child_errno, sizeof(child_errno));
  while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    ::waitpid(child, nullptr, 0);
    throw StartFailure{
        std::string("cannot start '") + command[0] + "': " + std::strerror(child_errno), 127};
  }
  return child;
}

// Whether stdin reached its end: the ssh session is over (krugrun is gone or stopping us).
bool stdin_closed() {
  char buf[256];
  ssize_t got = ::read(0, buf, sizeof(buf));
  return got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN);
}

// Waits for the rank, forwarding a stop (signal or closed ssh session) as SIGTERM to its group,
// then SIGKILL after the grace period. Returns the rank's exit code in krugrun's convention.
int supervise(pid_t child, const Fd& sfd) {
  using Clock = std::chrono::steady_clock;
  bool stdin_open = true, stopping = false;
  Clock::time_point kill_at{};
  while (true) {
    pollfd fds[2] = {{sfd.get(), POLLIN, 0}, {0, POLLIN, 0}};
    int timeout = -1;
    if (stopping)
      timeout = static_cast<int>(std::max<int64_t>(
          0,
          std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - Clock::now()).count()));
    int ready = ::poll(fds, stdin_open ? 2 : 1, timeout);
    if (ready < 0 && errno != EINTR) break;
    bool stop_now = false;
    if (stdin_open && fds[1].revents != 0 && stdin_closed()) {
      stdin_open = false;
      stop_now = true;
    }
    if (fds[0].revents != 0) {
      signalfd_siginfo info;
      while (::read(sfd.get(), &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info)))
        if (info.ssi_signo != SIGCHLD) stop_now = true;
      int st = 0;
      if (::waitpid(child, &st, WNOHANG) == child) {
        ::kill(-child, SIGKILL);  // descendants left in the group must not outlive the rank
        return exit_code_of(st);
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
  return exit_code_of(st);
}

}  // namespace

int remote_exec_main(int argc, char** argv) {
  try {
    char** command = parse_and_apply(argc, argv);
    Fd sfd = stop_signals_fd();
    return supervise(start_child(command), sfd);
  } catch (const StartFailure& f) {
    std::fprintf(stderr, "krugrun on host %s: %s\n", local_hostname().c_str(), f.message.c_str());
    return f.code;
  }
}

}  // namespace krug::run
