#include "engine/direct_lane.h"

#include <cstring>

#include "collectives/shm/cross_memory.h"
#include "common/shape.h"

namespace krug::engine {
namespace {

// After this many calls in a row found no partner, the lane rests for kPause: a program whose
// ranks do not make their calls together (one runs them asynchronously) pays a window per call
// only this often.
constexpr int kMissesBeforePause = 16;
constexpr auto kPause = std::chrono::seconds(1);
// After a call that found no partner, the next one waits this many windows. That call went
// through the engine, which may leave one rank asleep in its wait: on a VM it can take longer
// than a window to wake, and its partner, giving up, would send both through the engine again.
constexpr int kWindowsAfterAMiss = 10;
// After its window, a call whose rank met its partners at the last call sleeps this long for
// them. Such a partner is on its way; what keeps it is most often its core, taken for a few
// milliseconds (by a VM's host, another process): sleeping frees this rank's core meanwhile,
// and the partner wakes it on arrival. Sent through the engine instead, both ranks would
// sleep there and need more wake-ups than this one, each as long on a VM, and the next calls
// would miss each other while they catch up. Not after a miss: a partner that does not come
// (it runs its calls asynchronously, say) costs a sleep once, not every call.
constexpr auto kSleepInStep = std::chrono::milliseconds(20);

// Writes `value`'s bytes at `at`; returns the end.
template <typename T>
char* put(char* at, const T& value) {
  std::memcpy(at, &value, sizeof(value));
  return at + sizeof(value);
}

}  // namespace

DirectLane::DirectLane(const Config& config, std::shared_ptr<rendezvous::Store> store,
                       std::chrono::nanoseconds window)
    : size_(config.size), window_(window) {
  const size_t max_bytes = bytes_per_rank(config.direct_lane_bytes, config.size);
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(config.timeout);
  rendezvous::PrefixStore prefixed("lane/", std::move(store));
  segment_ = std::make_unique<transport::Segment>(
      config.rank, config.size, collectives::shm::Lane::memory_bytes(config.size, max_bytes),
      config.job_id, prefixed, timeout);
  collectives::shm::Lane::Options options;
  options.max_bytes = max_bytes;
  options.window = window;
  options.pids = collectives::shm::probe_cross_memory(config.rank, config.size, prefixed, timeout);
  options.stall = timeout;
  lane_ =
      std::make_unique<collectives::shm::Lane>(config.rank, config.size, segment_->data(), options);
  signature_.reserve(collectives::shm::Lane::kMaxSignature);
}

size_t DirectLane::bytes_per_rank(int64_t lane_bytes, int size) {
  constexpr size_t kLine = 64;
  if (lane_bytes <= 0 || size <= 0) return 0;
  return static_cast<size_t>(lane_bytes) / static_cast<size_t>(size) / kLine * kLine;
}

bool DirectLane::suits(const TensorView& t) const {
  using controller::OpType;
  const bool collective = t.op == OpType::kBroadcast || t.op == OpType::kAllgather ||
                          (t.op == OpType::kAllreduce && t.reduce_op != ReduceOp::kAdasum);
  // A scalar has no rows to gather: the engine says what it makes of one.
  const bool gathers_rows = t.op != OpType::kAllgather || !t.shape.empty();
  if (!collective || !gathers_rows || t.process_set != 0 || t.output == nullptr) return false;
  const int64_t elements = shape_elements(t.shape);
  const auto bytes = static_cast<size_t>(elements) * dtype_size(t.dtype);
  return elements > 0 && bytes <= max_bytes(t.op);
}

size_t DirectLane::max_bytes(controller::OpType op) const {
  switch (op) {
    case controller::OpType::kBroadcast:
      return lane_->max_broadcast_bytes();
    case controller::OpType::kAllgather:
      return lane_->max_allgather_bytes();
    default:
      return lane_->max_bytes();
  }
}

// A signature: the reduce op, the number of dimensions, the dimensions, the name.
constexpr size_t kSignatureHeader = sizeof(uint8_t) + sizeof(uint32_t);

void DirectLane::encode_signature(const TensorView& t) {
  // The lane compares the collective, count, dtype, scale factors and root itself; an average
  // and a sum differ here. Written in place: appending piece by piece cost a 4-byte call a
  // sixth of its instructions.
  const auto dims = static_cast<uint32_t>(t.shape.size());
  const size_t dims_bytes = dims * sizeof(int64_t);
  signature_.resize(kSignatureHeader + dims_bytes + t.name.size());
  char* at = put(signature_.data(), static_cast<uint8_t>(t.reduce_op));
  at = put(at, dims);
  if (dims_bytes > 0) std::memcpy(at, t.shape.data(), dims_bytes);
  if (!t.name.empty()) std::memcpy(at + dims_bytes, t.name.data(), t.name.size());
}

bool DirectLane::prepared_for(const TensorView& t) const {
  const auto& p = prepared_;
  const size_t dims_bytes = t.shape.size() * sizeof(int64_t);
  // An empty signature_ (nothing prepared yet) fails the size test: a signature has a header.
  if (t.op != p.op || t.dtype != p.dtype || t.root != p.root || t.prescale != p.prescale ||
      t.postscale != p.postscale ||
      signature_.size() != kSignatureHeader + dims_bytes + t.name.size())
    return false;
  const char* at = signature_.data();
  uint32_t dims = 0;
  std::memcpy(&dims, at + sizeof(uint8_t), sizeof(dims));
  at += kSignatureHeader;
  return signature_[0] == static_cast<char>(t.reduce_op) && dims == t.shape.size() &&
         (dims_bytes == 0 || std::memcmp(at, t.shape.data(), dims_bytes) == 0) &&
         (t.name.empty() || std::memcmp(at + dims_bytes, t.name.data(), t.name.size()) == 0);
}

void DirectLane::prepare(const TensorView& t) {
  if (prepared_for(t)) return;
  call_ = lane_call(t);
  encode_signature(t);
  prepared_ = {.op = t.op,
               .dtype = t.dtype,
               .prescale = t.prescale,
               .postscale = t.postscale,
               .root = t.root};
}

collectives::shm::Lane::Call DirectLane::lane_call(const TensorView& t) const {
  using collectives::shm::Lane;
  const auto count = static_cast<size_t>(shape_elements(t.shape));
  switch (t.op) {
    case controller::OpType::kBroadcast:
      return Lane::broadcast_call(count, t.dtype, t.root);
    case controller::OpType::kAllgather:
      return Lane::allgather_call(count, t.dtype);
    default: {
      const bool average = t.reduce_op == ReduceOp::kAverage;
      const double postscale = average ? t.postscale / static_cast<double>(size_) : t.postscale;
      return Lane::allreduce_call(count, t.dtype, average ? ReduceOp::kSum : t.reduce_op,
                                  t.prescale, postscale);
    }
  }
}

bool DirectLane::run(const TensorView& t, Wait wait) {
  if (busy_.test_and_set(std::memory_order_acquire)) return false;
  const bool ran = run_alone(t, wait);
  // Only the holder of busy_ writes the count: no locked add on every call.
  if (ran) runs_.store(runs_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  busy_.clear(std::memory_order_release);
  return ran;
}

void DirectLane::decline(const TensorView& t) {
  if (busy_.test_and_set(std::memory_order_acquire)) return;  // another thread is on the lane
  prepare(t);
  lane_->decline(call_, signature());
  busy_.clear(std::memory_order_release);
}

bool DirectLane::run_alone(const TensorView& t, Wait wait) {
  prepare(t);
  if (wait == Wait::kWindowOnly) {
    lane_->set_wait(window_, {}, /*leave_for_busy=*/true);
    const bool ran = lane_->run(call_, signature(), t.input, t.output);
    if (ran) misses_ = 0;
    return ran;
  }
  if (misses_ >= kMissesBeforePause) {
    if (std::chrono::steady_clock::now() < paused_until_) {
      lane_->decline(call_, signature());
      return false;
    }
    misses_ = 0;
  }
  if (misses_ > 0)
    lane_->set_wait(kWindowsAfterAMiss * window_, {});
  else
    lane_->set_wait(window_, kSleepInStep);
  const bool ran = lane_->run(call_, signature(), t.input, t.output);
  if (ran) {
    misses_ = 0;
  } else if (!lane_->partner_left() && ++misses_ == kMissesBeforePause) {
    paused_until_ = std::chrono::steady_clock::now() + kPause;
  }
  return ran;
}

}  // namespace krug::engine
