#include "run/launch/starter.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "krug/types.h"
#include "run/launch/ssh.h"

namespace krug::run {
namespace {

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// Puts `sig` back to its default action and unblocks every signal.
void restore_default_signals(int sig) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(sig, &dfl, nullptr);
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

// Tells the parent, through the status pipe, why the child could not run the program.
[[noreturn]] void fail_to_parent(int status_fd) {
  int e = errno;
  ssize_t ignored = ::write(status_fd, &e, sizeof(e));
  (void)ignored;
  ::_exit(127);
}

// The program's side of a forked child, up to exec: signals reset, stdio wired, krugrun's
// descriptors closed on exec. exec's errno goes to `status_fd`.
[[noreturn]] void exec_program(char* const* argv, char* const* envp, int in_fd, int out_fd,
                               int err_fd, int status_fd) {
  // krugrun blocks the signals it reads through signalfd and ignores SIGPIPE; ranks start clean.
  restore_default_signals(SIGPIPE);

  int null_fd = in_fd >= 0 ? in_fd : ::open("/dev/null", O_RDONLY);
  if (null_fd >= 0) ::dup2(null_fd, 0);
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  // Descriptors opened by libraries without O_CLOEXEC (sockets of the rendezvous server) must
  // not leak into ranks; the status pipe is close-on-exec already, so this keeps it usable.
  ::close_range(3, UINT_MAX, CLOSE_RANGE_CLOEXEC);
  ::execvpe(argv[0], argv, envp);
  fail_to_parent(status_fd);
}

// The keeper's side: waits for the program and ends as it ended (the supervisor reads the
// keeper's status as the program's). It holds none of krugrun's descriptors, and with every
// signal blocked only SIGKILL ends it early: krugrun's death, or the supervisor's last resort,
// which reaches the program too (one process group).
[[noreturn]] void keep(pid_t program) {
  ::close_range(0, UINT_MAX, 0);
  int status = 0;
  while (::waitpid(program, &status, 0) < 0 && errno == EINTR) continue;
  if (WIFSIGNALED(status)) {
    restore_default_signals(WTERMSIG(status));
    ::kill(::getpid(), WTERMSIG(status));
  }
  ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 127);
}

// Runs in the forked child. krugrun has threads (the rendezvous server), so only
// async-signal-safe calls are allowed between fork and exec: everything is prepared beforehand.
[[noreturn]] void exec_child(pid_t parent, char* const* argv, char* const* envp, int in_fd,
                             int out_fd, int err_fd, int status_fd, int death_signal) {
  ::setpgid(0, 0);
  // Die with krugrun even if it is SIGKILLed; the check closes the race with a parent that
  // died before prctl ran.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);
  if (death_signal == SIGKILL) exec_program(argv, envp, in_fd, out_fd, err_fd, status_fd);

  // A signal the program acts on must come once. The kernel sends the parent-death signal each
  // time the child passes to another parent, and as a SIGKILLed krugrun's threads exit one by
  // one a child may pass from thread to thread: mpirun got SIGTERM twice in 2 of 8 kills, took
  // the second for "abort now" and left its ranks running. So a single-threaded keeper stands
  // between them: it dies with krugrun (repeats of SIGKILL do no harm), and its death sends the
  // program `death_signal` once.
  sigset_t all;
  ::sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);
  const pid_t keeper = ::getpid();
  const pid_t program = ::fork();
  if (program < 0) fail_to_parent(status_fd);
  if (program == 0) {
    ::prctl(PR_SET_PDEATHSIG, death_signal);
    if (::getppid() != keeper) ::_exit(127);
    exec_program(argv, envp, in_fd, out_fd, err_fd, status_fd);
  }
  keep(program);
}

}  // namespace

StartedRank spawn_process(const std::vector<std::string>& argv_strings,
                          const std::vector<std::string>& envp_strings, bool stdin_pipe,
                          const std::string& what, int death_signal) {
  if (argv_strings.empty()) throw Error("krugrun: empty command");
  Pipe out = make_pipe(), err = make_pipe(), status = make_pipe();
  Pipe in;
  if (stdin_pipe) in = make_pipe();
  std::vector<char*> argv = c_strings(argv_strings);
  std::vector<char*> envp = c_strings(envp_strings);
  pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("krugrun: fork failed: ") + std::strerror(errno));
  if (pid == 0)
    exec_child(parent, argv.data(), envp.data(), in.read.get(), out.write.get(), err.write.get(),
               status.write.get(), death_signal);

  RankProcess process(pid);
  // Also set here so the group exists before we might signal it (the child may not have run).
  ::setpgid(pid, pid);
  out.write.reset();
  err.write.reset();
  status.write.reset();
  in.read.reset();

  // The status pipe closes on a successful exec; an errno arrives when exec failed.
  int child_errno = 0;
  ssize_t n;
  do n = ::read(status.read.get(), &child_errno, sizeof(child_errno));
  while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(child_errno)))
    throw Error("krugrun: cannot start " + what + ": '" + argv_strings[0] +
                "': " + std::strerror(child_errno));
  return StartedRank{std::move(process), std::move(out.read), std::move(err.read),
                     std::move(in.write)};
}

std::string describe_rank(const RankSlot& slot) {
  return "rank " + std::to_string(slot.rank) + " on host " + slot.host;
}

StartedRank LocalStarter::start(const RankLaunch& launch) {
  return spawn_process(launch.argv, launch.envp, false, describe_rank(launch.slot));
}

std::unique_ptr<RankStarter> make_starter(const std::string& host, const std::string& this_hostname,
                                          const std::vector<std::string>& local_addresses,
                                          const SshOptions& ssh) {
  if (is_local_host(host, this_hostname, local_addresses)) return std::make_unique<LocalStarter>();
  return std::make_unique<SshStarter>(ssh);
}

}  // namespace krug::run
