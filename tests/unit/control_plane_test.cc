// The control plane's start: what a rank is told when its coordinator never comes.
#include "engine/control_plane.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace krug::engine {
namespace {

// Rank 1 called init() again after shutdown() and rank 0 did not: rank 1's wait for rank 0's
// address ends in an error that names rank 0 and what every rank must do.
TEST(ControlPlaneStart, AWorkerWhoseCoordinatorNeverStartsIsToldSo) {
  rendezvous::InMemoryStore store;
  try {
    ControlPlane plane(1, 2, "127.0.0.1", "host-b", store, "secret", net::Protection::kAuthenticate,
                       std::chrono::milliseconds(50),
                       /*mailboxes=*/false, {});
    FAIL() << "the control plane started without rank 0";
  } catch (const rendezvous::StoreTimeout& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1 timed out after 0.05 s waiting for rank 0 to start krug"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("after shutdown() every rank must call init() again"), std::string::npos)
        << what;
  }
}

}  // namespace
}  // namespace krug::engine
