#include "collectives/gloo/gloo_exchange.h"

#include <fmt/format.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>

#include "krug/types.h"

namespace krug::collectives {
GlooExchange::GlooExchange(gloo::Context& context, uint64_t& slot_counter,
                           std::chrono::milliseconds timeout)
    : context_(context), slot_counter_(slot_counter), timeout_(timeout) {}

GlooExchange::~GlooExchange() = default;

int GlooExchange::rank() const { return context_.rank; }
int GlooExchange::size() const { return context_.size; }

void GlooExchange::begin(std::span<const Region> regions, size_t steps) {
  for (const Region& region : regions) {
    const auto* data = static_cast<const uint8_t*>(region.data);
    const bool known = std::any_of(buffers_.begin(), buffers_.end(), [&](const Registered& r) {
      return r.data == data && r.bytes == region.bytes;
    });
    // Gloo registers buffers by pointer; it never writes through a send-only buffer.
    if (!known)
      buffers_.push_back({data, region.bytes,
                          context_.createUnboundBuffer(const_cast<uint8_t*>(data), region.bytes)});
  }
  // One slot per step keeps steps from matching each other's messages.
  base_slot_ = kCollectiveSlotBase + slot_counter_;
  slot_counter_ += steps;
}

std::pair<gloo::transport::UnboundBuffer*, size_t> GlooExchange::locate(const void* data,
                                                                        size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (const Registered& r : buffers_)
    if (p >= r.data && p + bytes <= r.data + r.bytes)
      return {r.buffer.get(), static_cast<size_t>(p - r.data)};
  // A bug in the caller, not a runtime condition: every message lies in a region from begin().
  throw Error(fmt::format("gloo exchange on rank {}: a message of {} bytes lies outside every "
                          "registered buffer",
                          context_.rank, bytes));
}

void GlooExchange::recv(void* data, size_t bytes, int peer, size_t step) {
  auto [buffer, offset] = locate(data, bytes);
  buffer->recv(peer, base_slot_ + step, offset, bytes);
  recvs_.emplace_back(step, buffer);
}

void GlooExchange::send(const void* data, size_t bytes, int peer, size_t step) {
  auto [buffer, offset] = locate(data, bytes);
  buffer->send(peer, base_slot_ + step, offset, bytes);
  sends_.push_back(buffer);
}

void GlooExchange::wait_recvs(size_t step) {
  for (const auto& [s, buffer] : recvs_)
    if (s == step) buffer->waitRecv(timeout_);
  std::erase_if(recvs_, [&](const auto& r) { return r.first == step; });
}

void GlooExchange::wait_sends() {
  for (auto* buffer : sends_) buffer->waitSend(timeout_);
  sends_.clear();
}

}  // namespace krug::collectives
