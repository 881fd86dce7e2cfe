#include "run/elastic_driver.h"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>

#include "krug/types.h"
#include "net/address.h"
#include "rendezvous/elastic_protocol.h"
#include "rendezvous/server.h"
#include "run/discovery.h"
#include "run/elastic_plan.h"
#include "run/output.h"
#include "run/process.h"
#include "run/rank_env.h"
#include "run/signals.h"
#include "run/ssh.h"
#include "run/starter.h"
#include "run/supervisor.h"
#include "transport/shm_segment.h"

namespace krug::run {
namespace {

namespace el = rendezvous::elastic;
using Clock = std::chrono::steady_clock;

constexpr auto kTick = std::chrono::milliseconds(100);  // store checks: the driver is no data path
constexpr auto kDiscoveryTimeout = std::chrono::seconds(30);
constexpr auto kHealthEvery = std::chrono::seconds(1);

struct Worker {
  std::string id;
  std::string host;
  int slot = 0;
  RankProcess process;
  StreamPump out, err;
  Fd keepalive;
  bool remote = false;
  int64_t seq = 0;                      // the init() whose join the driver awaits next
  bool joined = false;                  // its join for `seq` is in the store
  std::optional<int> rank;              // in the current round
  std::optional<std::string> removing;  // why the driver is taking it out of the job
  bool told_removed = false;
  bool finished = false;  // exited 0 as a member: the training function returned
};

class Driver {
 public:
  explicit Driver(const LaunchOptions& o)
      : o_(o),
        e_(o.elastic),
        ssh_(ssh_options(o)),
        this_host_(local_hostname()),
        my_addresses_(net::local_addresses()),
        blacklist_(o.elastic.cooldown_range),
        signal_fd_(open_signal_fd()),
        job_{"127.0.0.1", 0, rendezvous::make_job_secret(), make_job_id(), build_python_dir()},
        // Hosts may be added later from anywhere: listen on every interface; the secret keeps
        // strangers out.
        server_("0.0.0.0", 0, job_.secret,
                [](const std::string& m) {
                  std::fprintf(stderr, "krugrun: rendezvous: %s\n", m.c_str());
                }),
        base_env_(current_environment()) {
    job_.rendezvous_port = server_.port();
    store_ = std::make_unique<rendezvous::RendezvousClient>("127.0.0.1", job_.rendezvous_port,
                                                            job_.secret, std::chrono::seconds(10));
    publish_hosts_version();
  }

  int run() {
    try {
      discover(/*first=*/true);
    } catch (const Error& e) {
      fmt::print(stderr, "{}\n", e.what());
      return 1;
    }
    start_workers();
    started_at_ = Clock::now();
    next_discovery_ = started_at_ + discovery_interval();
    while (true) {
      poll_once();
      const auto now = Clock::now();
      if (stopping_) {
        if (live() == 0 && !pumps_open()) return stop_code_;
        if (!killed_ && now >= kill_at_) {
          signal_live(SIGKILL);
          killed_ = true;
        }
        continue;
      }
      if (now >= next_discovery_) {
        discover(false);
        start_workers();
        next_discovery_ = now + discovery_interval();
      }
      collect_joins();
      form_round(now);
      check_stragglers(now);
      if (!stopping_ && live() == 0) {
        if (!workers_.empty()) return finish();
        // Nothing started yet: the discovery script has listed no usable slot so far.
        if (now - started_at_ > std::chrono::duration<double>(e_.elastic_timeout_s))
          stop(1, fmt::format("no usable host after {} s (--elastic-timeout); check the host "
                              "discovery script's output",
                              e_.elastic_timeout_s));
      }
    }
  }

  const std::string& job_id() const { return job_.job_id; }

 private:
  std::chrono::milliseconds discovery_interval() const {
    return std::chrono::milliseconds(static_cast<int64_t>(e_.discovery_interval_s * 1000));
  }

  size_t live() const {
    return std::count_if(workers_.begin(), workers_.end(),
                         [](const auto& w) { return !w->process.reaped(); });
  }
  bool pumps_open() const {
    return std::any_of(workers_.begin(), workers_.end(),
                       [](const auto& w) { return w->out.open() || w->err.open(); });
  }
  std::string who(const Worker& w) const {
    return w.rank ? fmt::format("worker {} (rank {}) on host {}", w.id, *w.rank, w.host)
                  : fmt::format("worker {} on host {}", w.id, w.host);
  }

  // ---- processes and output ----

  void poll_once() {
    std::vector<pollfd> fds{{signal_fd_.get(), POLLIN, 0}};
    std::vector<StreamPump*> pumps;
    for (auto& w : workers_)
      for (StreamPump* p : {&w->out, &w->err})
        if (p->open()) {
          fds.push_back({p->fd(), POLLIN, 0});
          pumps.push_back(p);
        }
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(kTick.count()));
    if (n < 0 && errno != EINTR)
      throw Error(std::string("krugrun: poll failed: ") + std::strerror(errno));
    if (n > 0) {
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents != 0) pumps[i - 1]->on_readable();
      if (fds[0].revents != 0) on_signals();
    }
    reap();
  }

  void on_signals() {
    signalfd_siginfo info;
    while (::read(signal_fd_.get(), &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) continue;  // reap() runs after every poll
      if (stopping_) {
        fmt::print(stderr, "krugrun: received {} again, killing all workers\n", signal_name(sig));
        signal_live(SIGKILL);
        killed_ = true;
      } else {
        stop(128 + sig, fmt::format("received {}, stopping all workers (send it again to kill "
                                    "them now)",
                                    signal_name(sig)));
      }
    }
  }

  void reap() {
    for (auto& w : workers_)
      if (w->process.try_reap()) on_exit(*w);
  }

  void signal_live(int sig) {
    for (auto& w : workers_) w->process.signal_group(sig);
  }

  void stop(int code, const std::string& message) {
    fmt::print(stderr, "krugrun: elastic: {}\n", message);
    stopping_ = true;
    stop_code_ = code;
    signal_live(SIGTERM);
    kill_at_ = Clock::now() + Supervisor::kGrace;  // the same grace as a fixed job's
  }

  int finish() {
    if (any_finished_) {
      fmt::print(stderr, "krugrun: elastic: training finished after {} reset(s)\n", resets_);
      return 0;
    }
    fmt::print(stderr, "krugrun: elastic: no worker is left{}; stopping\n",
               last_failure_.empty() ? "" : " (last failure: " + last_failure_ + ")");
    return last_failure_code_ != 0 ? last_failure_code_ : 1;
  }

  void on_exit(Worker& w) {
    const int status = *w.process.status();
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    w.keepalive.reset();
    const std::string how =
        w.remote ? describe_remote_status(status) : describe_wait_status(status);
    if (stopping_) return;
    if (w.removing) {
      if (o_.verbose) fmt::print(stderr, "krugrun: elastic: {} {} (removed)\n", who(w), how);
      return;
    }
    if (ok) {
      if (o_.verbose) fmt::print(stderr, "krugrun: elastic: {} finished\n", who(w));
      w.finished = true;
      any_finished_ = true;
      return;
    }
    last_failure_ = fmt::format("{} {}", who(w), how);
    last_failure_code_ = exit_code_of(status);
    remove_host(w.host, fmt::format("{} {}", who(w), how), /*failed=*/true);
    if (w.rank && live() > 0)
      fmt::print(stderr,
                 "krugrun: elastic: the other workers roll back to their last commit and "
                 "re-form the job\n");
  }

  // ---- hosts ----

  void discover(bool first) {
    std::vector<HostSlots> found;
    try {
      found = parse_discovery_output(run_discovery_script(e_.discovery_script, kDiscoveryTimeout),
                                     e_.discovery_script, e_.slots_per_host);
    } catch (const Error& err) {
      if (first) throw;
      // A flaky script must not end a running job: keep the hosts it printed last.
      if (err.what() != last_discovery_error_)
        fmt::print(stderr, "krugrun: elastic: {} (keeping the previous host list)\n", err.what());
      last_discovery_error_ = err.what();
      return;
    }
    last_discovery_error_.clear();
    if (first && found.empty())
      fmt::print(stderr,
                 "krugrun: elastic: the discovery script lists no host yet; waiting up to "
                 "{} s (--elastic-timeout)\n",
                 e_.elastic_timeout_s);
    hosts_ = std::move(found);
    // Workers on hosts that left the list (or beyond a host's new slot count) leave the job.
    for (auto& w : workers_) {
      if (w->process.reaped() || w->removing) continue;
      auto it = std::find_if(hosts_.begin(), hosts_.end(),
                             [&](const HostSlots& h) { return h.host == w->host; });
      if (it == hosts_.end())
        mark_removing(*w, fmt::format("host {} left the discovery script's output", w->host));
      else if (w->slot >= it->slots)
        mark_removing(*w, fmt::format("host {} now has {} slot(s)", w->host, it->slots));
    }
  }

  // Blacklists `host` and takes its workers out of the job.
  void remove_host(const std::string& host, const std::string& why, bool failed) {
    const auto cooldown = blacklist_.add(host, Clock::now());
    fmt::print(
        stderr, "krugrun: elastic: {}; host {} is blacklisted {}\n", why, host,
        cooldown ? fmt::format("for {:.1f} s", *cooldown) : std::string("for the rest of the job"));
    for (auto& w : workers_)
      if (w->host == host && !w->process.reaped() && !w->removing)
        mark_removing(*w, fmt::format("host {} is blacklisted ({})", host,
                                      failed ? "a worker there failed" : "it was too slow"));
  }

  void mark_removing(Worker& w, std::string why) {
    if (o_.verbose || w.rank)
      fmt::print(stderr, "krugrun: elastic: removing {}: {}\n", who(w), why);
    w.removing = std::move(why);
    if (w.rank) bump_hosts_version(/*addition=*/false);
  }

  void bump_hosts_version(bool addition) {
    ++version_.version;
    if (addition) version_.last_addition = version_.version;
    publish_hosts_version();
  }

  void publish_hosts_version() {
    const std::string text = el::encode(version_);
    store_->set(el::kHostsKey, rendezvous::Bytes(text.begin(), text.end()));
  }

  int active_workers() const {
    return static_cast<int>(std::count_if(workers_.begin(), workers_.end(), [](const auto& w) {
      return !w->process.reaped() && !w->removing;
    }));
  }

  // A worker for every free slot of every usable host, up to --max-np.
  void start_workers() {
    if (any_finished_ || stopping_) return;
    const auto now = Clock::now();
    bool started = false;
    for (const HostSlots& h : hosts_) {
      if (blacklist_.blocked(h.host, now)) continue;
      for (int slot = 0; slot < h.slots; ++slot) {
        if (e_.max_np > 0 && active_workers() >= e_.max_np) break;
        const bool taken = std::any_of(workers_.begin(), workers_.end(), [&](const auto& w) {
          return w->host == h.host && w->slot == slot && !w->process.reaped() && !w->removing;
        });
        if (taken) continue;
        try {
          start_worker(h.host, slot);
          started = true;
        } catch (const Error& err) {
          remove_host(h.host, err.what(), true);
          break;
        }
      }
    }
    if (started && round_ >= 0) bump_hosts_version(/*addition=*/true);
  }

  std::string rendezvous_address_for(const std::string& host) const {
    if (!o_.network_interface.empty()) return net::interface_address(o_.network_interface);
    // Workers advertise the address they reach the server by, so on a multi-host job even local
    // workers must use one the other hosts can reach: the one on the route to a remote host.
    std::string remote;
    for (const HostSlots& h : hosts_)
      if (!is_local_host(h.host, this_host_, my_addresses_)) remote = h.host;
    if (remote.empty()) return "127.0.0.1";
    return net::source_address_toward(is_local_host(host, this_host_, my_addresses_) ? remote
                                                                                     : host);
  }

  void start_worker(const std::string& host, int slot) {
    const std::string id = fmt::format("w{}", next_worker_++);
    JobInfo job = job_;
    job.rendezvous_addr = rendezvous_address_for(host);
    std::vector<std::string> forward = o_.forward_env;
    for (const auto& [name, value] : o_.set_env) forward.push_back(name);
    RankSlot rank_slot;
    rank_slot.host = host;
    rank_slot.rank = slot;
    RankLaunch launch{rank_slot, o_.command,
                      to_envp(elastic_worker_environment(base_env_, o_, host, id, job)), forward};
    const bool remote = !is_local_host(host, this_host_, my_addresses_);
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
               std::move(started.stdin_keepalive), remote, 0, false, std::nullopt, std::nullopt,
               false, false}));
  }

  // ---- rounds ----

  void collect_joins() {
    for (auto& w : workers_) {
      if (w->process.reaped() || w->joined || w->told_removed) continue;
      try {
        w->joined = store_->check({el::join_key(w->id, w->seq)});
      } catch (const Error& err) {
        throw Error(
            fmt::format("krugrun: elastic: lost its own rendezvous server: {}", err.what()));
      }
    }
  }

  void tell(Worker& w, const el::Assignment& a) {
    const std::string text = el::encode(a);
    store_->set(el::assign_key(w.id, w.seq), rendezvous::Bytes(text.begin(), text.end()));
    ++w.seq;
    w.joined = false;
  }

  // Once every live worker has asked for its next rank, the removed ones are told so and the
  // others form the next round, if there are at least --min-np of them.
  void form_round(Clock::time_point now) {
    std::vector<Worker*> waiting, absent;
    for (auto& w : workers_) {
      if (w->process.reaped() || w->told_removed) continue;
      (w->joined ? waiting : absent).push_back(w.get());
    }
    if (waiting.empty()) {
      waiting_since_.reset();
      return;
    }
    if (!waiting_since_) waiting_since_ = now;
    const double waited = std::chrono::duration<double>(now - *waiting_since_).count();
    if (!absent.empty()) {
      stop_if_broken_round_timed_out(waiting, absent, waited);
      return;
    }
    const std::vector<Worker*> members = release_removed(waiting);
    if (!enough_members(members.size(), waited)) return;
    if (round_ >= 0 && ++resets_ > e_.reset_limit && e_.reset_limit >= 0) {
      stop(1, fmt::format("reset limit reached ({} resets, --reset-limit {}); stopping", resets_,
                          e_.reset_limit));
      return;
    }
    start_round(members, now);
  }

  // Only a broken round (one of its members is back asking) has a deadline: new workers may
  // wait for the members' next commit however far apart commits are.
  void stop_if_broken_round_timed_out(const std::vector<Worker*>& waiting,
                                      const std::vector<Worker*>& absent, double waited) {
    const bool broken = std::any_of(waiting.begin(), waiting.end(),
                                    [](const Worker* w) { return w->rank.has_value(); });
    if (!broken || waited <= e_.elastic_timeout_s) return;
    std::string names;
    for (Worker* w : absent) names += (names.empty() ? "" : ", ") + who(*w);
    stop(1, fmt::format("{} did not come back to re-form the job within {} s "
                        "(--elastic-timeout); stopping",
                        names, e_.elastic_timeout_s));
  }

  // Tells the waiting workers that are leaving so; returns the others.
  std::vector<Worker*> release_removed(const std::vector<Worker*>& waiting) {
    std::vector<Worker*> members;
    for (Worker* w : waiting) {
      // Once a worker finished training, the job is done: one that asks for another round
      // (its peers left) has nothing more to do.
      if (any_finished_ && !w->removing)
        w->removing = "the job finished: another worker completed training";
      if (w->removing) {
        el::Assignment removed;
        removed.removed = *w->removing;
        tell(*w, removed);
        w->told_removed = true;
      } else {
        members.push_back(w);
      }
    }
    return members;
  }

  // Whether `count` workers may form a round; below --min-np, warns once and stops the job
  // after --elastic-timeout.
  bool enough_members(size_t count, double waited) {
    if (static_cast<int>(count) >= e_.min_np) return true;
    if (!warned_min_np_) {
      fmt::print(stderr,
                 "krugrun: elastic: {} worker(s) ready, --min-np is {}: waiting up to "
                 "{} s for more slots\n",
                 count, e_.min_np, e_.elastic_timeout_s);
      warned_min_np_ = true;
    }
    if (waited > e_.elastic_timeout_s)
      stop(1, fmt::format("only {} worker(s) available after {} s, fewer than --min-np {}; "
                          "stopping",
                          count, e_.elastic_timeout_s, e_.min_np));
    return false;
  }

  // Assigns ranks for the next round and tells every member its own.
  void start_round(const std::vector<Worker*>& members, Clock::time_point now) {
    ++round_;
    std::vector<RoundMember> plan;
    for (Worker* w : members) plan.push_back({w->id, w->host, w->slot, w->rank});
    std::vector<std::string> order;
    for (const HostSlots& h : hosts_) order.push_back(h.host);
    const auto assignments = plan_round(plan, order, round_, version_.version);
    std::string layout;
    for (Worker* w : members) {
      const el::Assignment& a = assignments.at(w->id);
      layout += fmt::format("{}{} {}", layout.empty() ? "" : ", ", w->id,
                            w->rank ? fmt::format("rank {}->{}", *w->rank, a.rank)
                                    : fmt::format("rank {} (new)", a.rank));
      w->rank = a.rank;
      tell(*w, a);
    }
    for (auto& w : workers_)
      if (w->told_removed) w->rank.reset();
    fmt::print(stderr, "krugrun: elastic: round {}: {} worker(s): {}\n", round_, members.size(),
               layout);
    waiting_since_.reset();
    warned_min_np_ = false;
    health_base_.reset();
    next_health_ = now + kHealthEvery;
  }

  // ---- stragglers ----

  void check_stragglers(Clock::time_point now) {
    if (e_.straggler_factor <= 0 || round_ < 0 || now < next_health_) return;
    next_health_ = now + kHealthEvery;
    const std::string key = el::health_key(round_);
    if (!store_->check({key})) return;
    const auto bytes = store_->get(key, std::chrono::milliseconds(0));
    const el::Health h = el::decode_health(std::string(bytes.begin(), bytes.end()));
    if (!health_base_) {
      health_base_ = h;
      return;
    }
    if (o_.verbose)
      fmt::print(stderr, "krugrun: elastic: round {} readiness: {}\n", round_, el::encode(h));
    if (h.steps - health_base_->steps < e_.straggler_window) return;
    const auto slow = find_straggler(*health_base_, h, e_.straggler_factor, e_.straggler_window);
    health_base_ = h;  // windows do not overlap
    if (!slow) return;
    Worker* w = nullptr;
    for (auto& c : workers_)
      if (c->rank == slow->rank && !c->process.reaped() && !c->removing) w = c.get();
    if (w == nullptr) return;
    remove_host(w->host,
                fmt::format("{} is {:.1f}x slower than the others over the last {} steps (they "
                            "wait {:.3f} s per step for it, steps take {:.3f} s; "
                            "--straggler-factor {})",
                            who(*w), slow->slowdown, slow->steps, slow->lateness_s, slow->period_s,
                            e_.straggler_factor),
                /*failed=*/false);
    health_base_.reset();
  }

  const LaunchOptions& o_;
  const ElasticOptions& e_;
  SshOptions ssh_;
  std::string this_host_;
  std::vector<std::string> my_addresses_;
  HostBlacklist blacklist_;
  Fd signal_fd_;
  JobInfo job_;
  rendezvous::RendezvousServer server_;
  std::unique_ptr<rendezvous::RendezvousClient> store_;
  EnvMap base_env_;

  std::vector<HostSlots> hosts_;
  std::vector<std::unique_ptr<Worker>> workers_;
  int next_worker_ = 0;
  el::HostsVersion version_;
  int64_t round_ = -1;
  int resets_ = 0;
  std::optional<Clock::time_point> waiting_since_;
  bool warned_min_np_ = false;
  Clock::time_point started_at_{};
  Clock::time_point next_discovery_{};
  std::string last_discovery_error_;
  std::optional<el::Health> health_base_;
  Clock::time_point next_health_{};
  bool any_finished_ = false;
  std::string last_failure_;
  int last_failure_code_ = 0;
  bool stopping_ = false;
  bool killed_ = false;
  int stop_code_ = 0;
  Clock::time_point kill_at_{};
};

}  // namespace

int run_elastic(const LaunchOptions& options) {
  std::string job_id;
  int code;
  {
    Driver driver(options);
    job_id = driver.job_id();
    code = driver.run();
  }
  // As for a fixed job (main.cc): segments a worker left by dying during init.
  transport::remove_job_segments(job_id);
  return code;
}

}  // namespace krug::run
