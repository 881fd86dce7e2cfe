#include "run/elastic/external_rounds.h"

#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

#include "common/config.h"
#include "krug/types.h"
#include "rendezvous/server.h"
#include "transport/shm_segment.h"

namespace krug::run {

namespace el = rendezvous::elastic;

ExternalRounds::ExternalRounds(rendezvous::Store& store, ExternalRoundsOptions options)
    : store_(store), options_(options) {
  publish_hosts_version(false);
}

void ExternalRounds::publish_hosts_version(bool addition) {
  if (addition || round_ >= 0) ++version_.version;
  if (addition) version_.last_addition = version_.version;
  const std::string text = el::encode(version_);
  store_.set(el::kHostsKey, rendezvous::Bytes(text.begin(), text.end()));
}

void ExternalRounds::add_worker(const std::string& id, const std::string& host) {
  if (workers_.count(id) != 0) throw Error(fmt::format("elastic worker {} was added twice", id));
  int slot = 0;
  for (const auto& [other, w] : workers_)
    if (w.host == host && !w.gone) ++slot;
  Worker w;
  w.host = host;
  w.slot = slot;
  workers_[id] = std::move(w);
  order_.push_back(id);
  if (std::find(hosts_.begin(), hosts_.end(), host) == hosts_.end()) hosts_.push_back(host);
  // Members learn of the newcomer at their next commit() and re-form with it.
  if (round_ >= 0 && !any_finished_) publish_hosts_version(/*addition=*/true);
}

void ExternalRounds::worker_exited(const std::string& id, int status) {
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.gone) return;
  Worker& w = it->second;
  w.gone = true;
  if (status == 0 && !w.told_removed) any_finished_ = true;
  if (status != 0 && w.rank) publish_hosts_version(/*addition=*/false);
}

void ExternalRounds::tell(const std::string& id, Worker& w, const el::Assignment& a) {
  const std::string text = el::encode(a);
  store_.set(el::assign_key(id, w.seq), rendezvous::Bytes(text.begin(), text.end()));
  ++w.seq;
  w.joined = false;
}

std::optional<std::string> ExternalRounds::tick(Clock::time_point now) {
  if (stop_) return std::nullopt;
  for (auto& [id, w] : workers_)
    if (!w.gone && !w.joined && !w.told_removed) w.joined = store_.check({el::join_key(id, w.seq)});
  auto message = form_round(now);
  const bool live =
      std::any_of(workers_.begin(), workers_.end(), [](const auto& kv) { return !kv.second.gone; });
  if (!stop_ && !live && any_finished_) stop_ = Stop{0, "training finished"};
  return message;
}

// As krugrun's elastic driver (run/elastic/driver.cc): once every live worker has asked for its
// next rank, the removed ones are told so and the others form a round of at least min_np.
std::optional<std::string> ExternalRounds::form_round(Clock::time_point now) {
  std::vector<std::string> waiting, absent;
  for (const std::string& id : order_) {
    const Worker& w = workers_[id];
    if (w.gone || w.told_removed) continue;
    (w.joined ? waiting : absent).push_back(id);
  }
  if (waiting.empty()) {
    waiting_since_.reset();
    return std::nullopt;
  }
  if (!waiting_since_) waiting_since_ = now;
  const double waited = std::chrono::duration<double>(now - *waiting_since_).count();
  if (!absent.empty()) {
    stop_if_absent_too_long(waiting, absent, waited);
    return std::nullopt;
  }
  std::vector<RoundMember> plan = round_plan(waiting);
  if (plan.empty()) return std::nullopt;
  if (static_cast<int>(plan.size()) < options_.min_np) {
    if (waited > options_.elastic_timeout_s)
      stop_ = Stop{1, fmt::format("only {} worker(s) available after {} s, fewer than the minimum "
                                  "of {}",
                                  plan.size(), options_.elastic_timeout_s, options_.min_np)};
    return std::nullopt;
  }
  if (round_ >= 0 && ++resets_ > options_.reset_limit && options_.reset_limit >= 0) {
    stop_ = Stop{
        1, fmt::format("reset limit reached ({} resets, limit {})", resets_, options_.reset_limit)};
    return std::nullopt;
  }
  waiting_since_.reset();
  return start_round(plan);
}

void ExternalRounds::stop_if_absent_too_long(const std::vector<std::string>& waiting,
                                             const std::vector<std::string>& absent,
                                             double waited) {
  // Workers of an earlier round wait for the absent ones; a first round just has not formed.
  const bool broken = std::any_of(waiting.begin(), waiting.end(),
                                  [&](const std::string& id) { return workers_[id].rank; });
  if (!broken || waited <= options_.elastic_timeout_s) return;
  std::string names;
  for (const auto& id : absent) names += (names.empty() ? "" : ", ") + id;
  stop_ = Stop{1, fmt::format("worker(s) {} did not come back to re-form the job within {} s "
                              "(elastic timeout)",
                              names, options_.elastic_timeout_s)};
}

std::vector<RoundMember> ExternalRounds::round_plan(const std::vector<std::string>& waiting) {
  std::vector<RoundMember> plan;
  for (const std::string& id : waiting) {
    Worker& w = workers_[id];
    if (any_finished_) {  // no new round once one worker completed training
      el::Assignment removed;
      removed.removed = "the job finished: another worker completed training";
      tell(id, w, removed);
      w.told_removed = true;
      w.rank.reset();
      continue;
    }
    plan.push_back({id, w.host, w.slot, w.rank});
  }
  return plan;
}

std::string ExternalRounds::start_round(const std::vector<RoundMember>& plan) {
  ++round_;
  const auto assignments = plan_round(plan, hosts_, round_, version_.version);
  std::string layout;
  for (const RoundMember& m : plan) {
    Worker& w = workers_[m.worker];
    const el::Assignment& a = assignments.at(m.worker);
    layout += fmt::format("{}{} {}", layout.empty() ? "" : ", ", m.worker,
                          w.rank ? fmt::format("rank {}->{}", *w.rank, a.rank)
                                 : fmt::format("rank {} (new)", a.rank));
    w.rank = a.rank;
    tell(m.worker, w, a);
  }
  return fmt::format("round {}: {} worker(s): {}", round_, plan.size(), layout);
}

namespace {

// One command line of the launcher; malformed lines are reported and skipped.
void apply_command(ExternalRounds& rounds, const std::string& line) {
  std::istringstream in(line);
  std::string verb, id;
  in >> verb >> id;
  try {
    if (verb == "add") {
      std::string host;
      if (in >> host) return rounds.add_worker(id, host);
    } else if (verb == "exit") {
      int status = 0;
      if (in >> status) return rounds.worker_exited(id, status);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "krugrun __elastic-rendezvous: %s\n", e.what());
    return;
  }
  std::fprintf(stderr, "krugrun __elastic-rendezvous: ignoring malformed command '%s'\n",
               line.c_str());
}

// Parses `krugrun __elastic-rendezvous`'s flags; returns the exit status on a bad one.
std::optional<int> parse_rendezvous_args(int argc, char** argv, std::string& bind,
                                         ExternalRoundsOptions& options) {
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "krugrun __elastic-rendezvous: %s needs a value\n", arg.c_str());
      return 2;
    }
    const char* value = argv[++i];
    if (arg == "--bind")
      bind = value;
    else if (arg == "--min-np")
      options.min_np = std::atoi(value);
    else if (arg == "--reset-limit")
      options.reset_limit = std::atoi(value);
    else if (arg == "--elastic-timeout")
      options.elastic_timeout_s = std::atof(value);
    else {
      std::fprintf(stderr, "krugrun __elastic-rendezvous: unknown argument '%s'\n", arg.c_str());
      return 2;
    }
  }
  return std::nullopt;
}

// Applies the launcher's commands from stdin and prints rounds and the stop on stdout, until
// stdin closes.
void serve_commands(ExternalRounds& rounds) {
  std::string pending;
  char buf[4096];
  for (;;) {
    pollfd fd{STDIN_FILENO, POLLIN, 0};
    // The driver's store checks are no data path: a tenth of a second is prompt enough.
    const int n = ::poll(&fd, 1, 100);
    if (n < 0 && errno != EINTR) return;
    if (n > 0) {
      const ssize_t got = ::read(STDIN_FILENO, buf, sizeof buf);
      if (got == 0 || (got < 0 && errno != EINTR)) return;
      if (got > 0) pending.append(buf, static_cast<size_t>(got));
      for (size_t eol; (eol = pending.find('\n')) != std::string::npos;) {
        apply_command(rounds, pending.substr(0, eol));
        pending.erase(0, eol + 1);
      }
    }
    const bool was_stopped = rounds.stopped().has_value();
    if (auto message = rounds.tick(ExternalRounds::Clock::now())) {
      std::printf("round %s\n", message->c_str());
      std::fflush(stdout);
    }
    if (!was_stopped && rounds.stopped()) {
      std::printf("stop %d %s\n", rounds.stopped()->code, rounds.stopped()->message.c_str());
      std::fflush(stdout);
    }
  }
}

}  // namespace

int elastic_rendezvous_main(int argc, char** argv) {
  std::string bind = "127.0.0.1";
  ExternalRoundsOptions options;
  if (auto status = parse_rendezvous_args(argc, argv, bind, options)) return *status;
  const char* secret = std::getenv("KRUG_SECRET");
  if (secret == nullptr || *secret == '\0') {
    std::fprintf(stderr, "krugrun __elastic-rendezvous: KRUG_SECRET is not set\n");
    return 2;
  }
  try {
    const auto protection = net::protection_for(load_knobs({"KRUG_ENCRYPT"}).encrypt);
    rendezvous::RendezvousServer server(
        bind, 0, secret,
        [](const std::string& m) { std::fprintf(stderr, "krugrun: rendezvous: %s\n", m.c_str()); },
        protection);
    rendezvous::RendezvousClient store(bind == "0.0.0.0" ? "127.0.0.1" : bind, server.port(),
                                       secret, std::chrono::seconds(10), std::stop_token{},
                                       protection);
    ExternalRounds rounds(store, options);
    std::printf("KRUG_RENDEZVOUS_PORT=%u\n", static_cast<unsigned>(server.port()));
    std::fflush(stdout);
    serve_commands(rounds);
  } catch (const Error& e) {
    std::fprintf(stderr, "krugrun __elastic-rendezvous: %s\n", e.what());
    return 1;
  }
  if (const char* job = std::getenv("KRUG_JOB_ID"); job != nullptr && *job != '\0')
    transport::remove_job_segments(job);
  return 0;
}

}  // namespace krug::run
