// The engine's coordinator: wires the units of src/engine together and runs the loop. Each job
// lives in its own unit: the submission queue (submission_queue.h), the table of operations in
// flight (tensor_table.h), wake-ups (wakeup.h), negotiation traffic (negotiation.h), execution
// (executor.h; dispatch.cc runs each agreed response on it), process sets and communicators
// (process_sets.h), failure fan-out (failure.h), and observers (observer.h: timeline,
// autotuner, stall inspector, elastic health). Engine::Impl is declared in engine_impl.h.
#include "engine/engine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <span>
#include <thread>

#include "collectives/mpi/mpi_backend.h"
#include "common/log.h"
#include "controller/response_cache.h"
#include "engine/autotune_observer.h"
#include "engine/control_plane.h"
#include "engine/engine_impl.h"
#include "engine/executor.h"
#include "engine/failure.h"
#include "engine/negotiation.h"
#include "engine/process_sets.h"
#include "engine/stall_inspector.h"
#include "engine/submission_queue.h"
#include "engine/tensor_table.h"
#include "engine/timeline_observer.h"
#include "engine/wakeup.h"
#include "net/socket.h"
#include "rendezvous/store.h"

namespace krug::engine {

using controller::OpType;
using controller::Request;
using controller::Response;
using controller::ResponseList;
using controller::ResponseType;

namespace {

const Config& validated(const Config& config) {
  if (config.size < 1 || config.rank < 0 || config.rank >= config.size)
    throw Error(
        fmt::format("krug: invalid rank {} / size {}: start the job with krugrun, or set "
                    "KRUG_RANK and KRUG_SIZE",
                    config.rank, config.size));
  return config;
}

// Busy polling only pays while every rank of this host has a core of its own; otherwise the
// polling rank takes the core from the one it waits for.
std::chrono::microseconds busy_poll_for(const Config& config) {
  const int local_ranks = config.local_size > 0 ? config.local_size : config.size;
  if (static_cast<unsigned>(local_ranks) <= std::max(1u, std::thread::hardware_concurrency()))
    return config.busy_poll;
  return {};
}

// The direct lane runs where the global set's data plane is shared memory and waiting threads
// poll (it spins for its window), with no observer that must see every operation, and for up
// to 16 ranks: every rank reads every rank's input, which beyond that costs more than the
// engine's reduce-scatter saves, and the board grows with the ranks. Every rank decides the
// same: the lane's memory is mapped collectively.
constexpr int kDirectLaneMaxRanks = 16;
// The lane's window, in busy-poll windows: a rank that the engine's last operation left asleep
// takes 50-200 µs to wake on a VM, and a window shorter than that loses its partner and sends
// both through the engine, where the same wake-up happens again. Measured, 10 runs of 20,000
// 4-byte calls at 2 ranks: with 50 µs 3 runs took 6-7 µs per call, the engine's time; with 200
// µs none took more than 1.4 µs, and 12 more runs 0.21-0.25 µs.
constexpr int kDirectLaneWindowPolls = 4;

bool direct_lane_applies(const Config& config, bool single_host, bool mailboxes,
                         std::chrono::microseconds busy_poll) {
  return config.size > 1 && config.size <= kDirectLaneMaxRanks && single_host && mailboxes &&
         config.data_plane == DataPlane::kShm && busy_poll.count() > 0 &&
         DirectLane::bytes_per_rank(config.direct_lane_bytes, config.size) > 0 &&
         !config.autotune && config.timeline_path.empty();
}

}  // namespace

Engine::Impl::Impl(const Config& config, std::shared_ptr<rendezvous::Store> store,
                   std::vector<std::shared_ptr<CycleObserver>> observers, std::stop_token stop)
    : config_(validated(config)),
      store_(std::move(store)),
      busy_poll_(busy_poll_for(config_)),
      waiters_drive_(busy_poll_.count() > 0),
      queue_(config_.rank, wakeup_, waiters_drive_, drivers_,
             {config_.fusion_threshold_bytes, config_.cycle_time.count()}),
      table_(queue_),
      cache_(config.cache_capacity) {
  if (config_.data_plane == DataPlane::kMpi)
    collectives::mpi::require_world(config_.rank, config_.size);
  if (config_.hostname.empty()) config_.hostname = net::hostname();
  const auto timeout = whole_ms(config_.timeout);
  const bool single_host = config_.local_size < 0 || config_.local_size == config_.size;
  const std::string advertise = !config_.advertise_address.empty() ? config_.advertise_address
                                : single_host                      ? "127.0.0.1"
                                                                   : config_.hostname;
  // Lists go through shared-memory mailboxes when every rank is on one host (the control plane
  // checks), unless TCP or MPI was asked for: then the data plane's choice holds here too.
  const bool mailboxes = config_.data_plane != DataPlane::kGloo &&
                         config_.data_plane != DataPlane::kTcp &&
                         config_.data_plane != DataPlane::kMpi;
  auto mailbox_segment = [&](size_t bytes) {
    rendezvous::PrefixStore prefixed("control/", store_);
    return std::make_unique<transport::Segment>(config_.rank, config_.size, bytes, config_.job_id,
                                                prefixed, timeout);
  };
  control_ = std::make_unique<ControlPlane>(
      config_.rank, config_.size, advertise, config_.hostname, *store_, config_.secret,
      net::protection_for(config_.encrypt), timeout, mailboxes, mailbox_segment, std::move(stop));
  if (config_.encrypt && config_.rank == 0 && config_.size > 1)
    log::at(log::Level::kInfo, 0,
            "connections are encrypted (KRUG_ENCRYPT=1): rendezvous store, control plane and "
            "TCP data plane; shared memory stays within a host, and NCCL's own traffic is not "
            "encrypted");
  sets_ = std::make_unique<ProcessSets>(config_, store_, *control_, advertise);
  std::vector<int32_t> all(config_.size);
  for (int i = 0; i < config_.size; ++i) all[i] = i;
  add_process_set(0, all);
  config_.data_plane = sets_->global_backend();
  if (direct_lane_applies(config_, single_host, control_->uses_mailboxes(), busy_poll_))
    lane_ = std::make_unique<DirectLane>(config_, store_, kDirectLaneWindowPolls * busy_poll_);
  sets_->wait_for_every_rank_to_connect();
  negotiation_ = std::make_unique<Negotiation>(config_, *control_, cache_, observers_, *this);
  start_observers(std::move(observers));
  thread_ = std::thread([this] { run(); });
}

void Engine::Impl::start_observers(std::vector<std::shared_ptr<CycleObserver>> observers) {
  // The stall inspector first: when it stops the job, the others hear of no further cycle.
  if (control_->is_coordinator() && !config_.stall_check_disable)
    observers_.add(std::make_shared<StallInspector>(config_, *negotiation_->negotiator(), *this));
  for (auto& observer : observers) observers_.add(std::move(observer));
  executor_ = Executor(nullptr, DeviceOptions{.timeout_seconds = config_.timeout.count(),
                                              .rank = config_.rank,
                                              .hostname = config_.hostname,
                                              .gpu_operations = config_.gpu_operations,
                                              .share_device = config_.gpu_share_device});
  if (config_.rank == 0 && !config_.timeline_path.empty() &&
      config_.timeline_path != kTimelineAtRunTime)
    swap_timeline(
        std::make_shared<TimelineObserver>(config_.timeline_path, config_.timeline_mark_cycles));
  if (control_->is_coordinator() && config_.autotune) {
    const bool hierarchical = queue_.allreduce_algorithm(0).rfind("hierarchical", 0) == 0;
    observers_.add(std::make_shared<AutotuneObserver>(config_, hierarchical, *this));
  }
}

void Engine::Impl::retune(int64_t fusion_threshold, double cycle_time_ms) {
  apply_tuning(fusion_threshold, cycle_time_ms);
  negotiation_->send_tuning(fusion_threshold, cycle_time_ms);
}

void Engine::Impl::apply_tuning(int64_t fusion_threshold, double cycle_time_ms) {
  config_.fusion_threshold_bytes = fusion_threshold;
  config_.cycle_time = Milliseconds(cycle_time_ms);
  negotiation_->set_fusion_threshold(fusion_threshold);
  queue_.set_tuned(fusion_threshold, cycle_time_ms);
}

void Engine::Impl::add_process_set(int32_t id, const std::vector<int32_t>& ranks) {
  std::string algorithm = sets_->add(id, ranks);
  queue_.set_process_set(id, ranks, std::move(algorithm));
}

template <typename Fill>
std::shared_ptr<HandleState> Engine::Impl::enqueue(size_t count, const Fill& fill) {
  auto handle = std::make_shared<HandleState>(static_cast<int>(count));
  if (count == 0) return handle;
  if (waiters_drive_) handle->set_driver(weak_from_this());
  queue_.submit(handle, count, fill);
  return handle;
}

std::shared_ptr<HandleState> Engine::Impl::enqueue(const TensorView& t) {
  return enqueue(1, [&](size_t, TensorArgs& args) {
    // Assignments into the reused entry's capacity. Every field is set: the entry held another
    // operation before.
    Request& q = args.request;
    q.name = t.name;
    q.op = t.op;
    q.dtype = t.dtype;
    q.reduce_op = t.reduce_op;
    q.process_set = t.process_set;
    q.root = t.root;
    q.prescale = t.prescale;
    q.postscale = t.postscale;
    q.shape.assign(t.shape.begin(), t.shape.end());
    q.splits.clear();
    q.set_ranks.clear();
    q.target_process_set = 0;
    q.group.clear();
    q.group_size = 0;
    q.device = controller::kHostMemory;  // by reference: host tensors only
    args.input = t.input;
    args.output = t.output;
    args.allocate_output = nullptr;
    args.ready = nullptr;
    args.device = -1;
  });
}

bool Engine::Impl::run_direct(const TensorView& t) {
  if (!lane_ || !lane_->suits(t)) return false;
  if (!idle_for_direct_call()) {
    // The call takes the engine: peers already waiting with it on the lane need not wait out
    // their window (and this rank's share of the lane stays in step with theirs).
    lane_->decline(t);
    return false;
  }
  return lane_->run(t);
}

bool Engine::Impl::idle_for_direct_call() {
  // Only while nothing else of this rank's is in flight: the lane then cannot overtake an
  // operation of the same name, and the engine, idle, is not needed. The background thread
  // holds the loop for microseconds at a time: wait that out, but not a loop that stays busy.
  // Nor while the background thread waits for the loop: let it first.
  std::unique_lock lock(loop_mu_, std::defer_lock);
  if (!try_take_loop(lock)) {
    // Yield between tries rather than spin: a holder on this thread's core runs only once this
    // thread gives the core up. Spinning, 1 run in 4 of krug-bench's sweep found the loop held
    // past the window at its first call after a barrier (and free 10-20 us later), and that
    // call took the engine, 0.1-0.5 ms. (A timed mutex would sleep instead, but its
    // pthread_mutex_clocklock is unseen by ThreadSanitizer, which then reports the unlock.)
    // Read the clock only here: a read costs a VM a good part of a whole lane call.
    const auto until = Clock::now() + busy_poll_;
    while (!try_take_loop(lock)) {
      if (Clock::now() >= until) return false;
      std::this_thread::yield();
    }
  }
  return idle_for_lane() && !queue_.changed();
}

bool Engine::Impl::idle_for_lane() const {
  // A timeline (the one observer of every operation) must see each call on the engine.
  return !stopped_ && !observers_.tensors() && table_.empty();
}

size_t Engine::Impl::direct_lane_bytes(controller::OpType op) const {
  return lane_ ? lane_->max_bytes(op) : 0;
}

void Engine::Impl::shutdown() {
  queue_.request_shutdown();
  wakeup_.wake();
  if (thread_.joinable()) thread_.join();
  stop_timeline();  // the file is complete when shutdown() returns
}

void Engine::Impl::abort(const std::string& reason) {
  {
    // The loop's state is ours while we hold loop_mu_ (as a waiting thread's drive() does).
    std::lock_guard lock(loop_mu_);
    stop_engine(reason, true);
  }
  // The background thread finds the loop stopped and ends.
  wakeup_.wake();
}

// ---- The loop ----

void Engine::Impl::run() {
  for (;;) {
    try {
      if (!loop_once()) break;
    } catch (const std::exception& e) {
      std::lock_guard lock(loop_mu_);
      fail_loop(e);
    }
  }
  // Communicators go away on this thread, after the last collective that used them.
  std::lock_guard lock(loop_mu_);
  sets_->clear();
}

void Engine::Impl::fail_loop(const std::exception& e) {
  stop_engine(root_cause(fmt::format("krug background loop failed on rank {} ({}): {}",
                                     config_.rank, config_.hostname, e.what())),
              true);
}

std::vector<pollfd> Engine::Impl::poll_fds() const {
  std::vector<pollfd> fds;
  fds.push_back({wakeup_.event_fd(), POLLIN, 0});
  fds.push_back({wakeup_.timer_fd(), POLLIN, 0});
  for (int fd : control_->fds())
    if (fd >= 0) fds.push_back({fd, POLLIN, 0});
  return fds;
}

void Engine::Impl::advance(bool background) {
  absorb_queue(background);
  negotiation_->advance(Clock::now(), table_.empty());
  publish_busy();
}

void Engine::Impl::publish_busy() {
  if (lane_) lane_->set_engine_busy(!table_.empty());
}

void Engine::Impl::receive(bool sockets) {
  if (!sockets) {
    if (control_->has_mail()) negotiation_->receive({});
    publish_busy();
    return;
  }
  auto fds = poll_fds();
  const int n = ::poll(fds.data(), fds.size(), 0);
  if (n < 0 && errno != EINTR) throw Error(fmt::format("poll failed: {}", std::strerror(errno)));
  if (n <= 0 && !control_->has_mail()) return;
  if (fds[0].revents) wakeup_.drain_event();
  if (fds[1].revents && wakeup_.drain_timer()) queue_.timer_fired();
  negotiation_->receive(std::vector<pollfd>(fds.begin() + 2, fds.end()));
  publish_busy();
}

bool Engine::Impl::try_take_loop(std::unique_lock<std::mutex>& lock) {
  return !background_waits_.load(std::memory_order_relaxed) && lock.try_lock();
}

std::unique_lock<std::mutex> Engine::Impl::lock_loop_in_background() {
  std::unique_lock lock(loop_mu_, std::try_to_lock);
  if (lock.owns_lock()) return lock;
  // A thread that waits for its operations takes and releases the loop once per operation. A
  // thread asleep on the mutex meanwhile is woken by every release, and finds the loop taken
  // again: each release costs the waiting thread a system call, and each wake-up, where the
  // ranks fill the cores, preempts a rank that spins on the lane for its partner. Measured with
  // the step of one 4 KiB allreduce at 2 ranks: 2,000-29,000 wake-ups a second, the p99 step
  // 14-30 us in half the runs against a median of 0.75. So the next driver lets it in first.
  background_waits_.store(true);
  lock.lock();
  background_waits_.store(false);
  return lock;
}

bool Engine::Impl::loop_once() {
  std::vector<pollfd> fds;
  int timeout = -1;
  bool busy = false;
  {
    auto lock = lock_loop_in_background();
    if (stopped_) return false;
    if (woken_) {
      // What the last poll() reported; a waiting thread may have read it all meanwhile.
      woken_ = false;
      receive();
      if (stopped_) return false;
    }
    advance(/*background=*/true);
    if (stopped_) return false;
    control_->ring_doorbells(/*force=*/true);  // this thread may sleep next
    fds = poll_fds();
    timeout = poll_timeout_ms(Clock::now());
    busy = busy_poll_.count() > 0 && timeout != 0 && !table_.empty() && drivers_ == 0;
  }
  // Sleep without the loop, so a thread that waits for a handle can run it meanwhile.
  int n = 0;
  // Busy-poll briefly while this rank has operations in flight: the answer usually comes within
  // tens of microseconds, and sleeping costs a wake-up as long again on a VM. (Measured and not
  // done: spinning in Handle::wait and polling on after the last completion; with a user thread
  // and this thread per rank on one core each they slowed the 4 KiB and 100 x 1 KiB steps.)
  if (busy) {
    const auto until = Clock::now() + busy_poll_;
    do n = control_->has_mail() ? 1 : ::poll(fds.data(), fds.size(), 0);
    while (n == 0 && Clock::now() < until && drivers_.load(std::memory_order_relaxed) == 0);
  }
  if (n == 0) n = sleep_until_woken(fds, timeout);
  if (n < 0 && errno != EINTR) throw Error(fmt::format("poll failed: {}", std::strerror(errno)));
  woken_ = n > 0;  // received at the start of the next round, under the same hold of the loop
  return true;
}

int Engine::Impl::sleep_until_woken(std::vector<pollfd>& fds, int timeout_ms) {
  const auto until = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  // Peers ring the doorbell only for a sleeper: say so, then look once more.
  asleep_ = true;
  int n = 0;
  for (bool again = false;; again = true) {
    // Looking again, not while a thread drives the loop: it reads the mailboxes, so peers need
    // not ring, and it says that this thread sleeps as it leaves (leave_loop).
    const bool driven = again && drivers_.load() > 0;
    if (!driven && !control_->prepare_to_sleep()) timeout_ms = 0;
    n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n <= 0 || !woken_for_nothing(fds)) break;
    // The cycle timer of a burst a waiting thread has taken meanwhile: a round now would only
    // wait for the loop that thread holds, and be woken again as it lets go. Where the ranks
    // fill the cores, each such wake-up preempts one (with the 1 ms cycle, the 100 x 1 KiB
    // step's p90 was 44-82 us against a median of 34).
    if (timeout_ms > 0)
      timeout_ms = static_cast<int>(std::max<int64_t>(
          0, std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count()));
  }
  control_->awake();
  asleep_ = false;
  if (n == 0 && control_->has_mail()) n = 1;
  return n;
}

bool Engine::Impl::woken_for_nothing(const std::vector<pollfd>& fds) {
  const bool timer_alone =
      fds[1].revents != 0 && fds[0].revents == 0 &&
      std::all_of(fds.begin() + 2, fds.end(), [](const pollfd& p) { return p.revents == 0; });
  if (!timer_alone || !wakeup_.drain_timer()) return false;
  return !queue_.timer_fired();  // its burst was taken, or is younger than the cycle
}

void Engine::Impl::drive(const HandleState& handle, Clock::time_point deadline) {
  ++drivers_;
  // Poll as long as lists keep coming, and for the answer as long as the background loop would
  // after the last one; then sleep and leave the rest to it: the peers may be far behind.
  auto until = std::min(deadline, Clock::now() + busy_poll_);
  // While the background thread is in a round (it may be finishing this very operation), poll
  // rather than sleep on the mutex: a sleeper costs a wake-up as long as the operation.
  std::unique_lock lock(loop_mu_, std::defer_lock);
  while (!try_take_loop(lock)) {
    if (handle.done() || Clock::now() >= until) return leave_loop(false, !handle.done());
    // The background thread waits for the loop: give it this thread's core meanwhile, on which
    // it may be the one waiting to run.
    if (background_waits_.load(std::memory_order_relaxed)) std::this_thread::yield();
  }
  if (stopped_) return leave_loop(true);
  drive_deadline_ = deadline;
  // Lists are read here now: peers need not ring the sleeping background thread's doorbell.
  control_->awake();
  try {
    for (unsigned round = 0;; ++round) {
      advance();
      if (stopped_ || handle.done()) break;
      control_->ring_doorbells(/*force=*/false);
      const uint64_t before = negotiation_->lists_seen();
      // Not in the first round: a poll() per operation costs as much as the whole exchange
      // through the mailboxes, and what the sockets carry here is rare.
      receive(!control_->uses_mailboxes() || round % 64 == 63);
      if (stopped_ || handle.done()) break;
      const auto now = Clock::now();
      if (negotiation_->lists_seen() != before) until = std::min(deadline, now + busy_poll_);
      if (now >= until) break;
    }
  } catch (const std::exception& e) {
    fail_loop(e);
  }
  leave_loop(true);
}

void Engine::Impl::leave_loop(bool held, bool untaken) {
  if (held) drive_deadline_ = Clock::time_point::max();
  if (held) control_->ring_doorbells(/*force=*/true);
  // First no longer a driver, then look at the queue (under its mutex, as enqueue reads
  // drivers_): an enqueue that saw this thread still driving did not wake the background thread.
  drivers_.fetch_sub(1);
  if (untaken) {
    // This thread sleeps on its handle without having taken the queue: the background thread
    // takes it at once, rather than wait out the batching window for this thread to take it.
    return queue_.expedite();  // wakes it if the queue holds anything
  }
  // The background thread sleeps on: peers must ring its doorbell again, unless a list came in
  // just now (then it must look, as it must at any work left).
  bool left = held && asleep_ && !control_->prepare_to_sleep();
  left = left || (held && (stopped_ || !table_.empty() || negotiation_->has_outgoing() ||
                           negotiation_->shutting_down()));
  if (!left) left = queue_.has_work();
  if (left) wakeup_.wake();
}

int Engine::Impl::poll_timeout_ms(Clock::time_point now) const {
  // Sleep until work arrives or a peer speaks, unless negotiation or an observer is due first.
  std::optional<Clock::time_point> due = negotiation_->due();
  for (const auto& observer : observers_.all())
    if (auto at = observer->wake_at()) due = due ? std::min(*due, *at) : *at;
  if (!due) return -1;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(*due - now).count();
  return static_cast<int>(std::max<int64_t>(0, ms + 1));
}

void Engine::Impl::absorb_queue(bool background) {
  if (!queue_.changed()) return;
  bool shutting_down = false;
  if (!queue_.take(background, arrived_, shutting_down)) return;
  if (!shutting_down && ran_on_lane(background)) return;
  for (auto& node : arrived_) {
    const Request& q = node.mapped().args.request;
    int64_t hit = -1;
    if (controller::ResponseCache::cacheable(q))
      if (auto id = cache_.find(node.key(), q)) hit = *id;
    negotiation_->request(q, hit);
    if (observers_.tensors()) {
      const auto now = Clock::now();
      observers_.each([&](CycleObserver& o) { o.on_submitted(q, now); });
    }
    table_.insert(std::move(node), hit, cache_.size());
  }
  arrived_.clear();
  if (shutting_down) negotiation_->begin_shutdown(Clock::now() + whole_ms(config_.timeout));
}

bool Engine::Impl::ran_on_lane(bool background) {
  // Not on the background thread, which would spin there while the rank's own threads want its
  // core; not for several operations, which fusion through negotiation serves better; not for
  // a thread that waits only until a deadline sooner than the window. A peer that waits for it
  // on the lane meanwhile leaves as soon as this rank's engine says it is busy with it.
  if (!lane_ || background || arrived_.size() != 1 || !idle_for_lane()) return false;
  if (drive_deadline_ != Clock::time_point::max() &&
      Clock::now() + lane_->window() > drive_deadline_)
    return false;
  LocalEntry& first = arrived_.front().mapped();
  const TensorArgs& args = first.args;
  const Request& q = args.request;
  // By reference, in host memory, whole: as a synchronous call's.
  if (q.group_size != 0 || q.device != controller::kHostMemory || args.device >= 0 || args.ready ||
      args.allocate_output)
    return false;
  const TensorView view{.name = q.name,
                        .op = q.op,
                        .dtype = q.dtype,
                        .shape = q.shape,
                        .process_set = q.process_set,
                        .reduce_op = q.reduce_op,
                        .prescale = q.prescale,
                        .postscale = q.postscale,
                        .root = q.root,
                        .input = args.input,
                        .output = args.output};
  if (!lane_->suits(view) || !lane_->run(view, DirectLane::Wait::kWindowOnly)) return false;
  auto handle = std::move(first.handle);
  queue_.recycle(arrived_);  // its name is no longer in flight
  arrived_.clear();
  handle->complete_part();
  return true;
}

// ---- Responses ----

void Engine::Impl::process(ResponseList list) {
  control_->ring_doorbells(/*force=*/true);  // a collective may wait for a peer they wake
  if (!control_->is_coordinator() && list.tuned_cycle_time_ms > 0)
    apply_tuning(list.tuned_fusion_threshold, list.tuned_cycle_time_ms);
  if (!control_->is_coordinator() && !list.stalls.empty())  // the coordinator logged them all
    log_stalls_of_rank(config_.rank, config_.stall_check_time.count(), list.stalls);
  announce(list);
  int64_t moved = 0;  // payload bytes executed in this cycle, for the autotuner
  for (auto& r : list.responses) {
    if (observers_.tensors())
      for (const auto& name : r.names)
        if (table_.contains(controller::table_key(r.process_set, name))) {
          const auto now = Clock::now();
          observers_.each([&](CycleObserver& o) { o.on_started(name, now); });
        }
    if (r.type == ResponseType::kError) {  // the negotiation's verdict: nothing was sent
      fail_names(r, r.error, /*precondition=*/true);
      continue;
    }
    try {
      execute(r);
      if (observers_.bytes()) moved += payload_bytes(r);
    } catch (const std::exception& e) {
      std::string message = root_cause(fmt::format(
          "{} of [{}] (process set {}) failed on rank {} ({}): {}", controller::op_name(r.op),
          fmt::join(names_of(r), ", "), r.process_set, config_.rank, config_.hostname, e.what()));
      fail_names(r, message, /*precondition=*/false);
      stop_engine(message, true);
      return;
    }
    if (stopped_) return;
  }
  if (observers_.bytes() && moved > 0) {
    const auto now = Clock::now();
    observers_.each([&](CycleObserver& o) { o.on_executed(moved, now); });
  }
  if (list.shutdown) {
    std::string reason = list.fatal ? list.shutdown_reason
                                    : fmt::format("krug was shut down: {}", list.shutdown_reason);
    stop_engine(reason, false, list.fatal);
  }
}

void Engine::Impl::announce(ResponseList& list) {
  // Expand cached responses first so that observers see every name decided before any
  // collective starts: the timeline's QUEUE phase is the wait behind earlier responses.
  for (auto& r : list.responses) {
    if (r.from_cache) {
      // The allreduce path finds its tensors by id; names only for what shows or needs them.
      cache_.expand(r, /*names=*/false);  // its op is known from here on
      if (observers_.tensors() || r.op != OpType::kAllreduce) cache_.expand(r);
    } else {
      for (size_t i = 0; i < r.cache_ids.size(); ++i)
        if (!cache_.contains(r.cache_ids[i]))
          cache_.insert(r.cache_ids[i], controller::cache_form(r, i));
    }
    if (!observers_.tensors()) continue;
    for (const auto& name : r.names) {
      if (!table_.contains(controller::table_key(r.process_set, name))) continue;
      const auto now = Clock::now();
      observers_.each([&](CycleObserver& o) { o.on_decided(name, r.op, now); });
    }
  }
}

int64_t Engine::Impl::payload_bytes(const Response& r) const {
  if (!r.names.empty()) return controller::response_bytes(r);
  int64_t bytes = 0;
  for (uint32_t id : r.cache_ids)
    bytes += cache_.elements(id) * static_cast<int64_t>(dtype_size(r.dtype));
  return bytes;
}

void Engine::Impl::fail_names(const Response& r, const std::string& error, bool precondition) {
  for (const auto& name : names_of(r)) {
    auto key = controller::table_key(r.process_set, name);
    if (table_.contains(key)) finish(key, error, precondition);
  }
}

std::vector<std::string> Engine::Impl::names_of(const Response& r) const {
  if (!r.names.empty() || r.cache_ids.empty()) return r.names;
  std::vector<std::string> names;
  for (uint32_t id : r.cache_ids) names.push_back(cache_.at(id).name);
  return names;
}

void Engine::Impl::finish(const std::string& key, const std::string& error, bool precondition) {
  negotiation_->completed(table_.finish(key, error, precondition));
}

// ---- Failures ----

std::string Engine::Impl::root_cause(const std::string& local_error) {
  if (!control_) return local_error;
  return engine::root_cause(*control_, local_error);
}

void Engine::Impl::stop_engine(std::string message, bool tell_peers, bool is_error) {
  if (stopped_) return;
  if (is_error) log::at(log::Level::kError, config_.rank, "{}", message);
  if (tell_peers) engine::tell_peers(*control_, config_.rank, message);
  for (auto& node : queue_.fail(message)) {
    const Request& q = node.mapped().args.request;
    node.mapped().handle->complete_part(incomplete(q, message), q.name);
  }
  table_.fail_all(message);
  stopped_ = true;
}

// ---- Engine ----

Engine::Engine(const Config& config, std::shared_ptr<rendezvous::Store> store,
               std::vector<std::shared_ptr<CycleObserver>> observers, std::stop_token stop)
    : impl_(std::make_shared<Impl>(config, std::move(store), std::move(observers),
                                   std::move(stop))) {}
// A thread still driving a handle keeps the rest of Impl alive until it returns.
Engine::~Engine() {
  impl_->shutdown();
}
void Engine::shutdown() {
  impl_->shutdown();
}
void Engine::abort(const std::string& reason) {
  impl_->abort(reason);
}
std::shared_ptr<HandleState> Engine::enqueue(std::vector<TensorArgs> tensors) {
  return impl_->enqueue(tensors.size(),
                        [&](size_t i, TensorArgs& args) { args = std::move(tensors[i]); });
}
std::shared_ptr<HandleState> Engine::enqueue(TensorArgs tensor) {
  return impl_->enqueue(1, [&](size_t, TensorArgs& args) { args = std::move(tensor); });
}
std::shared_ptr<HandleState> Engine::enqueue(const TensorView& tensor) {
  return impl_->enqueue(tensor);
}
bool Engine::run_direct(const TensorView& tensor) {
  return impl_->run_direct(tensor);
}

size_t Engine::direct_lane_bytes(controller::OpType op) const {
  return impl_->direct_lane_bytes(op);
}

uint64_t Engine::direct_runs() const {
  return impl_->direct_runs();
}

void Engine::expedite() const {
  impl_->queue().expedite();
}
const Config& Engine::config() const {
  return impl_->config();
}
int Engine::rank() const {
  return impl_->config().rank;
}
int Engine::size() const {
  return impl_->config().size;
}
std::vector<int32_t> Engine::process_set_ranks(int32_t id) const {
  return impl_->queue().ranks_of(id);
}
std::string Engine::allreduce_algorithm(int32_t id) const {
  return impl_->queue().allreduce_algorithm(id);
}
std::pair<int64_t, double> Engine::tuned_parameters() const {
  return impl_->queue().tuned();
}

}  // namespace krug::engine
