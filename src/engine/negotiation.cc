#include "engine/negotiation.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "common/log.h"
#include "net/socket.h"

namespace krug::engine {

using controller::RequestList;
using controller::ResponseList;

Negotiation::Negotiation(const Config& config, ControlPlane& control,
                         controller::ResponseCache& cache, const Observers& observers, Sink& sink)
    : config_(config), control_(control), observers_(observers), sink_(sink) {
  if (control_.is_coordinator()) {
    negotiator_ = std::make_unique<controller::Negotiator>(config_.size,
                                                           config_.fusion_threshold_bytes, cache);
    if (config_.elastic) negotiator_->track_readiness();  // for the elastic health report
  }
}

void Negotiation::begin_shutdown(Clock::time_point deadline) {
  if (!shutting_down()) shutdown_deadline_ = deadline;
}

void Negotiation::completed(size_t count) {
  awaiting_response_ = std::max(0, awaiting_response_ - static_cast<int>(count));
}

void Negotiation::set_fusion_threshold(int64_t bytes) {
  if (negotiator_) negotiator_->set_fusion_threshold(bytes);
}

void Negotiation::send_tuning(int64_t fusion_threshold_bytes, double cycle_time_ms) {
  tuning_to_send_ = {fusion_threshold_bytes, cycle_time_ms};
}

std::chrono::microseconds Negotiation::cycle() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(config_.cycle_time);
}

std::optional<Clock::time_point> Negotiation::due() const {
  std::optional<Clock::time_point> at;
  auto consider = [&](Clock::time_point t) { at = at ? std::min(*at, t) : t; };
  if (has_outgoing()) consider(last_send_ + cycle());
  if (shutting_down() && !shutdown_sent_) consider(shutdown_deadline_);
  return at;
}

void Negotiation::advance(Clock::time_point now, bool drained) {
  if (control_.is_coordinator())
    coordinate(now, drained);
  else
    send_requests(now, drained);
}

void Negotiation::send_requests(Clock::time_point now, bool drained) {
  // Nagle-style batching: send at once when nothing of ours is awaiting a response (lowest
  // latency for a lone op), otherwise at most once per cycle so a burst fuses well.
  if (has_outgoing() && (awaiting_response_ == 0 || now >= last_send_ + cycle())) {
    RequestList list;
    list.rank = config_.rank;
    list.requests.swap(outgoing_);
    list.cache_hits.swap(outgoing_hits_);
    awaiting_response_ += static_cast<int>(list.requests.size() + list.cache_hits.size());
    control_.send_to_coordinator(list, /*hold_doorbell=*/true);  // the engine rings it
    last_send_ = now;
  }
  if (shutting_down() && (drained || now >= shutdown_deadline_) && !shutdown_sent_) {
    RequestList list;
    list.rank = config_.rank;
    list.shutdown = true;
    control_.send_to_coordinator(list);
    shutdown_sent_ = true;
  }
}

void Negotiation::coordinate(Clock::time_point now, bool drained) {
  if (has_outgoing()) {
    RequestList own;
    own.rank = config_.rank;
    own.requests.swap(outgoing_);
    own.cache_hits.swap(outgoing_hits_);
    negotiator_->add(own, now);
    dirty_ = true;
  }
  ResponseList list;
  if (dirty_) {
    observers_.each([&](CycleObserver& o) { o.on_round(now); });
    list.responses = negotiator_->compute();
    dirty_ = false;
  }
  if (shutting_down() && (drained || now >= shutdown_deadline_)) {
    list.shutdown = true;
    list.shutdown_reason =
        fmt::format("rank 0 ({}) called shutdown(){}", config_.hostname, still_pending(now));
  }
  // In order: the stall inspector, first, may stop the job, and then nobody else is told.
  for (const auto& observer : observers_.all()) {
    observer->on_cycle(now, negotiator_->readiness());
    if (sink_.stopped()) return;
  }
  list.stalls.swap(stalls_to_send_);
  if (list.responses.empty() && !list.shutdown && list.stalls.empty()) return;
  if (tuning_to_send_) {
    list.tuned_fusion_threshold = tuning_to_send_->first;
    list.tuned_cycle_time_ms = tuning_to_send_->second;
    tuning_to_send_.reset();
  }
  for (int r : control_.broadcast(list))
    log::at(log::Level::kWarning, 0, "could not send responses to rank {}", r);
  sink_.process(std::move(list));
}

void Negotiation::receive(const std::vector<pollfd>& fds) {
  if (control_.is_coordinator())
    receive_requests(fds);
  else
    receive_responses(fds);
}

void Negotiation::receive_responses(const std::vector<pollfd>& fds) {
  // A coordinator that closed its socket may have written its last lists into the mailbox just
  // before (its final responses and shutdown notice): those are read first, and the closed
  // socket counts only when nothing of the coordinator's is left.
  std::string lost;
  for (bool first = true;; first = false) {
    std::optional<ResponseList> list;
    try {
      if (first && !fds.empty() && fds[0].revents) control_.read_socket(0);
    } catch (const net::NetError& e) {
      lost = e.what();
    }
    try {
      list = control_.next_response_list();
    } catch (const net::NetError& e) {
      lost = e.what();
    }
    if (!list) {
      if (!lost.empty())
        sink_.fatal(fmt::format("rank {} lost its connection to the coordinator (rank 0 on {}): "
                                "{}; rank 0 probably exited or was killed: see its output",
                                config_.rank, control_.host_of(0), lost),
                    false);
      return;
    }
    ++lists_seen_;
    sink_.process(std::move(*list));
    if (sink_.stopped()) return;
  }
}

void Negotiation::receive_requests(const std::vector<pollfd>& fds) {
  const auto control_fds = control_.fds();
  std::map<int, std::string> lost;  // ranks whose socket failed, and why
  for (const pollfd& p : fds) {
    if (!p.revents) continue;
    const int rank = static_cast<int>(std::find(control_fds.begin(), control_fds.end(), p.fd) -
                                      control_fds.begin());
    try {
      control_.read_socket(rank);
    } catch (const net::NetError& e) {
      lost[rank] = e.what();
    }
  }
  // As on a worker, a closed socket counts only once the peer's mailbox is empty.
  const auto now = Clock::now();
  for (int rank = 1; rank < config_.size; ++rank) {
    for (;;) {
      std::optional<RequestList> list;
      try {
        list = control_.next_request_list(rank);
      } catch (const net::NetError& e) {
        lost[rank] = e.what();
      }
      if (!list) {
        if (auto it = lost.find(rank); it != lost.end()) {
          control_.close_worker(rank);
          sink_.fatal(fmt::format("rank {} on {} disconnected from the coordinator ({}): it "
                                  "probably exited or was killed; see its output for the cause",
                                  rank, control_.host_of(rank), it->second),
                      true);
          return;
        }
        break;
      }
      ++lists_seen_;
      if (!list->fatal_error.empty()) return sink_.fatal(list->fatal_error, true);
      if (list->shutdown) return worker_shut_down(rank);
      negotiator_->add(*list, now);
      dirty_ = true;
    }
  }
}

void Negotiation::worker_shut_down(int rank) {
  ResponseList bye;
  bye.shutdown = true;
  bye.shutdown_reason = fmt::format("rank {} ({}) called shutdown(){}", rank,
                                    control_.host_of(rank), still_pending(Clock::now()));
  control_.broadcast(bye);
  sink_.process(std::move(bye));
}

std::string Negotiation::still_pending(Clock::time_point now) const {
  auto pending = negotiator_->stalls(now, 0);
  if (pending.empty()) return {};
  return fmt::format(" while these operations were pending:{}", controller::describe(pending));
}

}  // namespace krug::engine
