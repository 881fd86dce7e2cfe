#include "run/elastic/rounds.h"

#include <fmt/format.h>

#include <algorithm>

#include "krug/types.h"
#include "run/elastic/plan.h"

namespace krug::run {
namespace {

namespace el = rendezvous::elastic;

}  // namespace

ElasticRounds::ElasticRounds(rendezvous::Store& store, const ElasticOptions& options)
    : store_(store), e_(options) {
  publish_hosts_version();
}

void ElasticRounds::hosts_changed(bool addition) {
  ++version_.version;
  if (addition) version_.last_addition = version_.version;
  publish_hosts_version();
}

void ElasticRounds::publish_hosts_version() {
  const std::string text = el::encode(version_);
  store_.set(el::kHostsKey, rendezvous::Bytes(text.begin(), text.end()));
}

void ElasticRounds::collect_joins(WorkerPool& workers) {
  for (auto& w : workers) {
    if (w->process.reaped() || w->joined || w->told_removed) continue;
    try {
      w->joined = store_.check({el::join_key(w->id, w->seq)});
    } catch (const Error& err) {
      throw Error(fmt::format("krugrun: elastic: lost its own rendezvous server: {}", err.what()));
    }
  }
}

void ElasticRounds::tell(Worker& w, const el::Assignment& a) {
  const std::string text = el::encode(a);
  store_.set(el::assign_key(w.id, w.seq), rendezvous::Bytes(text.begin(), text.end()));
  ++w.seq;
  w.joined = false;
}

ElasticRounds::Outcome ElasticRounds::form(WorkerPool& workers,
                                           const std::vector<HostSlots>& host_order, bool finished,
                                           Clock::time_point now) {
  std::vector<Worker*> waiting, absent;
  for (auto& w : workers) {
    if (w->process.reaped() || w->told_removed) continue;
    (w->joined ? waiting : absent).push_back(w.get());
  }
  if (waiting.empty()) {
    waiting_since_.reset();
    return {};
  }
  if (!waiting_since_) waiting_since_ = now;
  const double waited = std::chrono::duration<double>(now - *waiting_since_).count();
  if (!absent.empty()) return {broken_round_timed_out(waiting, absent, waited)};
  const std::vector<Worker*> members = release_removed(waiting, finished);
  if (auto stop = too_few_members(members.size(), waited)) return {stop};
  if (static_cast<int>(members.size()) < e_.min_np) return {};
  if (round_ >= 0 && ++resets_ > e_.reset_limit && e_.reset_limit >= 0)
    return {StopRequest{1, fmt::format("reset limit reached ({} resets, --reset-limit {}); "
                                       "stopping",
                                       resets_, e_.reset_limit)}};
  start_round(members, workers, host_order);
  return {std::nullopt, true};
}

// Only a broken round (one of its members is back asking) has a deadline: new workers may
// wait for the members' next commit however far apart commits are.
std::optional<StopRequest> ElasticRounds::broken_round_timed_out(
    const std::vector<Worker*>& waiting, const std::vector<Worker*>& absent, double waited) const {
  const bool broken = std::any_of(waiting.begin(), waiting.end(),
                                  [](const Worker* w) { return w->rank.has_value(); });
  if (!broken || waited <= e_.elastic_timeout_s) return std::nullopt;
  std::string names;
  for (const Worker* w : absent) names += (names.empty() ? "" : ", ") + describe(*w);
  return StopRequest{1, fmt::format("{} did not come back to re-form the job within {} s "
                                    "(--elastic-timeout); stopping",
                                    names, e_.elastic_timeout_s)};
}

// Tells the waiting workers that are leaving so; returns the others.
std::vector<Worker*> ElasticRounds::release_removed(const std::vector<Worker*>& waiting,
                                                    bool finished) {
  std::vector<Worker*> members;
  for (Worker* w : waiting) {
    // Once a worker finished training, the job is done: one that asks for another round
    // (its peers left) has nothing more to do.
    if (finished && !w->removing)
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

// Below --min-np, warns once and stops the job after --elastic-timeout.
std::optional<StopRequest> ElasticRounds::too_few_members(size_t count, double waited) {
  if (static_cast<int>(count) >= e_.min_np) return std::nullopt;
  if (!warned_min_np_) {
    fmt::print(stderr,
               "krugrun: elastic: {} worker(s) ready, --min-np is {}: waiting up to "
               "{} s for more slots\n",
               count, e_.min_np, e_.elastic_timeout_s);
    warned_min_np_ = true;
  }
  if (waited <= e_.elastic_timeout_s) return std::nullopt;
  return StopRequest{1, fmt::format("only {} worker(s) available after {} s, fewer than "
                                    "--min-np {}; stopping",
                                    count, e_.elastic_timeout_s, e_.min_np)};
}

// Assigns ranks for the next round and tells every member its own.
void ElasticRounds::start_round(const std::vector<Worker*>& members, WorkerPool& workers,
                                const std::vector<HostSlots>& host_order) {
  ++round_;
  std::vector<RoundMember> plan;
  for (Worker* w : members) plan.push_back({w->id, w->host, w->slot, w->rank});
  std::vector<std::string> order;
  for (const HostSlots& h : host_order) order.push_back(h.host);
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
  for (auto& w : workers)
    if (w->told_removed) w->rank.reset();
  fmt::print(stderr, "krugrun: elastic: round {}: {} worker(s): {}\n", round_, members.size(),
             layout);
  waiting_since_.reset();
  warned_min_np_ = false;
}

}  // namespace krug::run
