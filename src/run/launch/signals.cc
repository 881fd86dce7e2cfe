#include "run/launch/signals.h"

#include <signal.h>
#include <sys/signalfd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "krug/types.h"

namespace krug::run {
namespace {
sigset_t supervised() {
  sigset_t set;
  ::sigemptyset(&set);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) ::sigaddset(&set, sig);
  return set;
}
}  // namespace

void block_supervised_signals() {
  sigset_t set = supervised();
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  // A closed stdout must not kill the launcher while ranks still run; writes just fail.
  ::signal(SIGPIPE, SIG_IGN);
}

Fd open_signal_fd() {
  sigset_t set = supervised();
  int fd = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd < 0) throw Error(std::string("krugrun: signalfd failed: ") + std::strerror(errno));
  return Fd(fd);
}

}  // namespace krug::run
