#include "engine/failure.h"

#include <fmt/format.h>
#include <poll.h>

#include <chrono>
#include <optional>
#include <vector>

namespace krug::engine {

using Clock = std::chrono::steady_clock;

void tell_peers(ControlPlane& control, int rank, const std::string& message) {
  try {
    if (control.is_coordinator()) {
      controller::ResponseList bye;
      bye.shutdown = true;
      bye.fatal = true;
      bye.shutdown_reason = message;
      control.broadcast(bye);
    } else {
      controller::RequestList report;
      report.rank = rank;
      report.fatal_error = message;
      control.send_to_coordinator(report);
    }
  } catch (const std::exception&) {
    // Peers will notice the closed connection instead.
  }
}

namespace {

// A failure report already received from `peer`: a fatal shutdown (on a worker) or a worker's
// fatal error (on the coordinator).
std::optional<std::string> report_waiting(ControlPlane& control, bool coordinator, int peer) {
  if (!coordinator) {
    while (auto list = control.next_response_list())
      if (list->shutdown && list->fatal) return list->shutdown_reason;
  } else {
    while (auto list = control.next_request_list(peer))
      if (!list->fatal_error.empty()) return list->fatal_error;
  }
  return std::nullopt;
}

}  // namespace

std::string root_cause(ControlPlane& control, const std::string& local_error) {
  const auto until = Clock::now() + std::chrono::milliseconds(1500);
  const auto fds = control.fds();
  const bool coordinator = control.is_coordinator();
  std::vector<pollfd> pfds;
  std::vector<int> peers;  // of each pfds entry
  for (size_t i = 0; i < fds.size(); ++i)
    if (fds[i] >= 0) {
      pfds.push_back({fds[i], POLLIN, 0});
      peers.push_back(coordinator ? static_cast<int>(i) : 0);
    }
  // Lists in mailboxes ring no doorbell for a rank that does not sleep: look at them often.
  const int slice_ms = control.uses_mailboxes() ? 5 : 100;
  while (!pfds.empty() && Clock::now() < until) {
    for (auto& p : pfds) p.revents = 0;
    ::poll(pfds.data(), pfds.size(), slice_ms);
    for (size_t j = 0; j < pfds.size(); ++j) {
      const int peer = peers[j];
      try {
        if (pfds[j].revents) control.read_socket(peer);
        if (auto report = report_waiting(control, coordinator, peer)) return *report;
      } catch (const std::exception&) {
        // A peer that reported and then exited: over shared-memory mailboxes its report waits
        // in the mailbox while its socket only says it closed.
        try {
          if (auto report = report_waiting(control, coordinator, peer)) return *report;
        } catch (const std::exception&) {
          // Nothing readable was left.
        }
        if (!coordinator) return local_error;  // the coordinator itself is gone; this says enough
        control.close_worker(peer);
        return fmt::format(
            "rank {} on {} exited or lost its connection (first failure seen); "
            "on rank 0 this surfaced as: {}",
            peer, control.host_of(peer), local_error);
      }
    }
  }
  return local_error;
}

}  // namespace krug::engine
