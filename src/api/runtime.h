// Internal: the engine the public API (krug::init) built, for framework adapters that need
// more than the public API offers (caller-allocated outputs, say).
#pragma once

#include <memory>

#include "engine/engine.h"

namespace krug {

// Throws krug::Error when krug is not initialized.
std::shared_ptr<engine::Engine> current_engine();

}  // namespace krug
