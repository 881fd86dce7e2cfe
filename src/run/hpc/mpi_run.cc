#include "run/hpc/mpi_run.h"

#include <fmt/format.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "krug/types.h"
#include "rendezvous/server.h"
#include "run/hpc/mpi_launch.h"
#include "run/launch/signals.h"
#include "run/launch/starter.h"
#include "run/launch/supervisor.h"

namespace krug::run {
namespace {

// The first executable `name` in $PATH, or "" (execvp would search the same way, but its
// failure would read as a rank that cannot start).
std::string find_on_path(std::string_view name) {
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const size_t colon = dirs.find(':');
    std::string dir(dirs.substr(0, colon));
    std::string candidate = (dir.empty() ? "." : dir) + "/" + std::string(name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) return {};
    dirs.remove_prefix(colon + 1);
  }
}

}  // namespace

int launch_mpi(const LaunchOptions& options) {
  const std::string mpirun = find_on_path("mpirun");
  if (mpirun.empty())
    throw Error(
        "krugrun --mpi: mpirun was not found on PATH. Install Open MPI (Debian: "
        "openmpi-bin libopenmpi-dev, see scripts/install-deps), or run without --mpi to "
        "start the ranks with krugrun itself");
  const std::string this_host = local_hostname();
  const RendezvousPlace place = mpi_rendezvous_place(options.hosts, this_host);

  Fd signal_fd = open_signal_fd();
  JobInfo job{place.advertise, 0, rendezvous::make_job_secret(), make_job_id(), build_python_dir()};
  rendezvous::RendezvousServer server(
      place.bind_host, 0, job.secret,
      [](const std::string& m) { std::fprintf(stderr, "krugrun: rendezvous: %s\n", m.c_str()); },
      job_protection(options));
  job.rendezvous_port = server.port();

  const MpirunCommand cmd =
      mpirun_command(options, current_environment(), job, ::geteuid() == 0, mpirun);
  if (options.verbose) {
    std::string line;
    for (const auto& a : cmd.argv) line += (line.empty() ? "" : " ") + a;
    fmt::print(stderr, "krugrun: job {}: rendezvous server at {}:{}; running {}\n", job.job_id,
               job.rendezvous_addr, job.rendezvous_port, line);
  }
  RankSlot slot;
  slot.size = options.np;
  slot.host = this_host;
  // SIGTERM when krugrun dies: mpirun then stops the ranks (SIGKILL after its grace). A
  // SIGKILLed mpirun left them running, as orphans of nobody's job.
  StartedRank started =
      spawn_process(cmd.argv, to_envp(cmd.env), false, "mpirun on host " + this_host, SIGTERM);
  // mpirun tags every line with its rank (--tag-output) unless --no-prefix; mpirun writes the
  // ranks' files itself for --output-filename.
  auto regroup = [&]() -> std::unique_ptr<LineRewriter> {
    if (!options.prefix) return nullptr;
    return std::make_unique<MpirunOutput>();
  };
  std::vector<SupervisedRank> ranks;
  ranks.push_back(SupervisedRank{
      slot, std::move(started.process),
      StreamPump(std::move(started.stdout_pipe), STDOUT_FILENO, "", Fd(), regroup()),
      StreamPump(std::move(started.stderr_pipe), STDERR_FILENO, "", Fd(), regroup()),
      /*remote=*/false, Fd()});
  // The server outlives the supervisor: it is destroyed only after mpirun is gone.
  return Supervisor(std::move(ranks), std::move(signal_fd), options.verbose, "mpirun").run();
}

}  // namespace krug::run
