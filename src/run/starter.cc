#include "run/starter.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "krug/types.h"

namespace krug::run {
namespace {

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// Runs in the forked child. krugrun has threads (the rendezvous server), so only
// async-signal-safe calls are allowed between fork and exec: everything is prepared beforehand.
[[noreturn]] void exec_child(pid_t parent, char* const* argv, char* const* envp, int out_fd,
                             int err_fd, int status_fd) {
  ::setpgid(0, 0);
  // Die with krugrun even if it is SIGKILLed; the check closes the race with a parent that
  // died before prctl ran.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);
  // krugrun blocks the signals it reads through signalfd and ignores SIGPIPE; ranks start clean.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGPIPE, &dfl, nullptr);
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);

  int null_fd = ::open("/dev/null", O_RDONLY);
  if (null_fd >= 0) ::dup2(null_fd, 0);
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  // Descriptors opened by libraries without O_CLOEXEC (sockets of the rendezvous server) must
  // not leak into ranks; the status pipe is close-on-exec already, so this keeps it usable.
  ::close_range(3, UINT_MAX, CLOSE_RANGE_CLOEXEC);
  ::execvpe(argv[0], argv, envp);
  int e = errno;
  ssize_t ignored = ::write(status_fd, &e, sizeof(e));
  (void)ignored;
  ::_exit(127);
}

}  // namespace

StartedRank LocalStarter::start(const RankLaunch& launch) {
  if (launch.argv.empty()) throw Error("krugrun: empty command");
  Pipe out = make_pipe(), err = make_pipe(), status = make_pipe();
  std::vector<char*> argv = c_strings(launch.argv);
  std::vector<char*> envp = c_strings(launch.envp);
  pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("krugrun: fork failed: ") + std::strerror(errno));
  if (pid == 0)
    exec_child(parent, argv.data(), envp.data(), out.write.get(), err.write.get(), status.write.get());

  RankProcess process(pid);
  // Also set here so the group exists before we might signal it (the child may not have run).
  ::setpgid(pid, pid);
  out.write.reset();
  err.write.reset();
  status.write.reset();

  // The status pipe closes on a successful exec; an errno arrives when exec failed.
  int child_errno = 0;
  ssize_t n;
  do n = ::read(status.read.get(), &child_errno, sizeof(child_errno));
  while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(child_errno)))
    throw Error("krugrun: cannot start rank " + std::to_string(launch.slot.rank) + " on host " +
                launch.slot.host + ": '" + launch.argv[0] + "': " + std::strerror(child_errno));
  return StartedRank{std::move(process), std::move(out.read), std::move(err.read)};
}

std::unique_ptr<RankStarter> make_starter(const std::string& host,
                                          const std::string& this_hostname) {
  if (is_local_host(host, this_hostname)) return std::make_unique<LocalStarter>();
  throw Error("krugrun: host '" + host +
              "' is remote; starting ranks on remote hosts needs ssh support, which is not built "
              "yet. Use localhost, 127.0.0.1 or " + this_hostname + ".");
}

}  // namespace krug::run
