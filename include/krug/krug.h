// krug's framework-free C++ API: named collective operations on raw buffers.
//
// Start the program with krugrun (`krugrun -np 4 ./train`), call krug::init(), then submit
// operations by name. Every rank of a process set must submit the same name with the same op,
// data type and shape (allgather/alltoall: the first dimension may differ); krug negotiates
// which names are ready on all ranks, fuses small allreduces and runs them in the background.
//
//   krug::init();
//   std::vector<float> grad(1000, 1.0f);
//   krug::allreduce("grad", grad.data(), grad.data(), krug::DataType::kFloat32, {1000});
//   krug::shutdown();
//
// Asynchronous variants return a Handle; the input must stay valid (and the output untouched)
// until the handle completes. Errors (mismatched shapes across ranks, a dead peer, a timeout)
// complete the handle with a message naming the tensor, the ranks and the cause; synchronous
// calls and Handle::wait() throw krug::Error with that message.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <vector>

#include "krug/types.h"

namespace krug {

namespace engine {
class HandleState;
}

using Shape = std::vector<int64_t>;

// A group of ranks that runs collectives among themselves. Id 0 is every rank.
struct ProcessSet {
  int32_t id = 0;
  bool operator==(const ProcessSet&) const = default;
};
inline constexpr ProcessSet kGlobalProcessSet{0};

// Completion of an asynchronous operation.
class Handle {
 public:
  Handle() = default;
  explicit Handle(std::shared_ptr<engine::HandleState> state) : state_(std::move(state)) {}

  // False for a default-constructed handle (no operation); every other member then throws.
  bool valid() const { return state_ != nullptr; }
  // True once the operation finished, successfully or not. Never blocks.
  bool poll() const;
  // Blocks until finished; throws krug::Error with the failure message. While it waits, the
  // calling thread may run krug's engine itself (negotiation, collectives of any pending
  // operation) rather than sleep until the background thread has: a lone operation completes
  // without two thread hand-offs (when this host has a core per rank; see
  // KRUG_BUSY_POLL_MICROSECONDS).
  void wait() const;
  // Blocks at most `timeout` (the same as wait(), but without throwing); returns poll().
  bool wait_for(std::chrono::nanoseconds timeout) const;
  template <typename Rep, typename Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) const {
    return wait_for(std::chrono::ceil<std::chrono::nanoseconds>(timeout));
  }
  // After completion: empty on success, else what went wrong.
  std::string error() const;

  // Results of allgather, alltoall and reducescatter (owned by the handle), valid after wait().
  const std::vector<uint8_t>& output() const;
  const Shape& output_shape() const;
  // alltoall: rows received from each rank of the process set.
  const std::vector<int64_t>& received_splits() const;
  // join: the rank that joined last. add_process_set: the new set's id.
  int64_t value() const;

 protected:
  // Throws krug::Error when the handle is empty.
  const engine::HandleState& state() const { return checked(); }

 private:
  const engine::HandleState& checked() const;
  std::shared_ptr<engine::HandleState> state_;
};

// Initializes krug from the environment krugrun sets (KRUG_RANK, KRUG_SIZE, the rendezvous
// address and secret, and every KRUG_* knob; see docs/configuration.md). In a process that
// mpirun started (`mpirun -np N prog`, or `krugrun --mpi`), the ranks come from MPI instead, and
// rank 0 serves the rendezvous store itself when krugrun does not. Connects to every rank;
// throws krug::Error if that fails. Calling init() twice without shutdown() is an error.
void init();
// init() that gives up once `stop` is requested (from another thread: a binding's Ctrl-C, a
// program's own cancellation): its waits for the rendezvous server and the other ranks look
// every 50 ms, and it throws krug::Error saying it was interrupted, leaving krug uninitialized.
// MPI's own start-up (a job from mpirun) cannot be stopped.
void init(std::stop_token stop);
// Drains this rank's pending operations, stops the background thread and frees everything;
// other ranks' pending operations fail with a message naming this rank. init() may follow.
void shutdown();
// shutdown() that, once `stop` is requested, stops waiting for the other ranks: krug stops on
// this rank at once and their pending operations fail with an error naming it as interrupted.
void shutdown(std::stop_token stop);
bool is_initialized();

// Starts recording the timeline to `path` at run time (Horovod's hvd.start_timeline): a Chrome
// trace (chrome://tracing, ui.perfetto.dev) of every tensor's negotiation, queue and collective
// phases, with a CYCLE_START marker per negotiation round when `mark_cycles`; see
// docs/timeline.md. Only rank 0 writes the file; on other ranks the call does nothing. It is not
// collective: ranks need not call it together. A timeline already running (KRUG_TIMELINE's, or
// an earlier call's) is closed first as a complete file, unless it writes `path`, which then
// goes on with this `mark_cycles`. Throws krug::Error when krug is not initialized, and
// InvalidArgument naming the path when it is empty or cannot be created.
void start_timeline(const std::string& path, bool mark_cycles = false);
// Stops the timeline and closes its file as a complete JSON array (Horovod's hvd.stop_timeline);
// nothing to do when none runs. shutdown() does it too. Throws krug::Error when krug is not
// initialized.
void stop_timeline();

int rank();
int size();
int local_rank();
int local_size();
int cross_rank();
int cross_size();
// The global process set's CPU data plane: "shm" (every rank on one host), "gloo" or "mpi"
// (KRUG_CPU_OPERATIONS).
std::string cpu_operations();
// Whether this build has the MPI backend (Open MPI was found when krug was built).
bool mpi_built();
// Whether this build drives CUDA tensors (the CUDA toolkit was found when krug was built), and
// the CUDA runtime version it was built against ("13.0"; empty when not built).
bool cuda_built();
std::string cuda_version();
// Whether this build has the NCCL data plane for CUDA tensors, and the NCCL version it was built
// against and the one loaded now ("2.28.9 (loaded: 2.28.9)"; empty when not built).
bool nccl_built();
std::string nccl_version();
// The NCCL version this build was compiled against as nccl.h's NCCL_VERSION_CODE (22809 for
// 2.28.9: major * 10000 + minor * 100 + patch since NCCL 2.9), 0 without NCCL: what Horovod's
// hvd.nccl_built() returns.
int nccl_version_code();
// How many CUDA devices this process sees (0 without CUDA, a driver or a GPU). Never throws.
int cuda_device_count();
// Whether krug runs on MPI and MPI allows calls from several threads at once
// (MPI_THREAD_MULTIPLE), so the program may make its own MPI calls beside krug's.
bool mpi_threads_supported();

struct ReduceOptions {
  ReduceOp op = ReduceOp::kAverage;
  double prescale_factor = 1.0;   // applied to the input before the reduction
  double postscale_factor = 1.0;  // applied to the result (after averaging)
  ProcessSet process_set = kGlobalProcessSet;
};

// output may equal input (in place). Average divides by the process set's size.
Handle allreduce_async(const std::string& name, const void* input, void* output, DataType dtype,
                       const Shape& shape, const ReduceOptions& options = {});
void allreduce(const std::string& name, const void* input, void* output, DataType dtype,
               const Shape& shape, const ReduceOptions& options = {});

// One tensor of a grouped allreduce.
struct GroupTensor {
  const void* input = nullptr;
  void* output = nullptr;
  DataType dtype = DataType::kFloat32;
  Shape shape;
};
// The tensors (named "<name>.0", "<name>.1", ...) are negotiated as one request: they run
// together, once all are ready on all ranks, fused where they fit. One handle for all.
Handle grouped_allreduce_async(const std::string& name, const std::vector<GroupTensor>& tensors,
                               const ReduceOptions& options = {});

// Memory for a result whose shape only negotiation decides (allgather, alltoall,
// reducescatter). Called once, on one of krug's threads, with the result's shape; it returns
// room for that many elements of the op's dtype, valid and untouched until the handle
// completes. With it a caller reuses one buffer from call to call, as MPI's receive buffers
// are (a fresh result of megabytes costs page faults as long as the collective), or places the
// result in a framework's tensor. An exception it throws is a failed collective: krug stops,
// and this and every pending operation fail with its message on every rank. Without it the
// result lives in Handle::output() (Handle::output_shape() is set either way).
using OutputAllocator = std::function<void*(const Shape& shape)>;

// Concatenates every rank's tensor along the first dimension (which may differ per rank).
// The result is in Handle::output() with Handle::output_shape(), or where `allocate` said.
Handle allgather_async(const std::string& name, const void* input, DataType dtype,
                       const Shape& shape, ProcessSet process_set = kGlobalProcessSet,
                       OutputAllocator allocate = {});
// The synchronous allgather of a tensor whose shape is the same on every rank, as
// MPI_Allgather's: `output` holds size() x shape[0] rows, every rank's in rank order. Throws
// InvalidArgument when a rank's shape differs (allgather_async takes those).
void allgather(const std::string& name, const void* input, void* output, DataType dtype,
               const Shape& shape, ProcessSet process_set = kGlobalProcessSet);

// In place: `data` of rank `root` (index within the process set) is copied to every rank.
Handle broadcast_async(const std::string& name, void* data, DataType dtype, const Shape& shape,
                       int root, ProcessSet process_set = kGlobalProcessSet);
void broadcast(const std::string& name, void* data, DataType dtype, const Shape& shape, int root,
               ProcessSet process_set = kGlobalProcessSet);

// Sends splits[r] rows (first dimension) to rank r; empty splits = an even split. The rows
// received from every rank are concatenated in Handle::output() (or where `allocate` said);
// Handle::received_splits() says how many came from each rank.
Handle alltoall_async(const std::string& name, const void* input, DataType dtype,
                      const Shape& shape, const std::vector<int64_t>& splits = {},
                      ProcessSet process_set = kGlobalProcessSet, OutputAllocator allocate = {});

// Reduces every rank's tensor and leaves rank r with rows [start_r, start_r + n_r) of the
// result, where the first dimension is split as evenly as possible (lower ranks get the extra
// rows). The result is in Handle::output(), or where `allocate` said.
Handle reducescatter_async(const std::string& name, const void* input, DataType dtype,
                           const Shape& shape, const ReduceOptions& options = {},
                           OutputAllocator allocate = {});

// Returns once every rank of the process set has called barrier.
void barrier(ProcessSet process_set = kGlobalProcessSet);
// For a rank that ran out of data: until every rank has joined, the others' allreduces
// proceed with this rank contributing zeros. Returns the rank that joined last.
int join();
Handle join_async();

// Collective over all ranks: every rank calls it with the same ranks (ascending order not
// required). Returns the new set.
ProcessSet add_process_set(std::vector<int> ranks);
void remove_process_set(ProcessSet process_set);
std::vector<int> process_set_ranks(ProcessSet process_set);

}  // namespace krug
