#include "engine/executor.h"

#include <cstring>

#include "collectives/adasum.h"
#include "common/huge_pages.h"
#include "observe/timeline.h"
#include "reduce/copy.h"
#include "reduce/reduce.h"

namespace krug::engine {
namespace {

constexpr std::string_view kAllreducePhase = "ALLREDUCE";

int64_t elements(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t row_elements(std::span<const int64_t> shape) {
  return shape.empty() ? 1 : elements(shape.subspan(1));
}

// Memory for an output whose shape negotiation just decided.
void* output_memory(TensorArgs& args, OpResult& out, size_t bytes) {
  if (args.allocate_output) {
    void* p = args.allocate_output(out.shape);
    if (p == nullptr && bytes > 0) throw Error("the output allocator returned no memory");
    advise_huge_pages(p, bytes);  // a framework's fresh tensor: not touched yet
    return p;
  }
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

void Executor::begin(const std::string* name, std::string_view phase) {
  if (timeline_ && name) timeline_->begin(*name, phase, std::chrono::steady_clock::now());
}

void Executor::end(const std::string* name, std::string_view phase) {
  if (timeline_ && name) timeline_->end(*name, phase, std::chrono::steady_clock::now());
}

uint8_t* Executor::fusion(size_t bytes) {
  if (fusion_.size() < bytes) fusion_.resize(bytes);
  return fusion_.data();
}

void Executor::reduce_in_place(collectives::Communicator& comm, const Reduction& r, void* data,
                               size_t total) {
  if (r.op == ReduceOp::kAdasum)
    collectives::adasum_allreduce(comm, data, r.dtype, counts_, r.process_set);
  else
    comm.allreduce(data, total, r.dtype, kernel_op(r.op));
}

void Executor::allreduce(collectives::Communicator& comm, const Reduction& r,
                         std::span<const FusedTensor> tensors) {
  counts_.clear();
  size_t total = 0;
  for (const auto& t : tensors) {
    counts_.push_back(t.count);
    total += t.count;
  }
  if (r.op != ReduceOp::kAdasum && comm.has_allreduce_parts())
    return allreduce_in_parts(comm, r, tensors);
  const size_t esize = dtype_size(r.dtype);
  if (tensors.size() == 1 && tensors[0].args) {
    // One tensor: reduce in the caller's output buffer, no fusion copies.
    TensorArgs& a = *tensors[0].args;
    begin(tensors[0].name, kAllreducePhase);
    if (a.output != a.input && total > 0) reduce::copy(a.output, a.input, total * esize);
    reduce::scale(r.dtype, a.output, total, r.prescale);
    reduce_in_place(comm, r, a.output, total);
    reduce::scale(r.dtype, a.output, total, postscale_for(r, static_cast<size_t>(comm.size())));
    end(tensors[0].name, kAllreducePhase);
    return;
  }
  allreduce_fused(comm, r, tensors, total);
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

void Executor::allreduce_fused(collectives::Communicator& comm, const Reduction& r,
                               std::span<const FusedTensor> tensors, size_t total) {
  const size_t esize = dtype_size(r.dtype);
  uint8_t* buffer = fusion(total * esize);
  size_t offset = 0;
  for (const auto& t : tensors) {
    const size_t bytes = t.count * esize;
    begin(t.name, "MEMCPY_IN_FUSION_BUFFER");
    if (t.args && bytes > 0)
      reduce::copy(buffer + offset, t.args->input, bytes);
    else if (bytes > 0)
      std::memset(buffer + offset, 0, bytes);  // a joined rank contributes zeros
    end(t.name, "MEMCPY_IN_FUSION_BUFFER");
    begin(t.name, kAllreducePhase);
    offset += bytes;
  }
  reduce::scale(r.dtype, buffer, total, r.prescale);
  reduce_in_place(comm, r, buffer, total);
  reduce::scale(r.dtype, buffer, total, postscale_for(r, static_cast<size_t>(comm.size())));
  offset = 0;
  for (const auto& t : tensors) {
    const size_t bytes = t.count * esize;
    end(t.name, kAllreducePhase);
    begin(t.name, "MEMCPY_OUT_FUSION_BUFFER");
    if (t.args && bytes > 0) reduce::copy(t.args->output, buffer + offset, bytes);
    end(t.name, "MEMCPY_OUT_FUSION_BUFFER");
    offset += bytes;
  }
}

void Executor::allgather(collectives::Communicator& comm, DataType dtype,
                         std::span<const int64_t> rank_rows, TensorArgs& args, OpResult& out) {
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
  void* dst = output_memory(args, out, static_cast<size_t>(rows) * row_bytes);
  comm.allgatherv(args.input, dst, bytes);
}

void Executor::broadcast(collectives::Communicator& comm, DataType dtype,
                         std::span<const int64_t> shape, int root, TensorArgs& args) {
  const size_t bytes = static_cast<size_t>(elements(shape)) * dtype_size(dtype);
  if (args.output != args.input && bytes > 0) reduce::copy(args.output, args.input, bytes);
  comm.broadcast(args.output, bytes, root);
}

void Executor::alltoall(collectives::Communicator& comm, DataType dtype,
                        std::span<const int64_t> rank_rows, TensorArgs& args, OpResult& out) {
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
  void* dst = output_memory(args, out, static_cast<size_t>(rows) * row_bytes);
  comm.alltoallv(args.input, send, dst, recv);
}

void Executor::reducescatter(collectives::Communicator& comm, const Reduction& r, TensorArgs& args,
                             OpResult& out) {
  const auto& shape = args.request.shape;
  const int64_t n = comm.size();
  const int64_t me = comm.rank();
  const int64_t row = row_elements(shape);
  std::vector<size_t> counts(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    counts[i] = static_cast<size_t>((shape[0] / n + (i < shape[0] % n ? 1 : 0)) * row);
  const size_t total = static_cast<size_t>(elements(shape));
  const size_t esize = dtype_size(r.dtype);
  const void* input = args.input;
  if (r.prescale != 1.0 && total > 0) {
    uint8_t* scaled = fusion(total * esize);
    reduce::copy(scaled, input, total * esize);
    reduce::scale(r.dtype, scaled, total, r.prescale);
    input = scaled;
  }
  const size_t mine = counts[static_cast<size_t>(me)];
  out.shape = shape;
  out.shape[0] =
      row == 0 ? shape[0] / n + (me < shape[0] % n ? 1 : 0) : static_cast<int64_t>(mine) / row;
  void* dst = output_memory(args, out, mine * esize);
  comm.reducescatter(input, dst, counts, r.dtype, kernel_op(r.op));
  reduce::scale(r.dtype, dst, mine, postscale_for(r, static_cast<size_t>(n)));
}

}  // namespace krug::engine
