// krug::elastic (include/krug/elastic.h): the worker's side of elastic training.
#include "krug/elastic.h"

#include <fmt/format.h>

#include <cstdio>

#include "api/runtime.h"
#include "common/config.h"
#include "krug/krug.h"
#include "rendezvous/elastic_protocol.h"

namespace krug::elastic {
namespace {

namespace el = rendezvous::elastic;

// Rounds that break while they form, one after another, before run() gives up.
constexpr int kInitAttempts = 5;

void say(const std::string& line) {
  std::fprintf(stderr, "krug.elastic: %s\n", line.c_str());
}

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

}  // namespace

bool enabled() {
  // Before init() the environment says it; after, the runtime (init() read the same knob).
  return load_config().elastic;
}

RoundInfo round_info() {
  auto session = current_elastic_session();
  if (!session) return {};
  return {session->assignment.round, session->assignment.has_new_workers};
}

HostUpdate host_update() {
  auto session = current_elastic_session();
  if (!session) return {};
  // One round trip (rank 0, at every commit): the driver publishes the key before any worker
  // starts, so it is there to get.
  rendezvous::Bytes now;
  try {
    now = session->store->get(el::kHostsKey, std::chrono::milliseconds(0));
  } catch (const rendezvous::StoreTimeout&) {
    return {};
  }
  const auto hosts = el::decode_hosts_version(std::string(now.begin(), now.end()));
  const int64_t since = session->assignment.hosts_version;
  if (hosts.version <= since) return {};
  return {true, hosts.last_addition <= since};
}

void State::commit() {
  ++commits_;
  save();
  check_host_updates();
}

void State::check_host_updates() {
  // Rank 0 decides for everyone: a rank that saw the change a moment before the others must not
  // leave the step alone (the others would wait for it in the next collective).
  int64_t verdict[1] = {0};  // 0 no change, 1 changed, 2 changed by removals only
  if (rank() == 0) {
    const HostUpdate u = host_update();
    verdict[0] = u.changed ? (u.only_removed ? 2 : 1) : 0;
  }
  broadcast("krug.elastic.host_update", verdict, DataType::kInt64, {1}, 0);
  if (verdict[0] != 0) throw HostsUpdatedInterrupt(verdict[0] == 2);
}

void State::register_reset_callback(std::function<void()> callback) {
  reset_callbacks_.push_back(std::move(callback));
}

void State::on_reset() {
  for (auto& f : reset_callbacks_) f();
}

// Python's recovery loop (krug.common.elastic.run_fn) follows the same policy and must change
// with this one. It is a copy on purpose: its state and the exceptions that steer it are Python's
// (see docs/architecture.md, "Elastic recovery: two loops, on purpose").
bool run(State& state, const std::function<void()>& train) {
  if (!enabled()) {
    state.sync();
    train();
    return true;
  }
  bool skip_sync = false;
  for (;;) {
    try {
      const RoundInfo round = round_info();
      // A new worker has no state yet: whatever the survivors skip, every rank syncs then.
      if (!skip_sync || round.has_new_workers) state.sync();
      train();
      return true;
    } catch (const HostsUpdatedInterrupt& e) {
      say(fmt::format("rank {}: hosts changed; re-forming the job at commit {}", rank(),
                      state.commits()));
      skip_sync = e.skip_sync();
    } catch (const WorkerRemoved& e) {
      say(e.what());
      return false;
    } catch (const Error& e) {
      const int r = is_initialized() ? rank() : -1;
      state.restore();
      say(fmt::format("rank {}: {}; rolling back to commit {}", r, first_line(e.what()),
                      state.commits()));
      skip_sync = false;
    }
    const int old_rank = rank(), old_size = size();
    shutdown();
    // A round can break while it forms (a worker dies during init): join the next one. The
    // driver's --elastic-timeout and --reset-limit bound how often.
    for (int attempt = 1;; ++attempt) {
      try {
        init();
        break;
      } catch (const WorkerRemoved& e) {
        say(e.what());
        return false;
      } catch (const Error& e) {
        if (attempt >= kInitAttempts) throw;
        say(fmt::format("worker (was rank {}): joining the new round failed: {}; trying the next "
                        "round", old_rank, first_line(e.what())));
      }
    }
    say(fmt::format("round {}: now rank {} of {} (was rank {} of {})", round_info().round, rank(),
                    size(), old_rank, old_size));
    state.on_reset();
  }
}

}  // namespace krug::elastic
