#include "collectives/gloo/gloo_communicator.h"

#include <fmt/format.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <memory>

#include "collectives/gloo/gloo_exchange.h"
#include "rendezvous/gloo_store.h"

namespace krug::collectives {
namespace {

// Point-to-point slots: (base + n) for the n-th message of one direction of one pair. Gloo
// matches a receive by (peer, slot), so the two directions of a pair never collide.
constexpr uint64_t kP2PSlotBase = uint64_t{0x7f} << 56;

// Bytes per peer per pipeline step of the reduce-scatter: bounds scratch memory at
// 2 * size * 1 MiB while keeping per-step latency small against transfer time.
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
    : ExchangeCommunicator(kSegmentBytes),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      sent_to_(size, 0),
      received_from_(size, 0) {
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(timeout);
  rendezvous::GlooStore gloo_store(std::move(store), timeout);
  translate_errors("connect", rank, size,
                   [&] { context->connectFullMesh(gloo_store, device); });
  context_ = std::move(context);
}

GlooCommunicator::~GlooCommunicator() = default;

std::unique_ptr<Exchange> GlooCommunicator::exchange(Phase) {
  // Slots keep the phases of a call apart; tags are not needed.
  return std::make_unique<GlooExchange>(*context_, slot_counter_, timeout_);
}

void GlooCommunicator::guarded(const char* what, const std::function<void()>& call) {
  translate_errors(what, rank_, size_, call);
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
