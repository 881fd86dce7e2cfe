// The ordered collectives' point-to-point messages (collectives/ordered_reduce.h) over Gloo's
// unbound buffers: one buffer per region, one slot per step.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "collectives/ordered_reduce.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace krug::collectives {

// Slots of krug's collectives: kCollectiveSlotBase + the communicator's slot counter. Gloo
// builds its own slots as (prefix << 56 | tag); krug's live above every Gloo prefix.
inline constexpr uint64_t kCollectiveSlotBase = uint64_t{0x7e} << 56;

class GlooExchange : public Exchange {
 public:
  // `slot_counter`: the communicator's collective slot counter, which every rank advances
  // together; begin() takes one slot per step from it.
  GlooExchange(gloo::Context& context, uint64_t& slot_counter, std::chrono::milliseconds timeout);
  ~GlooExchange() override;

  int rank() const override;
  int size() const override;
  void begin(std::span<const Region> regions, size_t steps) override;
  void recv(void* data, size_t bytes, int peer, size_t step) override;
  void send(const void* data, size_t bytes, int peer, size_t step) override;
  void wait_recvs(size_t step) override;
  void wait_sends() override;

 private:
  struct Registered {
    const uint8_t* data;
    size_t bytes;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  };
  // The buffer that holds [data, data + bytes), and data's offset in it.
  std::pair<gloo::transport::UnboundBuffer*, size_t> locate(const void* data, size_t bytes);

  gloo::Context& context_;
  uint64_t& slot_counter_;
  std::chrono::milliseconds timeout_;
  uint64_t base_slot_ = 0;
  std::vector<Registered> buffers_;
  // One entry per posted receive (its step and buffer) and per posted send: Gloo waits on a
  // buffer for "one more" of its messages, so waits are counted per buffer.
  std::vector<std::pair<size_t, gloo::transport::UnboundBuffer*>> recvs_;
  std::vector<gloo::transport::UnboundBuffer*> sends_;
};

}  // namespace krug::collectives
