// The engine: one per initialized process (several in one process for tests). It owns the
// background thread, the control plane, the data-plane communicators of every process set, the
// response cache and the timeline.
//
// User threads enqueue named operations; the background thread sleeps in poll() until work
// arrives or a peer speaks, negotiates (the coordinator decides), and executes the decided
// responses in order on the data plane.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <stop_token>
#include <string>
#include <vector>

#include "common/config.h"
#include "controller/message.h"
#include "engine/handle_state.h"
#include "engine/observer.h"
#include "engine/tensor_args.h"
#include "rendezvous/store.h"

namespace krug::engine {

// One allreduce or broadcast tensor, described by reference: the engine copies it into storage
// it reuses from finished operations, so submitting a step's gradients allocates nothing for
// them in the steady state (no name, shape or argument list of the caller's).
struct TensorView {
  const std::string& name;
  controller::OpType op = controller::OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  std::span<const int64_t> shape;
  int32_t process_set = 0;
  ReduceOp reduce_op = ReduceOp::kSum;  // allreduce
  double prescale = 1.0;                // allreduce
  double postscale = 1.0;               // allreduce
  int32_t root = 0;                     // broadcast
  const void* input = nullptr;
  void* output = nullptr;
};

class Engine {
 public:
  // Connects to every rank of config.size through `store` (already namespaced for this
  // initialization) and starts the background thread. Throws krug::Error on failure.
  // `observers` are told of every negotiation round on the coordinator (observer.h).
  // Requesting `stop` ends the control plane's wait for the other ranks early; the store's own
  // waits end with it when the store was made with the same token (init()).
  Engine(const Config& config, std::shared_ptr<rendezvous::Store> store,
         std::vector<std::shared_ptr<CycleObserver>> observers = {}, std::stop_token stop = {});
  ~Engine();  // shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Drains this rank's pending operations (bounded by the timeout), tells every rank, joins the
  // thread. Idempotent.
  void shutdown();

  // Stops this rank's engine at once and tells every rank `reason` (its user gave up waiting:
  // Ctrl-C in Python): pending and later operations fail with it here and on the other ranks,
  // as after a failure. shutdown() may follow; it then has nothing to drain. Idempotent.
  void abort(const std::string& reason);

  // Starts the timeline (a Chrome trace of every tensor's phases, docs/timeline.md) to `path`,
  // with a CYCLE_START marker per negotiation round when `mark_cycles`. Only rank 0 writes a
  // timeline (it sees when every rank was ready); elsewhere this does nothing. A timeline
  // already running (KRUG_TIMELINE's or an earlier call's) is closed first as a complete file,
  // unless it writes `path`: that one goes on with this `mark_cycles`. Thread-safe; it takes
  // effect between two rounds of the loop. Throws InvalidArgument naming the path when it is
  // empty or cannot be created.
  void start_timeline(const std::string& path, bool mark_cycles);
  // Closes the running timeline, if any, as a complete JSON array. Thread-safe.
  void stop_timeline();

  // Several tensors => one grouped request: executed together once all are ready everywhere.
  // Never throws for operation errors: they complete the returned handle with a message.
  std::shared_ptr<HandleState> enqueue(std::vector<TensorArgs> tensors);
  std::shared_ptr<HandleState> enqueue(TensorArgs tensor);  // one tensor, without a list
  std::shared_ptr<HandleState> enqueue(const TensorView& tensor);
  // Runs a synchronous host allreduce to completion on the caller's thread when the direct lane
  // can take it (engine/direct_lane.h: every rank on this host, nothing else of this rank's in
  // flight, the same call on every rank within the busy-poll window); false: nothing ran, and
  // the caller enqueues it. Never throws for operation errors.
  bool run_direct(const TensorView& tensor);
  // The most bytes of input run_direct() takes for `op`; 0 where this engine has no direct
  // lane.
  size_t direct_lane_bytes(controller::OpType op = controller::OpType::kAllreduce) const;
  // How many operations ran on the direct lane on this rank: synchronous calls (run_direct) and
  // operations that arrived alone at an idle engine, taken by a thread that waits for them.
  uint64_t direct_runs() const;
  // What was just enqueued completes through a callback, with no thread waiting to drive the
  // loop for it (TensorFlow's async kernels): the background thread takes it at once instead of
  // after the batching window that waiting threads use. Const: callers hold a const engine.
  void expedite() const;

  const Config& config() const;
  int rank() const;
  int size() const;
  // Global ranks of a live process set (throws krug::Error for unknown ids).
  std::vector<int32_t> process_set_ranks(int32_t id) const;
  // How this rank allreduces on process set `id`: "flat", "hierarchical [0 1] [2 3]" (the set's
  // members grouped by host), or "" when it is not a member. Throws for unknown ids.
  std::string allreduce_algorithm(int32_t id) const;
  // The fusion threshold (bytes) and cycle time (ms) this rank applies now: the configured ones,
  // or the autotuner's latest choice (KRUG_AUTOTUNE), the same on every rank.
  std::pair<int64_t, double> tuned_parameters() const;

 private:
  class Impl;
  std::shared_ptr<Impl> impl_;  // shared with handles whose waiters drive the loop
};

}  // namespace krug::engine
