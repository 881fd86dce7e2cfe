// Failure fan-out over the control plane: telling every rank of a failure here, and finding the
// first cause of a failure among the peers' reports.
#pragma once

#include <string>

#include "engine/control_plane.h"

namespace krug::engine {

// The coordinator broadcasts a fatal shutdown; a worker reports to the coordinator, which
// broadcasts it. Best effort: a peer that cannot be told notices the closed connection.
void tell_peers(ControlPlane& control, int rank, const std::string& message);

// A failed collective is usually the echo of a peer dying. Gives the control plane a moment
// (up to 1.5 s) to report which peer, so every rank shows the first cause instead of
// "connection reset"; returns that cause, or `local_error` when none came.
std::string root_cause(ControlPlane& control, const std::string& local_error);

}  // namespace krug::engine
