#include "api/elastic_health.h"

#include "common/log.h"
#include "krug/types.h"
#include "rendezvous/elastic_protocol.h"

namespace krug::api {

void HealthReporter::on_cycle(std::chrono::steady_clock::time_point now,
                              const controller::ReadinessStats& readiness) {
  if (now < next_report_) return;
  next_report_ = now + std::chrono::seconds(1);
  rendezvous::elastic::Health health{readiness.elapsed_us(now), readiness.tensors(),
                                     readiness.steps(), readiness.lateness_us()};
  const std::string text = rendezvous::elastic::encode(health);
  try {
    store_->set("health", rendezvous::Bytes(text.begin(), text.end()));
  } catch (const Error& e) {
    log::at(log::Level::kWarning, rank_, "could not report readiness to krugrun: {}", e.what());
  }
}

}  // namespace krug::api
