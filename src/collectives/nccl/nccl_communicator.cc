// The NCCL plane (nccl_plane.h). Communicators are non-blocking (ncclConfig_t::blocking = 0) so
// that creation and every collective can be polled against a deadline and aborted: a blocking
// NCCL call whose peer has died never returns.
//
// Unlike the CPU planes, NCCL does not promise to reduce each element in rank order: results
// are reproducible for a fixed rank count and topology, but may differ in the last bits from
// the CPU planes' and from a different fusion of the same tensors.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "collectives/nccl/nccl_plane.h"

namespace krug::collectives::nccl {
namespace {

using Clock = std::chrono::steady_clock;

std::optional<ncclDataType_t> nccl_dtype(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
      return ncclUint8;
    case DataType::kInt8:
      return ncclInt8;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kUInt32:
      return ncclUint32;
    case DataType::kUInt64:
      return ncclUint64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kInt16:
    case DataType::kUInt16:
    case DataType::kBool:
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<ncclRedOp_t> nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kProduct:
      return ncclProd;
    case ReduceOp::kAverage:  // the engine sums and scales (integers round as on the CPU)
    case ReduceOp::kAdasum:
      return std::nullopt;
  }
  return std::nullopt;
}

std::string result_text(ncclResult_t r) {
  return fmt::format("{} ({})", ncclGetErrorString(r), static_cast<int>(r));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, std::shared_ptr<const device::Stream> stream,
                   const Options& options)
      : rank_(bootstrap.rank()),
        size_(bootstrap.size()),
        stream_(std::move(stream)),
        timeout_(std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(options.timeout_seconds))),
        scratch_(stream_->device()) {
    if (!options.host_id.empty()) ::setenv("NCCL_HOSTID", options.host_id.c_str(), 1);
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    static_assert(sizeof id == kUniqueIdBytes);
    if (rank_ == 0) {
      ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess)
        throw Error(fmt::format("ncclGetUniqueId failed on rank 0: {}", result_text(r)));
    }
    bootstrap.broadcast(&id, sizeof id, 0);
    device::DeviceGuard guard(stream_->device());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const auto deadline = Clock::now() + timeout_;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    settle(r, "ncclCommInitRankConfig", deadline);
  }

  ~NcclCommunicator() override { abort(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend_name() const override { return "nccl"; }

  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op) override {
    const auto deadline = start("allreduce");
    settle(ncclAllReduce(data, data, count, dtype_of(dtype), op_of(op), comm_, cuda_stream()),
           "ncclAllReduce", deadline);
    finish("ncclAllReduce", deadline);
  }

  void reducescatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override {
    const auto deadline = start("reducescatter");
    const ncclDataType_t dt = dtype_of(dtype);
    const ncclRedOp_t rop = op_of(op);
    const bool even =
        std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts.front(); });
    if (even) {
      settle(ncclReduceScatter(in, out, counts.front(), dt, rop, comm_, cuda_stream()),
             "ncclReduceScatter", deadline);
    } else {
      // Uneven shares: one reduce per rank, rooted at the rank that keeps that share.
      const size_t esize = dtype_size(dtype);
      group_start();
      size_t offset = 0;
      for (int r = 0; r < size_; ++r) {
        const auto* src = static_cast<const uint8_t*>(in) + offset * esize;
        check_queued(ncclReduce(src, out, counts[r], dt, rop, r, comm_, cuda_stream()),
                     "ncclReduce");
        offset += counts[r];
      }
      group_end(deadline);
    }
    finish("ncclReduceScatter", deadline);
  }

  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes_per_rank) override {
    const auto deadline = start("allgather");
    const bool even = std::all_of(bytes_per_rank.begin(), bytes_per_rank.end(),
                                  [&](size_t b) { return b == bytes_per_rank.front(); });
    if (even) {
      settle(ncclAllGather(in, out, bytes_per_rank.front(), ncclUint8, comm_, cuda_stream()),
             "ncclAllGather", deadline);
    } else {
      // Uneven first dimensions: every rank broadcasts its rows into its place of the output.
      group_start();
      size_t offset = 0;
      for (int r = 0; r < size_; ++r) {
        auto* dst = static_cast<uint8_t*>(out) + offset;
        check_queued(ncclBroadcast(in, dst, bytes_per_rank[r], ncclUint8, r, comm_, cuda_stream()),
                     "ncclBroadcast");
        offset += bytes_per_rank[r];
      }
      group_end(deadline);
    }
    finish("ncclAllGather", deadline);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    const auto deadline = start("broadcast");
    settle(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, cuda_stream()), "ncclBroadcast",
           deadline);
    finish("ncclBroadcast", deadline);
  }

  void alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes) override {
    const auto deadline = start("alltoall");
    const auto* src = static_cast<const uint8_t*>(in);
    auto* dst = static_cast<uint8_t*>(out);
    size_t send_off = 0, recv_off = 0;
    std::vector<size_t> send_at(size_), recv_at(size_);
    for (int p = 0; p < size_; ++p) {
      send_at[p] = send_off;
      recv_at[p] = recv_off;
      send_off += send_bytes[p];
      recv_off += recv_bytes[p];
    }
    // What stays on this rank is a device copy; the rest grouped sends and receives.
    device::copy_async(dst + recv_at[rank_], src + send_at[rank_], send_bytes[rank_], *stream_);
    group_start();
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      if (send_bytes[p] > 0)
        check_queued(ncclSend(src + send_at[p], send_bytes[p], ncclUint8, p, comm_, cuda_stream()),
                     "ncclSend");
      if (recv_bytes[p] > 0)
        check_queued(ncclRecv(dst + recv_at[p], recv_bytes[p], ncclUint8, p, comm_, cuda_stream()),
                     "ncclRecv");
    }
    group_end(deadline);
    finish("alltoall (ncclSend/ncclRecv)", deadline);
  }

  void barrier() override {
    const auto deadline = start("barrier");
    void* one = scratch_.reserve(sizeof(int32_t));
    settle(ncclAllReduce(one, one, 1, ncclInt32, ncclSum, comm_, cuda_stream()),
           "ncclAllReduce (barrier)", deadline);
    finish("ncclAllReduce (barrier)", deadline);
  }

  void sendrecv(const void* send_data, size_t send_bytes, int send_to, void* recv_data,
                size_t recv_bytes, int recv_from) override {
    const auto deadline = start("sendrecv");
    group_start();
    if (send_to >= 0 && send_bytes > 0)
      check_queued(ncclSend(send_data, send_bytes, ncclUint8, send_to, comm_, cuda_stream()),
                   "ncclSend");
    if (recv_from >= 0 && recv_bytes > 0)
      check_queued(ncclRecv(recv_data, recv_bytes, ncclUint8, recv_from, comm_, cuda_stream()),
                   "ncclRecv");
    group_end(deadline);
    finish("ncclSend/ncclRecv", deadline);
  }

 private:
  cudaStream_t cuda_stream() const { return static_cast<cudaStream_t>(stream_->native()); }

  ncclDataType_t dtype_of(DataType dtype) const {
    if (auto t = nccl_dtype(dtype)) return *t;
    throw Error(
        fmt::format("NCCL cannot reduce {} tensors (krug stages them through the CPU "
                    "plane; this is a bug if you see it)",
                    dtype_name(dtype)));
  }
  ncclRedOp_t op_of(ReduceOp op) const {
    if (auto o = nccl_op(op)) return *o;
    throw Error(fmt::format("NCCL has no {} reduction here", reduce_op_name(op)));
  }

  Clock::time_point start(const char* what) {
    if (!comm_)
      throw Error(
          fmt::format("NCCL {} on rank {}: the communicator was aborted after an earlier "
                      "failure",
                      what, rank_));
    return Clock::now() + timeout_;
  }

  std::string last_error() const {
    const char* s = comm_ ? ncclGetLastError(comm_) : nullptr;
    return s && *s ? fmt::format(" ({})", s) : "";
  }

  [[noreturn]] void fail(const std::string& message) {
    const std::string text = fmt::format(
        "NCCL on rank {} of {}: {}{}; the NCCL communicator was "
        "aborted",
        rank_, size_, message, last_error());
    abort();
    throw Error(text);
  }

  // ncclInProgress: poll the communicator until the queued work is accepted or fails.
  void settle(ncclResult_t r, const char* call, Clock::time_point deadline) {
    if (r == ncclSuccess) return;
    if (r != ncclInProgress) fail(fmt::format("{} failed: {}", call, result_text(r)));
    for (int spins = 0;; ++spins) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
      if (q != ncclSuccess) fail(fmt::format("ncclCommGetAsyncError failed: {}", result_text(q)));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(fmt::format("{} failed: {}", call, result_text(state)));
      if (Clock::now() > deadline)
        fail(
            fmt::format("{} did not complete before the deadline (KRUG_TIMEOUT_SECONDS): a peer "
                        "is missing or dead",
                        call));
      if (spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  void group_start() {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) fail(fmt::format("ncclGroupStart failed: {}", result_text(r)));
  }
  void check_queued(ncclResult_t r, const char* call) {
    if (r != ncclSuccess && r != ncclInProgress) {
      (void)ncclGroupEnd();
      fail(fmt::format("{} failed: {}", call, result_text(r)));
    }
  }
  void group_end(Clock::time_point deadline) { settle(ncclGroupEnd(), "ncclGroupEnd", deadline); }

  // Waits for the stream, watching the communicator for a peer's failure meanwhile.
  void finish(const char* call, Clock::time_point deadline) {
    for (int spins = 0;; ++spins) {
      cudaError_t s = cudaStreamQuery(cuda_stream());
      if (s == cudaSuccess) return;
      if (s != cudaErrorNotReady)
        fail(fmt::format("{}: cudaStreamQuery failed: {} ({})", call, cudaGetErrorName(s),
                         cudaGetErrorString(s)));
      ncclResult_t state = ncclSuccess;
      ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
      if (q != ncclSuccess) fail(fmt::format("ncclCommGetAsyncError failed: {}", result_text(q)));
      if (state != ncclSuccess && state != ncclInProgress)
        fail(fmt::format("{} failed: {}", call, result_text(state)));
      if (Clock::now() > deadline)
        fail(
            fmt::format("{} did not finish before the deadline (KRUG_TIMEOUT_SECONDS): a peer "
                        "is missing or dead",
                        call));
      if (spins > 1000) std::this_thread::yield();
    }
  }

  // Local and non-blocking (unlike ncclCommDestroy, which may wait for peers).
  void abort() {
    if (!comm_) return;
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  int rank_;
  int size_;
  std::shared_ptr<const device::Stream> stream_;
  Clock::duration timeout_;
  device::DeviceBuffer scratch_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

bool built() {
  return true;
}

std::string build_version() {
  return fmt::format("{}.{}.{}", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
}

int build_version_code() {
  return NCCL_VERSION_CODE;
}

std::string runtime_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

bool reduces(DataType dtype, ReduceOp op) {
  return nccl_dtype(dtype).has_value() && (nccl_op(op).has_value() || op == ReduceOp::kAverage);
}

std::unique_ptr<Communicator> make_communicator(Communicator& bootstrap,
                                                std::shared_ptr<const device::Stream> stream,
                                                const Options& options) {
  return std::make_unique<NcclCommunicator>(bootstrap, std::move(stream), options);
}

}  // namespace krug::collectives::nccl
