// Internal: the engine the public API (krug::init) built, for framework adapters that need
// more than the public API offers (caller-allocated outputs, say).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "api/op_name_counters.h"
#include "engine/engine.h"
#include "rendezvous/elastic_protocol.h"
#include "rendezvous/store.h"

namespace krug {

// Throws krug::Error when krug is not initialized.
std::shared_ptr<engine::Engine> current_engine();

// This initialization's counters for unnamed operations (made fresh by every init()). Throws
// krug::Error when krug is not initialized.
std::shared_ptr<OpNameCounters> current_op_name_counters();

// An elastic worker's current round: the driver's store (unprefixed) and its assignment.
struct ElasticSession {
  std::shared_ptr<rendezvous::Store> store;
  rendezvous::elastic::Assignment assignment;
};
// nullopt outside elastic mode; throws krug::Error when krug is not initialized.
std::optional<ElasticSession> current_elastic_session();

// Why the engine of a rank whose user interrupted `what` stopped: the error every rank's
// pending operations then fail with.
std::string interrupted_reason(const Config& config, std::string_view what);

}  // namespace krug
