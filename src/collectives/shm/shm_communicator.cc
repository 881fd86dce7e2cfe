#include "collectives/shm/shm_communicator.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "collectives/ordered_reduce.h"
#include "collectives/shm/rank_order.h"
#include "reduce/copy.h"
#include "reduce/reduce.h"

namespace krug::collectives::shm {
namespace {

constexpr uint32_t kMagic = 0x6b727567;  // "krug"
constexpr size_t kPage = 4096;
constexpr size_t kMessageBytes = 512;
constexpr size_t kControlsOffset = kPage;  // the header has the first page to itself

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

struct ShmCommunicator::Header {
  std::atomic<uint32_t> magic;
  std::atomic<uint32_t> abort_claimed;
  std::atomic<uint32_t> aborted_by;  // 0, or the failing member + 1 once `message` is written
  char message[kMessageBytes];
};

struct ShmCommunicator::Control {
  Counter filled;
  Counter reduced;
  Counter done;
  alignas(64) std::atomic<int32_t> pid;
};

size_t ShmCommunicator::segment_bytes(int size, const Options& options) {
  // Checked here, before the segment is created: nothing in /dev/shm for a bad option.
  if (options.slot_bytes < 4096 || options.slot_bytes % 64 != 0)
    throw Error(fmt::format("shared-memory data plane: slot size {} must be a multiple of 64 "
                            "and at least 4096",
                            options.slot_bytes));
  const size_t controls = round_up(sizeof(Control) * static_cast<size_t>(size), kPage);
  return kControlsOffset + controls + 2 * static_cast<size_t>(size) * options.slot_bytes;
}

ShmCommunicator::ShmCommunicator(int rank, int size, rendezvous::Store& store,
                                 const Options& options)
    : rank_(rank),
      size_(size),
      options_(options),
      // Spinning pays only while every member has a core to itself; otherwise a spinning
      // member takes the core from the peer it waits for.
      spin_(static_cast<unsigned>(size) <= std::max(1u, std::thread::hardware_concurrency())
                ? std::chrono::microseconds(20)
                : std::chrono::nanoseconds(0)),
      segment_(rank, size, segment_bytes(size, options), options.job_id, store, options.timeout) {
  static_assert(sizeof(Header) <= 4096);
  // The pages came zero-filled from ftruncate/fallocate: every counter starts at 0.
  control(rank_).pid.store(static_cast<int32_t>(::getpid()), std::memory_order_release);
  if (rank_ == 0) header().magic.store(kMagic, std::memory_order_release);
  // Every member must see every pid before relying on it for liveness checks.
  barrier();
  if (header().magic.load(std::memory_order_acquire) != kMagic)
    throw Error("shared-memory data plane: segment header is not initialised");
}

ShmCommunicator::~ShmCommunicator() = default;

ShmCommunicator::Header& ShmCommunicator::header() const {
  return *reinterpret_cast<Header*>(segment_.data());
}

ShmCommunicator::Control& ShmCommunicator::control(int member) const {
  return reinterpret_cast<Control*>(segment_.data() + kControlsOffset)[member];
}

uint8_t* ShmCommunicator::slot(uint32_t step, int member) const {
  const size_t controls = round_up(sizeof(Control) * static_cast<size_t>(size_), kPage);
  const size_t index = (step % 2) * static_cast<size_t>(size_) + static_cast<size_t>(member);
  return segment_.data() + kControlsOffset + controls + index * options_.slot_bytes;
}

std::string ShmCommunicator::check_peer(int member) const {
  if (const uint32_t by = header().aborted_by.load(std::memory_order_acquire); by != 0)
    return fmt::format("stopped because rank {} of the process set failed: {}", by - 1,
                       std::string(header().message, strnlen(header().message, kMessageBytes)));
  const pid_t pid = control(member).pid.load(std::memory_order_acquire);
  if (!process_alive(pid))
    return fmt::format("rank {} of the process set (pid {} on this host) has exited", member, pid);
  return {};
}

void ShmCommunicator::abort_all(const std::string& message) {
  uint32_t expected = 0;
  if (header().abort_claimed.compare_exchange_strong(expected, 1)) {
    const size_t n = std::min(message.size(), kMessageBytes - 1);
    std::memcpy(header().message, message.data(), n);
    header().message[n] = '\0';
    header().aborted_by.store(static_cast<uint32_t>(rank_) + 1, std::memory_order_release);
  }
  for (int m = 0; m < size_; ++m) {
    wake_all(control(m).filled);
    wake_all(control(m).reduced);
    wake_all(control(m).done);
  }
}

void ShmCommunicator::fail(const char* op, int member, const std::string& why) {
  std::string message;
  if (why == "timeout")
    message = fmt::format("shared-memory {}: rank {} of the process set did not arrive within {} "
                          "s (stuck, or in another collective); raise KRUG_TIMEOUT_SECONDS if "
                          "it is only slow",
                          op, member, options_.timeout.count() / 1000.0);
  else
    message = fmt::format("shared-memory {}: {}", op, why);
  throw Error(message);
}

template <typename Body>
void ShmCommunicator::guarded(const char* op, Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    abort_all(e.what());
    throw;
  } catch (const std::exception& e) {
    const std::string message = fmt::format("shared-memory {}: {}", op, e.what());
    abort_all(message);
    throw Error(message);
  }
}

namespace {

WaitContext context_for(std::chrono::milliseconds timeout, std::chrono::nanoseconds spin,
                        std::function<std::string()> check) {
  return WaitContext{std::chrono::steady_clock::now() + timeout, spin, std::move(check)};
}

}  // namespace

void ShmCommunicator::wait_member(Counter Control::*counter, uint32_t target, int member,
                                  const char* op) {
  if (member == rank_) return;
  auto why = wait_for(control(member).*counter, target,
                      context_for(options_.timeout, spin_,
                                  [this, member] { return check_peer(member); }));
  if (!why.empty()) fail(op, member, why);
}

void ShmCommunicator::begin_step(const char* op) {
  if (step_ < 2) return;
  for (int m = 0; m < size_; ++m) wait_member(&Control::done, step_ - 1, m, op);
}

void ShmCommunicator::publish_filled() { publish(control(rank_).filled, step_ + 1); }
void ShmCommunicator::publish_reduced() { publish(control(rank_).reduced, step_ + 1); }
void ShmCommunicator::publish_done() {
  publish(control(rank_).done, step_ + 1);
  ++step_;
}

void ShmCommunicator::wait_filled(int member, const char* op) {
  wait_member(&Control::filled, step_ + 1, member, op);
}

void ShmCommunicator::wait_filled_all(const char* op) {
  for (int m = 0; m < size_; ++m) wait_filled(m, op);
}

void ShmCommunicator::wait_reduced_all(const char* op) {
  for (int m = 0; m < size_; ++m) wait_member(&Control::reduced, step_ + 1, m, op);
}

void ShmCommunicator::allreduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  allreduce_parts({FusedPart{data, data, count}}, dtype, op, 1.0, 1.0);
}

// The parts of a fused allreduce seen as one buffer of elements: a step gathers its piece of
// the inputs and scatters its piece of the result without a fusion buffer in between.
class ShmCommunicator::Parts {
 public:
  Parts(const std::vector<FusedPart>& parts, DataType dtype, double prescale, double postscale)
      : parts_(parts), dtype_(dtype), element_(dtype_size(dtype)), pre_(prescale),
        post_(postscale) {
    starts_.reserve(parts.size() + 1);
    size_t at = 0;
    for (const auto& p : parts) {
      starts_.push_back(at);
      at += p.count;
      inputs_as_they_are_ = inputs_as_they_are_ && (p.in || p.count == 0);
    }
    starts_.push_back(at);
    inputs_as_they_are_ = inputs_as_they_are_ && prescale == 1.0;
  }
  size_t total() const { return starts_.back(); }
  size_t element() const { return element_; }
  // Whether every input can be reduced where it lies: each part has one, and no prescale
  // changes it on the way into a slot.
  bool inputs_as_they_are() const { return inputs_as_they_are_; }
  // fn(input, count, offset in the range) for the pieces of inputs [first, first + n).
  template <typename Fn>
  void each_input(size_t first, size_t n, Fn&& fn) const {
    walk(first, n, [&](const FusedPart& p, size_t offset, size_t count, size_t at) {
      fn(static_cast<const uint8_t*>(p.in) + offset * element_, count, at);
    });
  }

  // Elements [first, first + n) of the inputs into `dst`, scaled by the prescale.
  void gather(size_t first, size_t n, uint8_t* dst) const {
    walk(first, n, [&](const FusedPart& p, size_t offset, size_t count, size_t at) {
      uint8_t* to = dst + at * element_;
      if (p.in)
        reduce::copy(to, static_cast<const uint8_t*>(p.in) + offset * element_, count * element_);
      else
        std::memset(to, 0, count * element_);
    });
    reduce::scale(dtype_, dst, n, pre_);
  }
  // The postscale, applied to `n` reduced elements before they are scattered: once per
  // element by the member that reduced it, not by every member on its copy.
  void finish(uint8_t* reduced, size_t n) const { reduce::scale(dtype_, reduced, n, post_); }
  // Result elements [first, first + n), held in `src` (finished), into the outputs.
  void scatter(size_t first, size_t n, const uint8_t* src) const {
    walk(first, n, [&](const FusedPart& p, size_t offset, size_t count, size_t at) {
      if (p.out)
        reduce::copy(static_cast<uint8_t*>(p.out) + offset * element_, src + at * element_,
                     count * element_);
    });
  }

 private:
  // fn(part, offset in the part, count, offset in the range) for each part under the range.
  template <typename Fn>
  void walk(size_t first, size_t n, Fn&& fn) const {
    if (n == 0) return;
    // The part holding `first`: the last one starting at or before it (never an empty one).
    size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end() - 1, first) -
                                   starts_.begin()) - 1;
    for (size_t at = 0; at < n; ++i) {
      const size_t offset = first + at - starts_[i];
      const size_t count = std::min(parts_[i].count - offset, n - at);
      if (count > 0) fn(parts_[i], offset, count, at);
      at += count;
    }
  }

  const std::vector<FusedPart>& parts_;
  DataType dtype_;
  size_t element_;
  double pre_, post_;
  std::vector<size_t> starts_;  // element offset of each part, then the total
  bool inputs_as_they_are_ = true;
};

void ShmCommunicator::allreduce_parts(const std::vector<FusedPart>& parts, DataType dtype,
                                      ReduceOp op, double prescale, double postscale) {
  const Parts view(parts, dtype, prescale, postscale);
  if (view.total() == 0) return;
  if (size_ == 1) {
    for (const auto& p : parts) {
      if (!p.out || p.count == 0) continue;
      if (!p.in)
        std::memset(p.out, 0, p.count * view.element());
      else if (p.in != p.out)
        reduce::copy(p.out, p.in, p.count * view.element());
      reduce::scale(dtype, p.out, p.count, prescale);
      reduce::scale(dtype, p.out, p.count, postscale);
    }
    return;
  }
  guarded("allreduce", [&] {
    if (view.total() * view.element() <= options_.small_allreduce_bytes)
      allreduce_parts_small(view, dtype, op);
    else
      allreduce_parts_large(view, dtype, op);
  });
}

void ShmCommunicator::allreduce_parts_small(const Parts& parts, DataType dtype, ReduceOp op) {
  const size_t element = parts.element();
  const size_t per_step = options_.slot_bytes / element;
  scratch_.resize(std::min(per_step, parts.total()) * element);
  for (size_t first = 0; first < parts.total(); first += per_step) {
    const size_t n = std::min(per_step, parts.total() - first);
    begin_step("allreduce");
    parts.gather(first, n, slot(step_, rank_));
    publish_filled();
    wait_filled_all("allreduce");
    reduce_in_rank_order(dtype, op, scratch_.data(), size_, n, [&](int m) { return slot(step_, m); });
    parts.finish(scratch_.data(), n);
    publish_reduced();
    publish_done();
    parts.scatter(first, n, scratch_.data());
  }
}

void ShmCommunicator::allreduce_parts_large(const Parts& parts, DataType dtype, ReduceOp op) {
  const size_t element = parts.element();
  const size_t per_step = options_.slot_bytes / element;
  for (size_t first = 0; first < parts.total(); first += per_step) {
    const size_t n = std::min(per_step, parts.total() - first);
    const auto slices = split_counts(n, size_);
    const auto offsets = prefix_offsets(slices);
    const size_t at = offsets[rank_], len = slices[rank_];
    // Peers read only their own slices of this member's slot. Its own slice, where the inputs
    // allow, is reduced from them as they lie rather than copied in first: a copy fewer.
    const bool own_as_it_is = parts.inputs_as_they_are() && len > 0;
    begin_step("allreduce");
    uint8_t* mine = slot(step_, rank_);
    if (own_as_it_is) {
      parts.gather(first, at, mine);
      parts.gather(first + at + len, n - at - len, mine + (at + len) * element);
    } else {
      parts.gather(first, n, mine);
    }
    publish_filled();
    wait_filled_all("allreduce");
    if (own_as_it_is)
      reduce_own_from_inputs(parts, first, at, len, dtype, op);
    else if (len > 0)
      reduce_own_from_slot(at * element, len, dtype, op);
    if (len > 0) parts.finish(mine + at * element, len);
    publish_reduced();
    wait_reduced_all("allreduce");
    for (int m = 0; m < size_; ++m)
      parts.scatter(first + offsets[m], slices[m], slot(step_, m) + offsets[m] * element);
    publish_done();
  }
}

void ShmCommunicator::reduce_own_from_inputs(const Parts& parts, size_t first, size_t at,
                                             size_t len, DataType dtype, ReduceOp op) {
  uint8_t* mine = slot(step_, rank_);
  const size_t element = parts.element();
  parts.each_input(first + at, len, [&](const uint8_t* in, size_t count, size_t from) {
    const size_t skip = (at + from) * element;
    reduce_in_rank_order(dtype, op, mine + skip, size_, count,
                         [&](int m) { return m == rank_ ? in : slot(step_, m) + skip; });
  });
}

void ShmCommunicator::reduce_own_from_slot(size_t skip, size_t len, DataType dtype, ReduceOp op) {
  // This member's slice of the result overwrites its own input in its slot. The chain
  // s0 op s1 op ... reads s0 and s1 before its first write, so members 0 and 1 reduce in
  // place; a later member first keeps a copy of its input slice.
  uint8_t* mine = slot(step_, rank_);
  const uint8_t* own = mine + skip;
  if (rank_ >= 2) {
    scratch_.resize(len * dtype_size(dtype));
    reduce::copy(scratch_.data(), own, scratch_.size());
    own = scratch_.data();
  }
  reduce_in_rank_order(dtype, op, mine + skip, size_, len,
                       [&](int m) { return m == rank_ ? own : slot(step_, m) + skip; });
}

void ShmCommunicator::reducescatter(const void* in, void* out, const std::vector<size_t>& counts,
                                    DataType dtype, ReduceOp op) {
  const size_t element = dtype_size(dtype);
  const auto offsets = prefix_offsets(counts);
  const size_t total = offsets.back();
  const auto* input = static_cast<const uint8_t*>(in);
  auto* output = static_cast<uint8_t*>(out);
  if (size_ == 1) {
    if (output != input && total > 0) reduce::move(output, input, total * element);
    return;
  }
  const size_t mine_first = offsets[rank_], mine_end = offsets[rank_ + 1];
  const size_t per_step = options_.slot_bytes / element;
  guarded("reducescatter", [&] {
    for (size_t first = 0; first < total; first += per_step) {
      const size_t n = std::min(per_step, total - first);
      begin_step("reducescatter");
      reduce::copy(slot(step_, rank_), input + first * element, n * element);
      publish_filled();
      wait_filled_all("reducescatter");
      // The part of this member's chunk inside the piece, from every slot (its own included:
      // `out` may alias `in`).
      const size_t a = std::max(first, mine_first), b = std::min(first + n, mine_end);
      if (a < b) {
        const size_t at = (a - first) * element;
        reduce_in_rank_order(dtype, op, output + (a - mine_first) * element, size_, b - a,
                             [&](int m) { return slot(step_, m) + at; });
      }
      publish_reduced();
      publish_done();
    }
  });
}

void ShmCommunicator::allgatherv(const void* in, void* out,
                                 const std::vector<size_t>& bytes_per_rank) {
  const auto offsets = prefix_offsets(bytes_per_rank);
  const auto* input = static_cast<const uint8_t*>(in);
  auto* output = static_cast<uint8_t*>(out);
  const size_t mine = bytes_per_rank[rank_];
  uint8_t* own = output + offsets[rank_];
  // This rank's own rows go piece by piece beside its slot copy (the input is read once), unless
  // they overlap the input: then first, as a memmove.
  const bool own_by_piece = size_ > 1 && !reduce::overlaps(own, input, mine);
  if (mine > 0 && own != input && !own_by_piece) reduce::move(own, input, mine);
  if (size_ == 1) return;
  const size_t largest = *std::max_element(bytes_per_rank.begin(), bytes_per_rank.end());
  const size_t piece = options_.slot_bytes;
  // A gathered tensor beyond the caches is written past them: nothing reads it before the
  // collective ends, and each line would otherwise be read from memory first.
  const auto write_out = reduce::copy_for_output(offsets.back());
  guarded("allgather", [&] {
    for (size_t first = 0; first < largest; first += piece) {
      begin_step("allgather");
      if (first < mine) {
        const size_t n = std::min(piece, mine - first);
        reduce::copy(slot(step_, rank_), input + first, n);
        if (own_by_piece) write_out(own + first, input + first, n);
      }
      publish_filled();
      for (int m = 0; m < size_; ++m) {
        if (m == rank_ || first >= bytes_per_rank[m]) continue;
        wait_filled(m, "allgather");
        write_out(output + offsets[m] + first, slot(step_, m),
                  std::min(piece, bytes_per_rank[m] - first));
      }
      publish_reduced();
      publish_done();
    }
  });
}

void ShmCommunicator::broadcast(void* data, size_t bytes, int root) {
  if (size_ == 1 || bytes == 0) return;
  auto* buffer = static_cast<uint8_t*>(data);
  const size_t piece = options_.slot_bytes;
  // As allgather's: a tensor beyond the caches is written past them.
  const auto write_out = reduce::copy_for_output(bytes);
  guarded("broadcast", [&] {
    for (size_t first = 0; first < bytes; first += piece) {
      const size_t n = std::min(piece, bytes - first);
      begin_step("broadcast");
      if (rank_ == root) reduce::copy(slot(step_, root), buffer + first, n);
      publish_filled();
      if (rank_ != root) {
        wait_filled(root, "broadcast");
        write_out(buffer + first, slot(step_, root), n);
      }
      publish_reduced();
      publish_done();
    }
  });
}

void ShmCommunicator::alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                                const std::vector<size_t>& recv_bytes) {
  const auto offsets = copy_own_part(rank_, in, send_bytes, out, recv_bytes);
  const std::vector<size_t>& send_offsets = offsets.first;
  const std::vector<size_t>& recv_offsets = offsets.second;
  const auto* input = static_cast<const uint8_t*>(in);
  auto* output = static_cast<uint8_t*>(out);
  if (size_ == 1) return;
  // Each slot is cut into one box per destination. Members know only their own sizes, so the
  // number of rounds is agreed first: the largest any member needs.
  const size_t box = options_.slot_bytes / static_cast<size_t>(size_) / 64 * 64;
  guarded("alltoall", [&] {
    size_t largest = 0;
    for (int m = 0; m < size_; ++m)
      if (m != rank_) largest = std::max({largest, send_bytes[m], recv_bytes[m]});
    begin_step("alltoall");
    // In the slot, not the control block: the slot is not reused before every member is done.
    const uint64_t needed = (largest + box - 1) / box;
    std::memcpy(slot(step_, rank_), &needed, sizeof needed);
    publish_filled();
    wait_filled_all("alltoall");
    uint64_t rounds = 0;
    for (int m = 0; m < size_; ++m) {
      uint64_t theirs = 0;
      std::memcpy(&theirs, slot(step_, m), sizeof theirs);
      rounds = std::max(rounds, theirs);
    }
    publish_reduced();
    publish_done();
    for (uint64_t round = 0; round < rounds; ++round) {
      const size_t first = round * box;
      begin_step("alltoall");
      for (int m = 0; m < size_; ++m)
        if (m != rank_ && first < send_bytes[m])
          reduce::copy(slot(step_, rank_) + m * box, input + send_offsets[m] + first,
                       std::min(box, send_bytes[m] - first));
      publish_filled();
      for (int m = 0; m < size_; ++m) {
        if (m == rank_ || first >= recv_bytes[m]) continue;
        wait_filled(m, "alltoall");
        reduce::copy(output + recv_offsets[m] + first, slot(step_, m) + rank_ * box,
                     std::min(box, recv_bytes[m] - first));
      }
      publish_reduced();
      publish_done();
    }
  });
}

void ShmCommunicator::barrier() {
  if (size_ == 1) return;
  guarded("barrier", [&] {
    begin_step("barrier");
    publish_filled();
    wait_filled_all("barrier");
    publish_reduced();
    publish_done();
  });
}

void ShmCommunicator::sendrecv(const void* send_data, size_t send_bytes, int send_to,
                               void* recv_data, size_t recv_bytes, int recv_from) {
  if (!point_to_point_ && make_point_to_point_) point_to_point_ = make_point_to_point_();
  if (!point_to_point_)
    throw Error("shared-memory communicator: point-to-point messages need a TCP communicator, "
                "and none was attached");
  point_to_point_->sendrecv(send_data, send_bytes, send_to, recv_data, recv_bytes, recv_from);
}

}  // namespace krug::collectives::shm
