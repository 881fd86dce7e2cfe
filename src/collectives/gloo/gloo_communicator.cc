#include "collectives/gloo/gloo_communicator.h"

#include <fmt/format.h>
#include <gloo/allgatherv.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "reduce/reduce.h"
#include "rendezvous/gloo_store.h"

namespace krug::collectives {
namespace {

// Gloo builds its own slots as (prefix << 56 | tag); krug's live above every Gloo prefix.
constexpr uint64_t kSlotBase = uint64_t{0x7e} << 56;
// Point-to-point slots: (base + n) for the n-th message of one direction of one pair. Gloo
// matches a receive by (peer, slot), so the two directions of a pair never collide.
constexpr uint64_t kP2PSlotBase = uint64_t{0x7f} << 56;
// Bytes per peer per pipeline step of the reduce-scatter: bounds scratch memory at
// 2 * size * kSegmentBytes while keeping per-step latency small against transfer time.
constexpr size_t kSegmentBytes = size_t{1} << 20;

template <typename F>
void translate_errors(const char* what, int rank, int size, F&& f) {
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(fmt::format("gloo {} failed on rank {} of {}: {}", what, rank, size, e.what()));
  }
}

std::vector<size_t> prefix_offsets(const std::vector<size_t>& sizes) {
  std::vector<size_t> offsets(sizes.size() + 1, 0);
  std::partial_sum(sizes.begin(), sizes.end(), offsets.begin() + 1);
  return offsets;
}

}  // namespace

std::shared_ptr<gloo::transport::Device> make_gloo_device(const std::string& hostname,
                                                          const std::string& iface) {
  gloo::transport::tcp::attr attr;
  if (!iface.empty())
    attr.iface = iface;
  else
    attr.hostname = hostname;
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw Error(fmt::format("cannot create the Gloo TCP device on {}: {} (set KRUG_GLOO_IFACE "
                            "to the network interface to use)",
                            iface.empty() ? "host " + hostname : "interface " + iface, e.what()));
  }
}

GlooCommunicator::GlooCommunicator(int rank, int size, std::shared_ptr<rendezvous::Store> store,
                                   std::shared_ptr<gloo::transport::Device> device,
                                   std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), timeout_(timeout), sent_to_(size, 0), received_from_(size, 0) {
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(timeout);
  rendezvous::GlooStore gloo_store(std::move(store), timeout);
  translate_errors("connect", rank, size,
                   [&] { context->connectFullMesh(gloo_store, device); });
  context_ = std::move(context);
}

GlooCommunicator::~GlooCommunicator() = default;

uint64_t GlooCommunicator::next_slot() { return kSlotBase + slot_counter_++; }

uint8_t* GlooCommunicator::scratch_for(size_t bytes) {
  // Reused across calls and never zero-filled: every byte read was received first.
  if (scratch_size_ < bytes) {
    scratch_ = std::make_unique_for_overwrite<uint8_t[]>(bytes);
    scratch_size_ = bytes;
  }
  return scratch_.get();
}

void GlooCommunicator::allreduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0 || size_ == 1) return;
  std::vector<size_t> counts(size_);
  for (int r = 0; r < size_; ++r) counts[r] = count / size_ + (static_cast<size_t>(r) < count % size_ ? 1 : 0);
  const auto offsets = prefix_offsets(counts);
  const size_t esize = dtype_size(dtype);
  auto* bytes = static_cast<uint8_t*>(data);
  translate_errors("allreduce", rank_, size_, [&] {
    reduce_scatter_ordered(data, bytes + offsets[rank_] * esize, counts, dtype, op);
    std::vector<size_t> chunk_bytes(size_);
    for (int r = 0; r < size_; ++r) chunk_bytes[r] = counts[r] * esize;
    allgather_in_place(data, chunk_bytes);
  });
}

void GlooCommunicator::reducescatter(const void* in, void* out, const std::vector<size_t>& counts,
                                     DataType dtype, ReduceOp op) {
  translate_errors("reducescatter", rank_, size_,
                   [&] { reduce_scatter_ordered(in, out, counts, dtype, op); });
}

void GlooCommunicator::reduce_scatter_ordered(const void* in, void* out,
                                              const std::vector<size_t>& counts, DataType dtype,
                                              ReduceOp op) {
  const size_t esize = dtype_size(dtype);
  const auto offsets = prefix_offsets(counts);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  if (size_ == 1) {
    if (dst != src && counts[0] > 0) std::memmove(dst, src, counts[0] * esize);
    return;
  }
  const size_t max_count = *std::max_element(counts.begin(), counts.end());
  // Small buffers get small segments: scratch is sized by what actually moves.
  const size_t seg_elems = std::max<size_t>(1, std::min(kSegmentBytes / esize, max_count));
  const size_t steps = (max_count + seg_elems - 1) / seg_elems;
  if (steps == 0) return;

  // Gloo registers buffers by pointer; it never writes through a send-only buffer.
  auto send_buf = context_->createUnboundBuffer(const_cast<uint8_t*>(src), offsets[size_] * esize);
  // Two scratch halves so step s+1's receives are in flight while step s is reduced.
  const size_t half_bytes = static_cast<size_t>(size_) * seg_elems * esize;
  uint8_t* scratch = scratch_for(2 * half_bytes);
  std::unique_ptr<gloo::transport::UnboundBuffer> recv_buf[2] = {
      context_->createUnboundBuffer(scratch, half_bytes),
      context_->createUnboundBuffer(scratch + half_bytes, half_bytes)};
  const uint64_t base_slot = next_slot();
  slot_counter_ += steps;  // one slot per step keeps steps from matching each other's messages

  auto seg_len = [&](int r, size_t step) -> size_t {
    size_t begin = step * seg_elems;
    return begin >= counts[r] ? 0 : std::min(seg_elems, counts[r] - begin);
  };
  auto post_recvs = [&](size_t step) -> int {
    int posted = 0;
    const size_t n = seg_len(rank_, step);
    if (n == 0) return 0;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      recv_buf[step % 2]->recv(p, base_slot + step, p * seg_elems * esize, n * esize);
      ++posted;
    }
    return posted;
  };

  // Receives first: a send whose receive is already posted goes straight onto the wire from
  // this thread instead of waiting for a "ready to receive" round trip through Gloo's loop.
  // Every send is then posted up front, so the wire never waits for a reduction.
  int recvs_pending = post_recvs(0);
  int sends_posted = 0;
  for (size_t step = 0; step < steps; ++step) {
    for (int p = 0; p < size_; ++p) {
      const size_t n = seg_len(p, step);
      if (p == rank_ || n == 0) continue;
      send_buf->send(p, base_slot + step, (offsets[p] + step * seg_elems) * esize, n * esize);
      ++sends_posted;
    }
  }
  for (size_t step = 0; step < steps; ++step) {
    const int next_pending = step + 1 < steps ? post_recvs(step + 1) : 0;
    for (int i = 0; i < recvs_pending; ++i) recv_buf[step % 2]->waitRecv(timeout_);
    recvs_pending = next_pending;

    const size_t n = seg_len(rank_, step);
    if (n == 0) continue;
    uint8_t* half = scratch + (step % 2) * half_bytes;
    const uint8_t* mine = src + (offsets[rank_] + step * seg_elems) * esize;
    auto contribution = [&](int r) { return r == rank_ ? mine : half + r * seg_elems * esize; };
    // Reduce in rank order into a scratch slot first: `out` may alias this rank's input.
    uint8_t* acc = half + rank_ * seg_elems * esize;
    if (rank_ != 0) std::memcpy(acc, contribution(0), n * esize);
    else if (acc != mine) std::memcpy(acc, mine, n * esize);
    for (int r = 1; r < size_; ++r) reduce::reduce_into(dtype, op, acc, contribution(r), n);
    std::memcpy(dst + step * seg_elems * esize, acc, n * esize);
  }
  for (int i = 0; i < sends_posted; ++i) send_buf->waitSend(timeout_);
}

void GlooCommunicator::allgather_in_place(void* data, const std::vector<size_t>& bytes_per_rank) {
  const auto offsets = prefix_offsets(bytes_per_rank);
  if (offsets[size_] == 0) return;
  auto buf = context_->createUnboundBuffer(data, offsets[size_]);
  const uint64_t slot = next_slot();
  int sends = 0, recvs = 0;
  // All receives before any send (see reduce_scatter_ordered).
  for (int p = 0; p < size_; ++p) {
    if (p != rank_ && bytes_per_rank[p] > 0) {
      buf->recv(p, slot, offsets[p], bytes_per_rank[p]);
      ++recvs;
    }
  }
  for (int p = 0; p < size_; ++p) {
    if (p != rank_ && bytes_per_rank[rank_] > 0) {
      buf->send(p, slot, offsets[rank_], bytes_per_rank[rank_]);
      ++sends;
    }
  }
  for (int i = 0; i < recvs; ++i) buf->waitRecv(timeout_);
  for (int i = 0; i < sends; ++i) buf->waitSend(timeout_);
}

void GlooCommunicator::allgatherv(const void* in, void* out,
                                  const std::vector<size_t>& bytes_per_rank) {
  const auto offsets = prefix_offsets(bytes_per_rank);
  auto* dst = static_cast<uint8_t*>(out);
  if (bytes_per_rank[rank_] > 0 && dst + offsets[rank_] != in)
    std::memmove(dst + offsets[rank_], in, bytes_per_rank[rank_]);
  if (size_ == 1) return;
  translate_errors("allgather", rank_, size_, [&] { allgather_in_place(out, bytes_per_rank); });
}

void GlooCommunicator::broadcast(void* data, size_t bytes, int root) {
  if (bytes == 0 || size_ == 1) return;
  translate_errors("broadcast", rank_, size_, [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    opts.setRoot(root);
    opts.setTimeout(timeout_);
    gloo::broadcast(opts);
  });
}

void GlooCommunicator::alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                                 const std::vector<size_t>& recv_bytes) {
  const auto send_off = prefix_offsets(send_bytes);
  const auto recv_off = prefix_offsets(recv_bytes);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  if (send_bytes[rank_] > 0) std::memmove(dst + recv_off[rank_], src + send_off[rank_], send_bytes[rank_]);
  if (size_ == 1) return;
  translate_errors("alltoall", rank_, size_, [&] {
    // Direct pairwise exchange: Gloo's alltoallv rejects empty buffers, which uneven splits need.
    std::unique_ptr<gloo::transport::UnboundBuffer> sbuf, rbuf;
    if (send_off[size_] > 0)
      sbuf = context_->createUnboundBuffer(const_cast<uint8_t*>(src), send_off[size_]);
    if (recv_off[size_] > 0) rbuf = context_->createUnboundBuffer(dst, recv_off[size_]);
    const uint64_t slot = next_slot();
    int sends = 0, recvs = 0;
    for (int p = 0; p < size_; ++p) {
      if (p != rank_ && recv_bytes[p] > 0) {
        rbuf->recv(p, slot, recv_off[p], recv_bytes[p]);
        ++recvs;
      }
    }
    for (int p = 0; p < size_; ++p) {
      if (p != rank_ && send_bytes[p] > 0) {
        sbuf->send(p, slot, send_off[p], send_bytes[p]);
        ++sends;
      }
    }
    for (int i = 0; i < recvs; ++i) rbuf->waitRecv(timeout_);
    for (int i = 0; i < sends; ++i) sbuf->waitSend(timeout_);
  });
}

void GlooCommunicator::barrier() {
  if (size_ == 1) return;
  translate_errors("barrier", rank_, size_, [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  });
}

}  // namespace krug::collectives

namespace krug::collectives {

void GlooCommunicator::sendrecv(const void* send_data, size_t send_bytes, int send_to,
                                void* recv_data, size_t recv_bytes, int recv_from) {
  auto describe = [&] {
    std::string what;
    if (send_to >= 0) what = fmt::format("send of {} bytes to rank {}", send_bytes, send_to);
    if (recv_from >= 0)
      what += fmt::format("{}receive of {} bytes from rank {}", what.empty() ? "" : " and ",
                          recv_bytes, recv_from);
    return what;
  };
  if (send_to < -1 || send_to >= size_ || recv_from < -1 || recv_from >= size_)
    throw Error(fmt::format("gloo point-to-point {} on rank {} of {}: peer out of range",
                            describe(), rank_, size_));
  if ((send_to == rank_) != (recv_from == rank_))
    throw Error(fmt::format("gloo point-to-point {} on rank {} of {}: a rank can exchange with "
                            "itself only in both directions",
                            describe(), rank_, size_));
  if (send_to == rank_) {
    if (send_bytes != recv_bytes)
      throw Error(fmt::format("gloo point-to-point on rank {}: sends {} bytes to itself but "
                              "expects {}",
                              rank_, send_bytes, recv_bytes));
    if (send_bytes > 0 && send_data != recv_data) std::memmove(recv_data, send_data, send_bytes);
    return;
  }
  // Slots advance even for empty messages: both sides of a pair agree on every byte count, so
  // they skip the same messages and stay in step.
  const uint64_t send_slot = send_to >= 0 ? kP2PSlotBase + sent_to_[send_to]++ : 0;
  const uint64_t recv_slot = recv_from >= 0 ? kP2PSlotBase + received_from_[recv_from]++ : 0;
  try {
    std::unique_ptr<gloo::transport::UnboundBuffer> rbuf, sbuf;
    if (recv_from >= 0 && recv_bytes > 0) {
      rbuf = context_->createUnboundBuffer(recv_data, recv_bytes);
      rbuf->recv(recv_from, recv_slot);
    }
    if (send_to >= 0 && send_bytes > 0) {
      // Gloo registers buffers by pointer; it never writes through a send-only buffer.
      sbuf = context_->createUnboundBuffer(const_cast<void*>(send_data), send_bytes);
      sbuf->send(send_to, send_slot);
    }
    if (rbuf) rbuf->waitRecv(timeout_);
    if (sbuf) sbuf->waitSend(timeout_);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(fmt::format("gloo point-to-point {} failed on rank {} of {} (ranks of this "
                            "process set; timeout {} ms): {}",
                            describe(), rank_, size_, timeout_.count(), e.what()));
  }
}

}  // namespace krug::collectives
