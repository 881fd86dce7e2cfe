#include "run/elastic/workers.h"

#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "krug/types.h"
#include "net/address.h"
#include "run/launch/starter.h"

namespace krug::run {

std::string describe(const Worker& w) {
  return w.rank ? fmt::format("worker {} (rank {}) on host {}", w.id, *w.rank, w.host)
                : fmt::format("worker {} on host {}", w.id, w.host);
}

WorkerPool::WorkerPool(const LaunchOptions& options, const JobInfo& job)
    : o_(options),
      job_(job),
      ssh_(ssh_options(options)),
      this_host_(local_hostname()),
      my_addresses_(net::local_addresses()),
      base_env_(current_environment()) {}

bool WorkerPool::is_local(const std::string& host) const {
  return is_local_host(host, this_host_, my_addresses_);
}

std::string WorkerPool::rendezvous_address_for(const std::string& host,
                                               const std::vector<HostSlots>& hosts) const {
  if (!o_.network_interface.empty()) return net::interface_address(o_.network_interface);
  // Workers advertise the address they reach the server by, so on a multi-host job even local
  // workers must use one the other hosts can reach: the one on the route to a remote host.
  std::string remote;
  for (const HostSlots& h : hosts)
    if (!is_local(h.host)) remote = h.host;
  if (remote.empty()) return "127.0.0.1";
  return net::source_address_toward(is_local(host) ? remote : host);
}

void WorkerPool::start(const std::string& host, int slot, const std::vector<HostSlots>& hosts) {
  const std::string id = fmt::format("w{}", next_worker_++);
  JobInfo job = job_;
  job.rendezvous_addr = rendezvous_address_for(host, hosts);
  std::vector<std::string> forward = o_.forward_env;
  for (const auto& [name, value] : o_.set_env) forward.push_back(name);
  RankSlot rank_slot;
  rank_slot.host = host;
  rank_slot.rank = slot;
  RankLaunch launch{rank_slot, o_.command,
                    to_envp(elastic_worker_environment(base_env_, o_, host, id, job)), forward};
  StartedRank started = make_starter(host, this_host_, my_addresses_, ssh_)->start(launch);
  auto [out_file, err_file] = output_files(o_.output_dir, "worker." + id);
  const std::string prefix = o_.prefix ? fmt::format("[{}]", id) : "";
  fmt::print(stderr, "krugrun: elastic: worker {} on host {}: pid {} started\n", id, host,
             started.process.pid());
  workers_.push_back(std::make_unique<Worker>(
      Worker{id, host, slot, std::move(started.process),
             StreamPump(std::move(started.stdout_pipe), STDOUT_FILENO,
                        prefix.empty() ? "" : prefix + "<stdout>:", std::move(out_file)),
             StreamPump(std::move(started.stderr_pipe), STDERR_FILENO,
                        prefix.empty() ? "" : prefix + "<stderr>:", std::move(err_file)),
             std::move(started.stdin_keepalive), !is_local(host), 0, false, std::nullopt,
             std::nullopt, false, false}));
}

bool WorkerPool::wait(int wake_fd, std::chrono::milliseconds tick) {
  std::vector<pollfd> fds{{wake_fd, POLLIN, 0}};
  std::vector<StreamPump*> pumps;
  for (auto& w : workers_)
    for (StreamPump* p : {&w->out, &w->err})
      if (p->open()) {
        fds.push_back({p->fd(), POLLIN, 0});
        pumps.push_back(p);
      }
  const int n = ::poll(fds.data(), fds.size(), static_cast<int>(tick.count()));
  if (n < 0 && errno != EINTR)
    throw Error(std::string("krugrun: poll failed: ") + std::strerror(errno));
  if (n <= 0) return false;
  for (size_t i = 1; i < fds.size(); ++i)
    if (fds[i].revents != 0) pumps[i - 1]->on_readable();
  return fds[0].revents != 0;
}

void WorkerPool::reap(const std::function<void(Worker&)>& on_exit) {
  for (auto& w : workers_)
    if (w->process.try_reap()) on_exit(*w);
}

void WorkerPool::signal(int sig) {
  for (auto& w : workers_) w->process.signal_group(sig);
}

size_t WorkerPool::live() const {
  return std::count_if(workers_.begin(), workers_.end(),
                       [](const auto& w) { return !w->process.reaped(); });
}

int WorkerPool::active() const {
  return static_cast<int>(std::count_if(workers_.begin(), workers_.end(), [](const auto& w) {
    return !w->process.reaped() && !w->removing;
  }));
}

bool WorkerPool::pumps_open() const {
  return std::any_of(workers_.begin(), workers_.end(),
                     [](const auto& w) { return w->out.open() || w->err.open(); });
}

bool WorkerPool::slot_taken(const std::string& host, int slot) const {
  return std::any_of(workers_.begin(), workers_.end(), [&](const auto& w) {
    return w->host == host && w->slot == slot && !w->process.reaped() && !w->removing;
  });
}

}  // namespace krug::run
