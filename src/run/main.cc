// krugrun: starts -np ranks of a command with the krug / Horovod environment, forwards their
// output and turns the first failure into a stopped job and a non-zero exit.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "krug/types.h"
#include "rendezvous/server.h"
#include "run/hosts.h"
#include "run/mpi_run.h"
#include "run/options.h"
#include "run/rank_env.h"
#include "run/signals.h"
#include "run/starter.h"
#include "run/supervisor.h"

namespace krug::run {
namespace {

constexpr const char* kLocalBindAddr = "127.0.0.1";

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v) s += (s.empty() ? "" : " ") + a;
  return s;
}

std::pair<Fd, Fd> output_files(const std::string& dir, int rank) {
  if (dir.empty()) return {};
  std::filesystem::path rank_dir = std::filesystem::path(dir) / fmt::format("rank.{}", rank);
  std::error_code ec;
  std::filesystem::create_directories(rank_dir, ec);
  if (ec) throw Error("krugrun: cannot create '" + rank_dir.string() + "': " + ec.message());
  return {open_for_writing((rank_dir / "stdout").string()),
          open_for_writing((rank_dir / "stderr").string())};
}

int launch(const LaunchOptions& options) {
  std::string this_host = local_hostname();
  std::vector<RankSlot> layout = layout_ranks(options.hosts, options.np);
  // Pick every rank's starter before anything starts, so a remote host fails fast.
  std::vector<std::unique_ptr<RankStarter>> starters;
  for (const auto& slot : layout) starters.push_back(make_starter(slot.host, this_host));

  Fd signal_fd = open_signal_fd();
  JobInfo job{kLocalBindAddr, 0, rendezvous::make_job_secret(), make_job_id(),
              build_python_dir()};
  rendezvous::RendezvousServer server(kLocalBindAddr, 0, job.secret, [](const std::string& m) {
    std::fprintf(stderr, "krugrun: rendezvous: %s\n", m.c_str());
  });
  job.rendezvous_port = server.port();
  if (options.verbose)
    fmt::print(stderr, "krugrun: job {}: {} ranks on {} host(s), rendezvous server at {}:{}\n",
               job.job_id, options.np, layout.back().cross_size, job.rendezvous_addr,
               job.rendezvous_port);

  EnvMap base = current_environment();
  std::vector<SupervisedRank> ranks;
  ranks.reserve(layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    const RankSlot& slot = layout[i];
    RankLaunch launch{slot, options.command,
                      to_envp(rank_environment(base, options, slot, job)), options.forward_env};
    auto [out_file, err_file] = output_files(options.output_dir, slot.rank);
    StartedRank started = starters[i]->start(launch);
    if (options.verbose)
      fmt::print(stderr, "krugrun: rank {}: pid {} on host {}: {}\n", slot.rank,
                 started.process.pid(), slot.host, join(options.command));
    std::string out_prefix = options.prefix ? output_prefix(slot.rank, false) : "";
    std::string err_prefix = options.prefix ? output_prefix(slot.rank, true) : "";
    ranks.push_back(SupervisedRank{
        slot, std::move(started.process),
        StreamPump(std::move(started.stdout_pipe), STDOUT_FILENO, out_prefix, std::move(out_file)),
        StreamPump(std::move(started.stderr_pipe), STDERR_FILENO, err_prefix, std::move(err_file))});
  }
  // The server outlives the supervisor: it is destroyed only after every rank is gone.
  return Supervisor(std::move(ranks), std::move(signal_fd), options.verbose).run();
}

}  // namespace
}  // namespace krug::run

int main(int argc, char** argv) {
  // Before any thread starts (the rendezvous server has one), so all threads inherit the mask.
  krug::run::block_supervised_signals();
  auto parsed = krug::run::parse_command_line(argc, argv);
  if (const int* code = std::get_if<int>(&parsed)) return *code;
  try {
    const auto& options = std::get<krug::run::LaunchOptions>(parsed);
    return options.mpi ? krug::run::launch_mpi(options) : krug::run::launch(options);
  } catch (const krug::Error& e) {
    // Ranks already started were killed and reaped by their RankProcess destructors.
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "krugrun: %s\n", e.what());
    return 1;
  }
}
