#include "engine/executor.h"

#include <fmt/format.h>

#include "collectives/adasum.h"
#include "collectives/nccl/nccl_plane.h"
#include "common/huge_pages.h"
#include "common/shape.h"
#include "observe/timeline.h"

namespace krug::engine {
namespace {

constexpr std::string_view kAllreducePhase = "ALLREDUCE";

int64_t row_elements(std::span<const int64_t> shape) {
  return shape.empty() ? 1 : shape_elements(shape.subspan(1));
}

// Memory for an output whose shape negotiation just decided.
void* output_memory(TensorArgs& args, OpResult& out, size_t bytes, Memory& memory) {
  if (args.allocate_output) {
    void* p = args.allocate_output(out.shape);
    if (p == nullptr && bytes > 0) throw Error("the output allocator returned no memory");
    memory.fresh_output(p, bytes);
    return p;
  }
  if (args.device >= 0)
    throw Error(fmt::format("{} '{}': a CUDA tensor's result needs an output allocator (the "
                            "frontend seam's Callbacks::allocate) to be placed on the device",
                            controller::op_name(args.request.op), args.request.name));
  resize_on_huge_pages(out.data, bytes);
  return out.data.data();
}

}  // namespace

ReduceOp kernel_op(ReduceOp op) {
  return op == ReduceOp::kAverage ? ReduceOp::kSum : op;
}

double postscale_for(const Reduction& r, size_t set_size) {
  double post = r.postscale;
  if (r.op == ReduceOp::kAverage) post /= static_cast<double>(set_size);
  return post;
}

Executor::Executor(observe::Timeline* timeline, const DeviceOptions& device)
    : timeline_(timeline), device_options_(device) {}
Executor::~Executor() = default;
Executor::Executor(Executor&&) noexcept = default;
Executor& Executor::operator=(Executor&&) noexcept = default;

DevicePlanes& Executor::devices() {
  if (!devices_) devices_ = std::make_unique<DevicePlanes>(device_options_);
  return *devices_;
}

Executor::Target Executor::target(collectives::Communicator& cpu, int device, bool nccl_can) {
  if (device < 0) return Target{&host_, &cpu, &cpu, -1, nullptr};
  return device_target(cpu, device, nccl_can);
}

Executor::Target Executor::device_target(collectives::Communicator& cpu, int device,
                                         bool nccl_can) {
  auto plane = devices().plane(cpu, device, nccl_can);
  return Target{plane.memory, plane.comm, &cpu, plane.device, std::move(plane.current)};
}

void Executor::finish(const Target& t, std::string_view op) {
  if (t.device >= 0) devices().finish(t.device, std::string(op));
}

void Executor::begin(const std::string* name, std::string_view phase) {
  if (timeline_ && name) timeline_->begin(*name, phase, std::chrono::steady_clock::now());
}

void Executor::end(const std::string* name, std::string_view phase) {
  if (timeline_ && name) timeline_->end(*name, phase, std::chrono::steady_clock::now());
}

void Executor::reduce_in_place(const Target& t, const Reduction& r, void* data, size_t total) {
  if (r.op != ReduceOp::kAdasum) return t.comm->allreduce(data, total, r.dtype, kernel_op(r.op));
  auto adasum = [&](void* host) {
    collectives::adasum_allreduce(*t.cpu, host, r.dtype, counts_, r.process_set);
  };
  // Adasum's arithmetic runs on the CPU: device buffers take a round trip through host memory.
  if (t.device >= 0)
    devices().on_host(t.device, data, total * dtype_size(r.dtype), adasum);
  else
    adasum(data);
}

void Executor::allreduce(collectives::Communicator& comm, const Reduction& r,
                         std::span<const FusedTensor> tensors) {
  counts_.clear();
  size_t total = 0;
  int device = -1;  // a joined rank has no tensor of a device allreduce: its planes pick
  for (const auto& t : tensors) {
    counts_.push_back(t.count);
    total += t.count;
    if (!t.args) continue;
    if ((t.args->device >= 0) != r.on_device)
      throw Error(fmt::format("allreduce '{}': a {} tensor in a response for {} tensors",
                              t.args->request.name, t.args->device >= 0 ? "CUDA" : "host",
                              r.on_device ? "CUDA" : "host"));
    if (device >= 0 && t.args->device != device)
      throw Error(fmt::format("allreduce '{}': on CUDA device {}, fused with tensors on device "
                              "{}; keep each rank's tensors on one device",
                              t.args->request.name, t.args->device, device));
    if (r.on_device) device = t.args->device;
  }
  if (!r.on_device && r.op != ReduceOp::kAdasum && comm.has_allreduce_parts())
    return allreduce_in_parts(comm, r, tensors);
  const bool nccl_can = r.op != ReduceOp::kAdasum && collectives::nccl::reduces(r.dtype, r.op);
  // A joined rank has no tensor here (device -1): its planes use the device it used last.
  const Target t = r.on_device ? device_target(comm, device, nccl_can) : target(comm, -1);
  const size_t esize = dtype_size(r.dtype);
  if (tensors.size() == 1 && tensors[0].args) {
    // One tensor: reduce in the caller's output buffer, no fusion copies.
    TensorArgs& a = *tensors[0].args;
    begin(tensors[0].name, kAllreducePhase);
    if (a.output != a.input && total > 0) t.memory->copy(a.output, a.input, total * esize);
    t.memory->scale(r.dtype, a.output, total, r.prescale);
    reduce_in_place(t, r, a.output, total);
    t.memory->scale(r.dtype, a.output, total,
                    postscale_for(r, static_cast<size_t>(comm.size())));
    finish(t, "allreduce");
    end(tensors[0].name, kAllreducePhase);
    return;
  }
  allreduce_fused(t, r, tensors, total);
}

// The data plane reads the inputs and writes the outputs in place: no fusion buffer, and the
// scale factors are applied while each piece is in cache.
void Executor::allreduce_in_parts(collectives::Communicator& comm, const Reduction& r,
                                  std::span<const FusedTensor> tensors) {
  parts_.clear();
  for (const auto& t : tensors) {
    parts_.push_back(t.args ? collectives::FusedPart{t.args->input, t.args->output, t.count}
                            : collectives::FusedPart{nullptr, nullptr, t.count});
    begin(t.name, kAllreducePhase);
  }
  comm.allreduce_parts(parts_, r.dtype, kernel_op(r.op), r.prescale,
                       postscale_for(r, static_cast<size_t>(comm.size())));
  for (const auto& t : tensors) end(t.name, kAllreducePhase);
}

void Executor::allreduce_fused(const Target& target, const Reduction& r,
                               std::span<const FusedTensor> tensors, size_t total) {
  Memory& memory = *target.memory;
  const size_t esize = dtype_size(r.dtype);
  uint8_t* buffer = memory.fusion(total * esize);
  size_t offset = 0;
  for (const auto& t : tensors) {
    const size_t bytes = t.count * esize;
    begin(t.name, "MEMCPY_IN_FUSION_BUFFER");
    if (t.args && bytes > 0)
      memory.copy(buffer + offset, t.args->input, bytes);
    else if (bytes > 0)
      memory.zero(buffer + offset, bytes);  // a joined rank contributes zeros
    end(t.name, "MEMCPY_IN_FUSION_BUFFER");
    begin(t.name, kAllreducePhase);
    offset += bytes;
  }
  memory.scale(r.dtype, buffer, total, r.prescale);
  reduce_in_place(target, r, buffer, total);
  memory.scale(r.dtype, buffer, total,
               postscale_for(r, static_cast<size_t>(target.comm->size())));
  offset = 0;
  for (const auto& t : tensors) {
    const size_t bytes = t.count * esize;
    end(t.name, kAllreducePhase);
    begin(t.name, "MEMCPY_OUT_FUSION_BUFFER");
    if (t.args && bytes > 0) memory.copy(t.args->output, buffer + offset, bytes);
    end(t.name, "MEMCPY_OUT_FUSION_BUFFER");
    offset += bytes;
  }
  finish(target, "allreduce");
}

void Executor::allgather(collectives::Communicator& comm, DataType dtype,
                         std::span<const int64_t> rank_rows, TensorArgs& args, OpResult& out) {
  const Target t = target(comm, args.device);
  const auto& shape = args.request.shape;
  const size_t row_bytes = static_cast<size_t>(row_elements(shape)) * dtype_size(dtype);
  std::vector<size_t> bytes(rank_rows.size());
  int64_t rows = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<size_t>(rank_rows[i]) * row_bytes;
    rows += rank_rows[i];
  }
  out.shape = shape;
  out.shape[0] = rows;
  void* dst = output_memory(args, out, static_cast<size_t>(rows) * row_bytes, *t.memory);
  t.comm->allgatherv(args.input, dst, bytes);
  finish(t, "allgather");
}

void Executor::broadcast(collectives::Communicator& comm, DataType dtype,
                         std::span<const int64_t> shape, int root, TensorArgs& args) {
  const Target t = target(comm, args.device);
  const size_t bytes = static_cast<size_t>(shape_elements(shape)) * dtype_size(dtype);
  if (args.output != args.input && bytes > 0) t.memory->copy(args.output, args.input, bytes);
  t.comm->broadcast(args.output, bytes, root);
  finish(t, "broadcast");
}

void Executor::alltoall(collectives::Communicator& comm, DataType dtype,
                        std::span<const int64_t> rank_rows, TensorArgs& args, OpResult& out) {
  const Target t = target(comm, args.device);
  const auto& shape = args.request.shape;
  const size_t n = static_cast<size_t>(comm.size());
  const size_t me = static_cast<size_t>(comm.rank());
  const size_t row_bytes = static_cast<size_t>(row_elements(shape)) * dtype_size(dtype);
  std::vector<size_t> send(n), recv(n);
  out.received_splits.assign(n, 0);
  int64_t rows = 0;
  for (size_t p = 0; p < n; ++p) {
    send[p] = static_cast<size_t>(rank_rows[me * n + p]) * row_bytes;
    out.received_splits[p] = rank_rows[p * n + me];
    recv[p] = static_cast<size_t>(out.received_splits[p]) * row_bytes;
    rows += out.received_splits[p];
  }
  out.shape = shape;
  out.shape[0] = rows;
  void* dst = output_memory(args, out, static_cast<size_t>(rows) * row_bytes, *t.memory);
  t.comm->alltoallv(args.input, send, dst, recv);
  finish(t, "alltoall");
}

void Executor::reducescatter(collectives::Communicator& comm, const Reduction& r, TensorArgs& args,
                             OpResult& out) {
  const Target t = target(comm, args.device, collectives::nccl::reduces(r.dtype, r.op));
  const auto& shape = args.request.shape;
  const int64_t n = comm.size();
  const int64_t me = comm.rank();
  const int64_t row = row_elements(shape);
  std::vector<size_t> counts(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    counts[i] = static_cast<size_t>((shape[0] / n + (i < shape[0] % n ? 1 : 0)) * row);
  const size_t total = static_cast<size_t>(shape_elements(shape));
  const size_t esize = dtype_size(r.dtype);
  const void* input = args.input;
  if (r.prescale != 1.0 && total > 0) {
    uint8_t* scaled = t.memory->fusion(total * esize);
    t.memory->copy(scaled, input, total * esize);
    t.memory->scale(r.dtype, scaled, total, r.prescale);
    input = scaled;
  }
  const size_t mine = counts[static_cast<size_t>(me)];
  out.shape = shape;
  out.shape[0] =
      row == 0 ? shape[0] / n + (me < shape[0] % n ? 1 : 0) : static_cast<int64_t>(mine) / row;
  void* dst = output_memory(args, out, mine * esize, *t.memory);
  t.comm->reducescatter(input, dst, counts, r.dtype, kernel_op(r.op));
  t.memory->scale(r.dtype, dst, mine, postscale_for(r, static_cast<size_t>(n)));
  finish(t, "reducescatter");
}

}  // namespace krug::engine
