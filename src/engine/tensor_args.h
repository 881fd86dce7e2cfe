// One tensor of an operation as the user handed it to the engine: what the submission queue
// holds, the executor moves, and the engine's enqueue takes. Its own header so that those parts
// need not see the Engine class.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "controller/message.h"

namespace krug::engine {

// One tensor of an operation as the user handed it in.
struct TensorArgs {
  controller::Request request;  // name, op, dtype, shape, ... (group fields set by enqueue)
  const void* input = nullptr;
  void* output = nullptr;  // allreduce/broadcast: may equal input; unused for sized-later ops
  // Ops whose output size is known only after negotiation (allgather, alltoall, reducescatter)
  // call this with the output shape to get memory for it (a framework tensor, say). Without it
  // the output lives in the handle's OpResult::data.
  std::function<void*(const std::vector<int64_t>& shape)> allocate_output;
  // Blocks until the input is written (a device binding's ready event); called once, before
  // the engine reads the input. Empty: ready at enqueue.
  std::function<void()> ready;
  // The CUDA device input and output are on, or -1: host memory.
  int32_t device = -1;
};

// Runs and clears `args.ready`, if any.
inline void wait_ready(TensorArgs& args) {
  if (!args.ready) return;
  auto ready = std::move(args.ready);
  args.ready = nullptr;
  ready();
}

inline TensorArgs tensor_args(controller::Request request, const void* input, void* output) {
  TensorArgs args;
  args.request = std::move(request);
  args.input = input;
  args.output = output;
  return args;
}

}  // namespace krug::engine
