#include "run/elastic/stragglers.h"

#include <fmt/format.h>

#include <string>

namespace krug::run {
namespace {

namespace el = rendezvous::elastic;

constexpr auto kHealthEvery = std::chrono::seconds(1);

}  // namespace

StragglerWatch::StragglerWatch(rendezvous::Store& store, const ElasticOptions& options,
                               bool verbose)
    : store_(store), e_(options), verbose_(verbose) {}

void StragglerWatch::restart(Clock::time_point now) {
  base_.reset();
  next_check_ = now + kHealthEvery;
}

std::optional<Straggler> StragglerWatch::check(int64_t round, Clock::time_point now) {
  if (e_.straggler_factor <= 0 || round < 0 || now < next_check_) return std::nullopt;
  next_check_ = now + kHealthEvery;
  const std::string key = el::health_key(round);
  if (!store_.check({key})) return std::nullopt;
  const auto bytes = store_.get(key, std::chrono::milliseconds(0));
  const el::Health h = el::decode_health(std::string(bytes.begin(), bytes.end()));
  if (!base_) {
    base_ = h;
    return std::nullopt;
  }
  if (verbose_)
    fmt::print(stderr, "krugrun: elastic: round {} readiness: {}\n", round, el::encode(h));
  if (h.steps - base_->steps < e_.straggler_window) return std::nullopt;
  const auto slow = find_straggler(*base_, h, e_.straggler_factor, e_.straggler_window);
  base_ = h;  // windows do not overlap
  return slow;
}

}  // namespace krug::run
