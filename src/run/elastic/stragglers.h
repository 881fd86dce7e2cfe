// Straggler detection of an elastic job (--straggler-factor, docs/elastic.md): the workers of a
// round report how long each step waited for each rank (elastic_protocol.h's Health); over
// windows of --straggler-window steps, a rank the others keep waiting for is a straggler.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include "rendezvous/elastic_protocol.h"
#include "rendezvous/store.h"
#include "run/cli/options.h"
#include "run/elastic/plan.h"

namespace krug::run {

class StragglerWatch {
 public:
  using Clock = std::chrono::steady_clock;

  StragglerWatch(rendezvous::Store& store, const ElasticOptions& options, bool verbose);

  // A round started at `now`: the next window starts with the round's first report.
  void restart(Clock::time_point now);
  // The straggler of `round` over the window that ends now, if there is one (looked for once a
  // second, and never with --straggler-factor 0).
  std::optional<Straggler> check(int64_t round, Clock::time_point now);
  // The straggler's host left: the next window starts afresh.
  void forget_window() { base_.reset(); }

 private:
  rendezvous::Store& store_;
  const ElasticOptions& e_;
  bool verbose_;
  std::optional<rendezvous::elastic::Health> base_;  // the report the window starts from
  Clock::time_point next_check_{};
};

}  // namespace krug::run
