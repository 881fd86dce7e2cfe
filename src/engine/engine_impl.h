// Engine::Impl's declaration, shared by the files that define its members: engine.cc (wiring,
// the loop, failures) and dispatch.cc (running each decided response). Private to src/engine.
#pragma once

#include <poll.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "controller/response_cache.h"
#include "engine/control_plane.h"
#include "engine/direct_lane.h"
#include "engine/engine.h"
#include "engine/executor.h"
#include "engine/negotiation.h"
#include "engine/observer.h"
#include "engine/process_sets.h"
#include "engine/submission_queue.h"
#include "engine/tensor_table.h"
#include "engine/timeline_observer.h"
#include "engine/wakeup.h"
#include "rendezvous/store.h"

namespace krug::engine {

// The loop's state belongs to whichever thread holds loop_mu_: the background thread, or a user
// thread waiting for a handle (drive()), which runs the same loop itself instead of sleeping
// until the background thread has done the work and woken it.
class Engine::Impl : public Driver,
                     public Negotiation::Sink,
                     public EngineKnobs,
                     public std::enable_shared_from_this<Engine::Impl> {
 public:
  Impl(const Config& config, std::shared_ptr<rendezvous::Store> store,
       std::vector<std::shared_ptr<CycleObserver>> observers, std::stop_token stop);
  ~Impl() override { shutdown(); }

  void shutdown();
  void abort(const std::string& reason);
  void start_timeline(const std::string& path, bool mark_cycles);
  void stop_timeline();
  template <typename Fill>
  std::shared_ptr<HandleState> enqueue(size_t count, const Fill& fill);
  std::shared_ptr<HandleState> enqueue(const TensorView& tensor);
  bool run_direct(const TensorView& tensor);
  // Whether a synchronous call may take the direct lane now (nothing else of this rank's is in
  // flight, no timeline records it).
  bool idle_for_direct_call();
  // With loop_mu_ held: whether a call may take the lane as far as the loop goes (it runs,
  // nothing of this rank's is in flight, no observer must see every operation).
  bool idle_for_lane() const;
  size_t direct_lane_bytes(controller::OpType op) const;
  uint64_t direct_runs() const { return lane_ ? lane_->runs() : 0; }
  SubmissionQueue& queue() { return queue_; }
  const SubmissionQueue& queue() const { return queue_; }
  const Config& config() const { return config_; }
  void drive(const HandleState& handle, Clock::time_point deadline) override;

  // Negotiation::Sink
  void process(controller::ResponseList list) override;
  void fatal(std::string message, bool tell_peers) override {
    stop_engine(std::move(message), tell_peers);
  }
  bool stopped() const override { return stopped_; }
  // EngineKnobs
  void retune(int64_t fusion_threshold, double cycle_time_ms) override;
  void stop(const std::string& reason) override { stop_engine(reason, true); }
  void announce_stalls(std::vector<controller::Stall> stalls) override {
    negotiation_->send_stalls(std::move(stalls));
  }

 private:
  void start_observers(std::vector<std::shared_ptr<CycleObserver>> observers);
  // With loop_mu_ held: makes `timeline` (or none) the one written; returns the one before.
  std::shared_ptr<TimelineObserver> swap_timeline(std::shared_ptr<TimelineObserver> timeline);
  // Background thread.
  void run();
  bool loop_once();  // false once the loop has stopped
  // Without loop_mu_: poll() until something asks for a round or `timeout_ms` passes; what
  // poll() returned (`fds` holds what it reported).
  int sleep_until_woken(std::vector<pollfd>& fds, int timeout_ms);
  // After its poll(): whether the cycle timer alone woke it, for a queue already taken.
  bool woken_for_nothing(const std::vector<pollfd>& fds);
  // loop_mu_ for the background thread: waiting threads that drive the loop let it in.
  std::unique_lock<std::mutex> lock_loop_in_background();
  // Any other thread's try at loop_mu_ (`lock`, deferred): it fails while the background thread
  // waits for the loop (lock_loop_in_background), which so goes first.
  bool try_take_loop(std::unique_lock<std::mutex>& lock);
  // With loop_mu_ held, on either thread: one round of local work (new operations, requests,
  // the coordinator's decisions and their execution), without waiting. `background`: the
  // background thread's round, which leaves a burst of operations that is still being submitted
  // to the thread that will wait for them (SubmissionQueue::take).
  void advance(bool background = false);
  // Whatever peers sent, without waiting. `sockets` false: the mailboxes only (with mailboxes,
  // the sockets carry only doorbells for a sleeper, lists a mailbox had no room for, and a dead
  // peer's hang-up: a driving thread looks at them every 64th round).
  void receive(bool sockets = true);
  std::vector<pollfd> poll_fds() const;
  int poll_timeout_ms(Clock::time_point now) const;
  // A waiting thread leaves drive() (having held the loop or not): the background thread must
  // look again if anything is left for it (its poll() may sleep on a state from before).
  // `untaken` (not `held`): it leaves without its operation done, and without having held the
  // loop to take the queue.
  void leave_loop(bool held, bool untaken = false);
  void fail_loop(const std::exception& e);
  void absorb_queue(bool background);
  // An operation that arrives alone at an idle engine, taken by a thread that waits for it,
  // runs on the direct lane as a synchronous call does (its ranks make it together and wait
  // for it: no negotiation is needed). Whether it ran (and completed); false leaves arrived_
  // to negotiation.
  bool ran_on_lane(bool background);
  // Tells the peers' lanes whether this rank has operations in flight (DirectLane).
  void publish_busy();
  void apply_tuning(int64_t fusion_threshold, double cycle_time_ms);
  // Responses: their names for observers, then their execution in list order.
  void announce(controller::ResponseList& list);
  void execute(const controller::Response& r);
  void execute_control(const controller::Response& r);  // process sets, join, barrier
  void run_allreduce(const controller::Response& r, ProcessSets::Set& set);
  void run_one(const controller::Response& r, ProcessSets::Set& set);  // allgather, broadcast, ...
  int64_t payload_bytes(const controller::Response& r) const;
  void add_process_set(int32_t id, const std::vector<int32_t>& ranks);
  void finish(const std::string& key, const std::string& error = {}, bool precondition = false);
  // Fails the response's tensors; `precondition`: the negotiation refused them on every rank.
  void fail_names(const controller::Response& r, const std::string& error, bool precondition);
  // Names of a response, from the cache when it carries ids only.
  std::vector<std::string> names_of(const controller::Response& r) const;
  // Fails every pending and future operation with `message` and stops the loop.
  void stop_engine(std::string message, bool tell_peers, bool is_error = true);
  std::string root_cause(const std::string& local_error);

  Config config_;  // fusion threshold and cycle time as tuned now
  std::shared_ptr<rendezvous::Store> store_;
  const std::chrono::microseconds busy_poll_;  // KRUG_BUSY_POLL_MICROSECONDS, 0: oversubscribed
  // Waiting threads drive the loop (see drive()): only while every rank of this host has a core,
  // because a driving thread polls for its answer.
  const bool waiters_drive_;
  std::atomic<int> drivers_{0};  // threads in drive(): the background loop does not busy-poll then
  std::atomic<bool> asleep_{false};  // the background thread is in its blocking poll()
  // The background thread waits for loop_mu_: the next driver lets it have the loop first.
  std::atomic<bool> background_waits_{false};
  bool woken_ = false;  // background thread only: its poll() reported something to receive
  Wakeup wakeup_;
  SubmissionQueue queue_;  // shared with user threads

  // The loop's state: only with loop_mu_ held (or in the constructor).
  std::mutex loop_mu_;
  TensorTable table_;
  controller::ResponseCache cache_;
  std::unique_ptr<ControlPlane> control_;
  std::unique_ptr<ProcessSets> sets_;
  Observers observers_;
  std::unique_ptr<Negotiation> negotiation_;
  std::shared_ptr<TimelineObserver> timeline_;  // the timeline written now (rank 0), or null
  std::mutex timeline_mu_;  // start_timeline / stop_timeline, one at a time; before loop_mu_
  Executor executor_;
  bool stopped_ = false;
  std::vector<Table::node_type> arrived_;    // absorb_queue's
  // Until when the thread that runs the loop now waits (drive()); max: no end, or the
  // background thread.
  Clock::time_point drive_deadline_ = Clock::time_point::max();
  std::vector<TableSlot*> allreduce_slots_;  // run_allreduce's
  std::vector<FusedTensor> allreduce_tensors_;
  std::unique_ptr<DirectLane> lane_;  // when synchronous calls may skip negotiation
  std::thread thread_;
};

}  // namespace krug::engine
