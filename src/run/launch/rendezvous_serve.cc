#include "run/launch/rendezvous_serve.h"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/config.h"
#include "krug/types.h"
#include "rendezvous/server.h"
#include "transport/shm_segment.h"

namespace krug::run {
namespace {

const char* env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// Blocks until stdin reaches end-of-file or SIGTERM / SIGINT / SIGHUP arrives. The signals are
// taken through a signalfd so that the server is destroyed (and its sockets closed) normally.
void wait_for_stop() {
  sigset_t mask;
  sigemptyset(&mask);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&mask, s);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  const int sfd = signalfd(-1, &mask, SFD_CLOEXEC);
  pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {sfd, POLLIN, 0}};
  char buf[256];
  for (;;) {
    if (poll(fds, sfd >= 0 ? 2 : 1, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents != 0) break;
    if (fds[0].revents != 0) {
      const ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;
    }
  }
  if (sfd >= 0) close(sfd);
}

}  // namespace

int rendezvous_serve_main(int argc, char** argv) {
  std::string bind = "127.0.0.1";
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--bind") == 0 && i + 1 < argc) {
      bind = argv[++i];
    } else {
      std::fprintf(stderr,
                   "krugrun __rendezvous-server: unknown argument '%s' (usage: "
                   "krugrun __rendezvous-server [--bind ADDR], secret in KRUG_SECRET)\n",
                   argv[i]);
      return 2;
    }
  }
  const std::string secret = env_or_empty("KRUG_SECRET");
  if (secret.empty()) {
    std::fprintf(stderr,
                 "krugrun __rendezvous-server: KRUG_SECRET is not set; the launcher "
                 "must pass the job's secret in the environment\n");
    return 2;
  }
  try {
    rendezvous::RendezvousServer server(
        bind, 0, secret,
        [](const std::string& m) { std::fprintf(stderr, "krugrun: rendezvous: %s\n", m.c_str()); },
        net::protection_for(load_knobs({"KRUG_ENCRYPT"}).encrypt));
    fmt::print("KRUG_RENDEZVOUS_PORT={}\n", server.port());
    std::fflush(stdout);
    wait_for_stop();
  } catch (const Error& e) {
    std::fprintf(stderr, "krugrun __rendezvous-server: %s\n", e.what());
    return 1;
  }
  if (const std::string job = env_or_empty("KRUG_JOB_ID"); !job.empty())
    transport::remove_job_segments(job);
  return 0;
}

}  // namespace krug::run
