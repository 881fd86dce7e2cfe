#include "run/elastic/driver.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <optional>

#include "krug/types.h"
#include "rendezvous/server.h"
#include "run/elastic/hosts.h"
#include "run/elastic/rounds.h"
#include "run/elastic/stragglers.h"
#include "run/elastic/workers.h"
#include "run/launch/rank_env.h"
#include "run/launch/signals.h"
#include "run/launch/supervisor.h"
#include "transport/shm_segment.h"

namespace krug::run {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kTick = std::chrono::milliseconds(100);  // store checks: the driver is no data path

// The job: its rendezvous server, and the loop that ties together the hosts (discovery and
// blacklist), the workers (processes), the rounds and the straggler watch, and ends the job.
class Driver {
 public:
  explicit Driver(const LaunchOptions& o)
      : o_(o),
        e_(o.elastic),
        signal_fd_(open_signal_fd()),
        job_{"127.0.0.1", 0, rendezvous::make_job_secret(), make_job_id(), build_python_dir()},
        // Hosts may be added later from anywhere: listen on every interface; the secret keeps
        // strangers out.
        server_(
            "0.0.0.0", 0, job_.secret,
            [](const std::string& m) {
              std::fprintf(stderr, "krugrun: rendezvous: %s\n", m.c_str());
            },
            job_protection(o)),
        store_(connect_store()),
        hosts_(e_),
        workers_(o, job_),
        rounds_(*store_, e_),
        stragglers_(*store_, e_, o.verbose) {}

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
        if (workers_.live() == 0 && !workers_.pumps_open()) return stop_code_;
        if (!killed_ && now >= kill_at_) {
          workers_.signal(SIGKILL);
          killed_ = true;
        }
        continue;
      }
      if (now >= next_discovery_) {
        discover(false);
        start_workers();
        next_discovery_ = now + discovery_interval();
      }
      rounds_.collect_joins(workers_);
      form_round(now);
      check_stragglers(now);
      if (!stopping_ && workers_.live() == 0) {
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
  std::unique_ptr<rendezvous::RendezvousClient> connect_store() {
    job_.rendezvous_port = server_.port();
    return std::make_unique<rendezvous::RendezvousClient>("127.0.0.1", job_.rendezvous_port,
                                                          job_.secret, std::chrono::seconds(10),
                                                          std::stop_token{}, job_protection(o_));
  }

  std::chrono::milliseconds discovery_interval() const {
    return std::chrono::milliseconds(static_cast<int64_t>(e_.discovery_interval_s * 1000));
  }

  // ---- the job's end ----

  void poll_once() {
    if (workers_.wait(signal_fd_.get(), kTick)) on_signals();
    workers_.reap([this](Worker& w) { on_exit(w); });
  }

  void on_signals() {
    signalfd_siginfo info;
    while (::read(signal_fd_.get(), &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) continue;  // reaping follows every poll
      if (stopping_) {
        fmt::print(stderr, "krugrun: received {} again, killing all workers\n", signal_name(sig));
        workers_.signal(SIGKILL);
        killed_ = true;
      } else {
        stop(128 + sig, fmt::format("received {}, stopping all workers (send it again to kill "
                                    "them now)",
                                    signal_name(sig)));
      }
    }
  }

  void stop(int code, const std::string& message) {
    fmt::print(stderr, "krugrun: elastic: {}\n", message);
    stopping_ = true;
    stop_code_ = code;
    workers_.signal(SIGTERM);
    kill_at_ = Clock::now() + Supervisor::kGrace;  // the same grace as a fixed job's
  }

  int finish() {
    if (any_finished_) {
      fmt::print(stderr, "krugrun: elastic: training finished after {} reset(s)\n",
                 rounds_.resets());
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
      if (o_.verbose) fmt::print(stderr, "krugrun: elastic: {} {} (removed)\n", describe(w), how);
      return;
    }
    if (ok) {
      if (o_.verbose) fmt::print(stderr, "krugrun: elastic: {} finished\n", describe(w));
      w.finished = true;
      any_finished_ = true;
      return;
    }
    last_failure_ = fmt::format("{} {}", describe(w), how);
    last_failure_code_ = exit_code_of(status);
    remove_host(w.host, fmt::format("{} {}", describe(w), how), /*failed=*/true);
    if (w.rank && workers_.live() > 0)
      fmt::print(stderr,
                 "krugrun: elastic: the other workers roll back to their last commit and "
                 "re-form the job\n");
  }

  // ---- hosts and workers ----

  // Takes the discovery script's list; workers on hosts that left it (or beyond a host's new
  // slot count) leave the job.
  void discover(bool first) {
    if (!hosts_.discover(first)) return;
    for (auto& w : workers_) {
      if (w->process.reaped() || w->removing) continue;
      const std::optional<int> slots = hosts_.slots(w->host);
      if (!slots)
        mark_removing(*w, fmt::format("host {} left the discovery script's output", w->host));
      else if (w->slot >= *slots)
        mark_removing(*w, fmt::format("host {} now has {} slot(s)", w->host, *slots));
    }
  }

  // Blacklists `host` and takes its workers out of the job.
  void remove_host(const std::string& host, const std::string& why, bool failed) {
    fmt::print(stderr, "krugrun: elastic: {}; host {} is blacklisted {}\n", why, host,
               hosts_.blacklist(host));
    for (auto& w : workers_)
      if (w->host == host && !w->process.reaped() && !w->removing)
        mark_removing(*w, fmt::format("host {} is blacklisted ({})", host,
                                      failed ? "a worker there failed" : "it was too slow"));
  }

  void mark_removing(Worker& w, std::string why) {
    if (o_.verbose || w.rank)
      fmt::print(stderr, "krugrun: elastic: removing {}: {}\n", describe(w), why);
    w.removing = std::move(why);
    if (w.rank) rounds_.hosts_changed(/*addition=*/false);
  }

  // A worker for every free slot of every usable host, up to --max-np.
  void start_workers() {
    if (any_finished_ || stopping_) return;
    bool started = false;
    for (const HostSlots& h : hosts_.list()) {
      if (hosts_.blocked(h.host)) continue;
      for (int slot = 0; slot < h.slots; ++slot) {
        if (e_.max_np > 0 && workers_.active() >= e_.max_np) break;
        if (workers_.slot_taken(h.host, slot)) continue;
        try {
          workers_.start(h.host, slot, hosts_.list());
          started = true;
        } catch (const Error& err) {
          remove_host(h.host, err.what(), true);
          break;
        }
      }
    }
    if (started && rounds_.round() >= 0) rounds_.hosts_changed(/*addition=*/true);
  }

  // ---- rounds and stragglers ----

  void form_round(Clock::time_point now) {
    const ElasticRounds::Outcome outcome =
        rounds_.form(workers_, hosts_.list(), any_finished_, now);
    if (outcome.stop) stop(outcome.stop->code, outcome.stop->message);
    if (outcome.started) stragglers_.restart(now);
  }

  void check_stragglers(Clock::time_point now) {
    const auto slow = stragglers_.check(rounds_.round(), now);
    if (!slow) return;
    Worker* w = nullptr;
    for (auto& c : workers_)
      if (c->rank == slow->rank && !c->process.reaped() && !c->removing) w = c.get();
    if (w == nullptr) return;
    remove_host(w->host,
                fmt::format("{} is {:.1f}x slower than the others over the last {} steps (they "
                            "wait {:.3f} s per step for it, steps take {:.3f} s; "
                            "--straggler-factor {})",
                            describe(*w), slow->slowdown, slow->steps, slow->lateness_s,
                            slow->period_s, e_.straggler_factor),
                /*failed=*/false);
    stragglers_.forget_window();
  }

  const LaunchOptions& o_;
  const ElasticOptions& e_;
  Fd signal_fd_;
  JobInfo job_;
  rendezvous::RendezvousServer server_;
  std::unique_ptr<rendezvous::RendezvousClient> store_;
  ElasticHosts hosts_;
  WorkerPool workers_;
  ElasticRounds rounds_;
  StragglerWatch stragglers_;

  Clock::time_point started_at_{};
  Clock::time_point next_discovery_{};
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
