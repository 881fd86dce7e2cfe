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

// current_engine() for a call that does not outlive the reference: this thread's own copy, read
// without a lock, valid until this thread's next call into krug. The copy is refreshed once
// init() or shutdown() has changed the engine since; until then (or the thread's exit) it keeps
// an engine that shutdown() stopped in memory. Throws krug::Error when krug is not initialized.
const std::shared_ptr<engine::Engine>& engine_for_call();

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
