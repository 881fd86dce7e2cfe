// The engine's side of the direct lane (collectives/shm/shm_lane.h): which synchronous calls may
// take it, the signature the ranks compare, and pausing it for a rank whose calls keep finding
// no partner there (its peers run theirs through the engine, say, or one rank has joined).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "collectives/shm/shm_lane.h"
#include "common/config.h"
#include "engine/engine.h"
#include "rendezvous/store.h"
#include "transport/shm_segment.h"

namespace krug::engine {

class DirectLane {
 public:
  // Collective over every rank of the job, all on this host: maps the lane's memory through
  // `store`. `window`: how long a call waits for the other ranks.
  DirectLane(const Config& config, std::shared_ptr<rendezvous::Store> store,
             std::chrono::nanoseconds window);

  // The largest input of one rank on the lane: KRUG_DIRECT_LANE_BYTES counts every rank's
  // input together, since each rank reads all of them (down to a cache line; 0: no lane).
  static size_t bytes_per_rank(int64_t lane_bytes, int size);

  // Whether a call may take the lane: an allreduce (not Adasum), broadcast or allgather of host
  // memory on the global process set, of 1 to bytes_per_rank() bytes on this rank (a broadcast:
  // to size x bytes_per_rank(), since only its root posts data). An
  // allgather's output holds size x its input: the lane runs it only where every rank's shape
  // is the same.
  bool suits(const TensorView& t) const;
  // How a call waits for its partners on the lane. A synchronous call's thread has nothing
  // else to do: after its window it sleeps for a late partner. An asynchronous operation run
  // by the engine's loop (the thread waiting for it) spins its window only, and not while a
  // peer's engine is busy: that peer sends it for negotiation, which this rank's loop must then
  // take part in. Its misses never pause the lane: waiting for a late partner there costs no
  // more than waiting for it through negotiation.
  enum class Wait : uint8_t { kWindowThenSleep, kWindowOnly };
  // Runs a call that suits() on the lane; false: nothing ran (the caller enqueues it). Any
  // thread; one at a time (another thread's call meanwhile gets false).
  bool run(const TensorView& t, Wait wait = Wait::kWindowThenSleep);
  // This rank makes a call that suits() through the engine (it has another operation in
  // flight, say): the peers waiting on the lane with it leave at once, not after a window.
  void decline(const TensorView& t);
  // This rank's engine has operations in flight (or none now): the peers' operations that
  // the engine runs on the lane (Wait::kWindowOnly) leave it at once meanwhile, since this rank
  // makes its calls through negotiation. Any thread; cheap when unchanged.
  void set_engine_busy(bool busy) { lane_->set_busy(busy); }
  // How long a call waits for its partners before it gives up (Wait::kWindowOnly).
  std::chrono::nanoseconds window() const { return window_; }
  // How many calls ran on the lane.
  uint64_t runs() const { return runs_.load(std::memory_order_relaxed); }
  // The most bytes of one rank's input a call of `op` takes on the lane.
  size_t max_bytes(controller::OpType op) const;

 private:
  bool run_alone(const TensorView& t, Wait wait);  // with busy_ set
  // Makes call_ and signature_ t's, unless they are already: a program repeats its calls (a
  // step's), and making them again cost a small call a tenth of its instructions.
  void prepare(const TensorView& t);
  bool prepared_for(const TensorView& t) const;
  // The lane's call for `t` (an average is the sum, divided as the engine divides it: in the
  // postscale).
  collectives::shm::Lane::Call lane_call(const TensorView& t) const;
  // t's signature, into signature_.
  void encode_signature(const TensorView& t);
  std::span<const uint8_t> signature() const {
    return {reinterpret_cast<const uint8_t*>(signature_.data()), signature_.size()};
  }

  int size_;
  std::chrono::nanoseconds window_;
  std::unique_ptr<transport::Segment> segment_;
  std::unique_ptr<collectives::shm::Lane> lane_;
  std::atomic_flag busy_;  // a thread is in run()
  std::atomic<uint64_t> runs_{0};
  // busy_: the call prepared last, its signature (reused), and the arguments of the call that
  // the signature does not hold.
  collectives::shm::Lane::Call call_{};
  std::string signature_;
  struct {
    controller::OpType op{};
    DataType dtype{};
    double prescale = 0;
    double postscale = 0;
    int32_t root = 0;
  } prepared_;
  // busy_: calls in a row that found no partner (those whose partners took the engine or came
  // late do not count: the ranks do make their calls together).
  int misses_ = 0;
  std::chrono::steady_clock::time_point paused_until_{};  // busy_
};

}  // namespace krug::engine
