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

#include "collectives/gloo/gloo_exchange.h"
#include "collectives/ordered_reduce.h"
#include "rendezvous/gloo_store.h"

namespace krug::collectives {
namespace {

// Point-to-point slots: (base + n) for the n-th message of one direction of one pair. Gloo
// matches a receive by (peer, slot), so the two directions of a pair never collide.
constexpr uint64_t kP2PSlotBase = uint64_t{0x7f} << 56;

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

uint64_t GlooCommunicator::next_slot() { return kCollectiveSlotBase + slot_counter_++; }

void GlooCommunicator::allreduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0 || size_ == 1) return;
  translate_errors("allreduce", rank_, size_, [&] {
    GlooExchange reduce_scatter(*context_, slot_counter_, timeout_);
    GlooExchange allgather(*context_, slot_counter_, timeout_);
    reducer_.allreduce(reduce_scatter, allgather, data, count, dtype, op);
  });
}

void GlooCommunicator::reducescatter(const void* in, void* out, const std::vector<size_t>& counts,
                                     DataType dtype, ReduceOp op) {
  translate_errors("reducescatter", rank_, size_, [&] {
    GlooExchange exchange(*context_, slot_counter_, timeout_);
    reducer_.reduce_scatter(exchange, in, out, counts, dtype, op);
  });
}

void GlooCommunicator::allgatherv(const void* in, void* out,
                                  const std::vector<size_t>& bytes_per_rank) {
  translate_errors("allgather", rank_, size_, [&] {
    GlooExchange exchange(*context_, slot_counter_, timeout_);
    collectives::allgatherv(exchange, in, out, bytes_per_rank);
  });
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
  if (sendrecv_with_self(send_data, send_bytes, send_to, recv_data, recv_bytes, recv_from)) return;
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
    throw Error(
        fmt::format("gloo point-to-point {} failed on rank {} of {} (ranks of this "
                    "process set; timeout {} ms): {}",
                    describe_sendrecv(send_bytes, send_to, recv_bytes, recv_from), rank_, size_,
                    timeout_.count(), e.what()));
  }
}

}  // namespace krug::collectives
