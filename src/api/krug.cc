// The public C++ API: a thin layer that owns the process's one Engine.
#include "krug/krug.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "api/elastic_health.h"
#include "api/mpi_job.h"
#include "api/request.h"
#include "api/runtime.h"
#include "collectives/mpi/mpi_backend.h"
#include "collectives/nccl/nccl_plane.h"
#include "common/config.h"
#include "common/log.h"
#include "common/shape.h"
#include "device/device.h"
#include "engine/engine.h"
#include "krug/elastic.h"
#include "krug/frontend.h"
#include "net/address.h"
#include "net/socket.h"
#include "rendezvous/elastic_protocol.h"
#include "rendezvous/server.h"

namespace krug {
namespace {

using controller::OpType;
using controller::Request;
using engine::TensorArgs;
using engine::tensor_args;

// The process's runtime: the engine, and how many times init() ran (so each initialization
// rendezvouses in its own namespace of the job's store). The only mutable global in krug
// besides the log level and the MPI lifetime (collectives/mpi/mpi_environment.h); DESIGN.md:
// "init() builds one Engine object".
struct Runtime {
  // Constructed before this object, so destroyed after it: MPI is finalized at exit only after
  // an engine the program never shut down has gone (see mpi_environment.h).
  Runtime() { collectives::mpi::pin_lifetime(); }
  std::mutex mu;
  MpiBootstrap mpi;  // declared before the engine: the rendezvous server outlives it
  std::shared_ptr<engine::Engine> engine;
  // Counts the changes of `engine`: a thread's copy of it is current while this has not moved.
  std::atomic<uint64_t> engine_changes{0};
  std::shared_ptr<OpNameCounters> op_names;  // this init()'s: names start again at every init()
  int generation = 0;
  std::optional<ElasticSession> elastic;  // this init()'s round, in elastic mode
};

Runtime& runtime() {
  static Runtime r;
  return r;
}

std::shared_ptr<engine::Engine> current() { return current_engine(); }

// An elastic worker's place in the next round: announce this init() to the driver and wait
// for its assignment (the driver forms a round once every live worker has asked).
rendezvous::elastic::Assignment join_round(rendezvous::Store& store, const Config& config,
                                           int64_t seq) {
  namespace el = rendezvous::elastic;
  if (config.elastic_worker_id.empty())
    throw Error("krug::init(): KRUG_ELASTIC is set but KRUG_ELASTIC_WORKER_ID is not; elastic "
                "workers are started by krugrun --host-discovery-script (or --min-np/--max-np)");
  store.set(el::join_key(config.elastic_worker_id, seq), {});
  rendezvous::Bytes value;
  try {
    value = store.get(el::assign_key(config.elastic_worker_id, seq),
                      whole_ms(config.elastic_timeout));
  } catch (const rendezvous::StoreTimeout&) {
    throw Error(fmt::format(
        "krug::init() on elastic worker {} ({}): krugrun formed no new round within {} s "
        "(KRUG_ELASTIC_TIMEOUT, krugrun --elastic-timeout): too few hosts for --min-np, or "
        "another worker did not come back; see krugrun's messages",
        config.elastic_worker_id, config.hostname, config.elastic_timeout.count()));
  }
  auto a = el::decode_assignment(std::string(value.begin(), value.end()));
  if (a.removed)
    throw elastic::WorkerRemoved(fmt::format("elastic worker {} ({}) was removed from the job: {}",
                                             config.elastic_worker_id, config.hostname,
                                             *a.removed));
  return a;
}

Handle submit(TensorArgs tensor) { return Handle(current()->enqueue(std::move(tensor))); }

frontend::TensorView view(const void* data, DataType dtype, const Shape& shape) {
  return frontend::TensorView{.dtype = dtype, .shape = shape, .data = data};
}

// The seam's per-tensor allocator for the C++ API's one-tensor form.
frontend::Callbacks allocating(OutputAllocator allocate) {
  frontend::Callbacks callbacks;
  if (allocate)
    callbacks.allocate = [allocate = std::move(allocate)](size_t, const Shape& shape) {
      return allocate(shape);
    };
  return callbacks;
}

}  // namespace

std::optional<ElasticSession> current_elastic_session() {
  auto& rt = runtime();
  std::lock_guard lock(rt.mu);
  if (!rt.engine) throw Error("krug is not initialized: call init() first");
  return rt.elastic;
}

const std::shared_ptr<engine::Engine>& engine_for_call() {
  // A lock and a shared count taken and given back cost a call on the direct lane a tenth of
  // its time: each thread keeps its own copy, and looks again only once it is stale.
  struct Copy {
    uint64_t changes = 0;
    std::shared_ptr<engine::Engine> engine;
  };
  thread_local Copy copy;
  auto& rt = runtime();
  if (!copy.engine || copy.changes != rt.engine_changes.load(std::memory_order_acquire)) {
    std::lock_guard lock(rt.mu);
    copy.engine = rt.engine;
    copy.changes = rt.engine_changes.load(std::memory_order_relaxed);
    if (!copy.engine) throw Error("krug is not initialized: call init() first");
  }
  return copy.engine;
}

std::shared_ptr<engine::Engine> current_engine() {
  return engine_for_call();
}

std::shared_ptr<OpNameCounters> current_op_name_counters() {
  auto& rt = runtime();
  std::lock_guard lock(rt.mu);
  if (!rt.engine) throw Error("krug is not initialized: call init() first");
  return rt.op_names;
}

const engine::HandleState& Handle::checked() const {
  if (!state_) throw Error("krug::Handle is empty: it was not returned by an operation");
  return *state_;
}
bool Handle::poll() const { return checked().done(); }
void Handle::wait() const {
  checked().wait();
  if (auto e = state_->error(); !e.empty()) throw Error(e);
}
bool Handle::wait_for(std::chrono::nanoseconds timeout) const {
  return checked().wait_until(std::chrono::steady_clock::now() + timeout);
}
std::string Handle::error() const { return checked().error(); }
const std::vector<uint8_t>& Handle::output() const { return checked().result().data; }
const Shape& Handle::output_shape() const { return checked().result().shape; }
const std::vector<int64_t>& Handle::received_splits() const {
  return checked().result().received_splits;
}
int64_t Handle::value() const { return checked().result().value; }

namespace {

// The store for this job: in memory for a job of one, else a client of krugrun's rendezvous
// server whose waits end once `stop` is requested.
std::shared_ptr<rendezvous::Store> job_store(Config& config, std::stop_token stop) {
  if (config.size == 1 && config.rendezvous_addr.empty())
    return std::make_shared<rendezvous::InMemoryStore>();
  if (config.rendezvous_addr.empty() || config.rendezvous_port <= 0)
    throw Error(fmt::format(
        "krug::init() on rank {}: KRUG_RENDEZVOUS_ADDR/KRUG_RENDEZVOUS_PORT are not set; start "
        "the job with krugrun (krugrun -np N your-command)",
        config.rank));
  try {
    config.advertise_address = net::advertise_address(config.iface, config.rendezvous_addr);
  } catch (const Error& e) {
    throw Error(fmt::format(
        "krug::init() on rank {} ({}): cannot choose the address to give "
        "peers: {}; set KRUG_GLOO_IFACE (krugrun --network-interface) to "
        "the interface the hosts share",
        config.rank, config.hostname.empty() ? net::hostname() : config.hostname, e.what()));
  }
  return std::make_shared<rendezvous::RendezvousClient>(
      config.rendezvous_addr, static_cast<uint16_t>(config.rendezvous_port), config.secret,
      whole_ms(config.timeout), std::move(stop), net::protection_for(config.encrypt));
}

// init()'s work, with the runtime locked.
void initialize(Runtime& rt, Config& config, std::stop_token stop) {
  if (started_by_mpirun(config)) {
    configure_from_mpi(config, rt.mpi);
  } else if (config.rank < 0 && config.size < 0) {
    // A plain `./program` without krugrun: a job of one.
    config.rank = 0;
    config.size = 1;
  }
  std::shared_ptr<rendezvous::Store> store = job_store(config, stop);
  auto client = std::dynamic_pointer_cast<rendezvous::RendezvousClient>(store);
  const int64_t seq = rt.generation++;
  std::string prefix = fmt::format("init{}/", seq);
  rt.elastic.reset();
  if (config.elastic) {
    auto a = join_round(*store, config, seq);
    config.rank = a.rank;
    config.size = a.size;
    config.local_rank = a.local_rank;
    config.local_size = a.local_size;
    config.cross_rank = a.cross_rank;
    config.cross_size = a.cross_size;
    config.hostname = a.hostname;
    // Every worker of a round, old or new, meets in the round's own namespace.
    prefix = rendezvous::elastic::round_prefix(a.round);
    rt.elastic = ElasticSession{store, a};
  }
  auto scoped = std::make_shared<rendezvous::PrefixStore>(prefix, std::move(store));
  // The elastic driver's health record is elastic code's, fed by the engine's rounds.
  std::vector<std::shared_ptr<engine::CycleObserver>> observers;
  if (config.elastic)
    observers.push_back(std::make_shared<api::HealthReporter>(scoped, config.rank));
  rt.engine = std::make_shared<engine::Engine>(config, std::move(scoped), std::move(observers),
                                               std::move(stop));
  rt.engine_changes.fetch_add(1, std::memory_order_release);
  rt.op_names = std::make_shared<OpNameCounters>();
  if (client) client->release_stop();
}

}  // namespace

void init() {
  init(std::stop_token{});
}

void init(std::stop_token stop) {
  auto& rt = runtime();
  std::lock_guard lock(rt.mu);
  if (rt.engine) throw Error("krug::init() called twice: call krug::shutdown() first");
  Config config = load_config();
  log::set_level(log::parse_level(config.log_level));
  try {
    initialize(rt, config, stop);
  } catch (const Error& e) {
    rt.elastic.reset();
    if (!stop.stop_requested()) throw;
    throw Error(fmt::format(
        "krug::init() on rank {} ({}) was interrupted before it finished "
        "({}); krug is not initialized",
        config.rank, config.hostname.empty() ? net::hostname() : config.hostname, e.what()));
  }
}

void shutdown() {
  shutdown(std::stop_token{});
}

void shutdown(std::stop_token stop) {
  std::shared_ptr<engine::Engine> engine;
  {
    auto& rt = runtime();
    std::lock_guard lock(rt.mu);
    engine = std::move(rt.engine);
    rt.engine_changes.fetch_add(1, std::memory_order_release);
    rt.op_names.reset();
  }
  if (!engine) return;
  // A stop while the other ranks are awaited ends the wait: this rank leaves at once, and
  // they are told, as after an interrupted collective.
  std::stop_callback abort(
      stop, [&engine] { engine->abort(interrupted_reason(engine->config(), "shutdown")); });
  engine->shutdown();
}

bool is_initialized() {
  auto& rt = runtime();
  std::lock_guard lock(rt.mu);
  return rt.engine != nullptr;
}

void start_timeline(const std::string& path, bool mark_cycles) {
  current()->start_timeline(path, mark_cycles);
}
void stop_timeline() {
  current()->stop_timeline();
}

int rank() { return current()->config().rank; }
int size() { return current()->config().size; }
int local_rank() {
  auto& c = current()->config();
  return c.local_rank >= 0 ? c.local_rank : c.rank;
}
int local_size() {
  auto& c = current()->config();
  return c.local_size >= 0 ? c.local_size : c.size;
}
int cross_rank() {
  auto& c = current()->config();
  return c.cross_rank >= 0 ? c.cross_rank : 0;
}
int cross_size() {
  auto& c = current()->config();
  return c.cross_size >= 0 ? c.cross_size : 1;
}

std::string cpu_operations() {
  return std::string(data_plane_name(current()->config().data_plane));
}
bool mpi_built() { return collectives::mpi::built(); }
bool cuda_built() { return device::cuda_built(); }
std::string cuda_version() { return device::cuda_build_version(); }
bool nccl_built() { return collectives::nccl::built(); }
int nccl_version_code() { return collectives::nccl::build_version_code(); }
std::string nccl_version() {
  if (!collectives::nccl::built()) return "";
  const std::string loaded = collectives::nccl::runtime_version();
  return collectives::nccl::build_version() + " (loaded: " + (loaded.empty() ? "none" : loaded) +
         ")";
}
int cuda_device_count() { return device::device_count(); }
bool mpi_threads_supported() {
  return cpu_operations() == "mpi" && collectives::mpi::thread_multiple();
}

Handle allreduce_async(const std::string& name, const void* input, void* output, DataType dtype,
                       const Shape& shape, const ReduceOptions& options) {
  return frontend::enqueue(name, frontend::reduction(frontend::OpType::kAllreduce, options),
                           view(input, dtype, shape), output);
}

void allreduce(const std::string& name, const void* input, void* output, DataType dtype,
               const Shape& shape, const ReduceOptions& options) {
  const auto op = frontend::reduction(frontend::OpType::kAllreduce, options);
  const auto in = view(input, dtype, shape);
  if (frontend::run_direct(name, op, in, output)) return;
  frontend::enqueue(name, op, in, output).wait();
}

Handle grouped_allreduce_async(const std::string& name, const std::vector<GroupTensor>& tensors,
                               const ReduceOptions& options) {
  std::vector<frontend::TensorView> inputs;
  std::vector<void*> outputs;
  for (const auto& t : tensors) {
    inputs.push_back(view(t.input, t.dtype, t.shape));
    outputs.push_back(t.output);
  }
  return frontend::enqueue_group(name, frontend::reduction(frontend::OpType::kAllreduce, options),
                                 inputs, outputs);
}

Handle allgather_async(const std::string& name, const void* input, DataType dtype,
                       const Shape& shape, ProcessSet process_set, OutputAllocator allocate) {
  return frontend::enqueue(name,
                           frontend::Op{.type = frontend::OpType::kAllgather,
                                        .process_set = process_set},
                           view(input, dtype, shape), nullptr, allocating(std::move(allocate)));
}

void allgather(const std::string& name, const void* input, void* output, DataType dtype,
               const Shape& shape, ProcessSet process_set) {
  const frontend::Op op{.type = frontend::OpType::kAllgather, .process_set = process_set};
  const auto in = view(input, dtype, shape);
  if (shape.empty())
    throw InvalidArgument(fmt::format("allgather '{}': a scalar has no first dimension", name));
  if (frontend::run_direct(name, op, in, output)) return;
  Shape expected = shape;
  expected[0] *= static_cast<int64_t>(process_set_ranks(process_set).size());
  // A rank whose result would not fit still takes part (its peers' collective needs it), into
  // memory of its own, and then says so.
  std::vector<uint8_t> misfit;
  Shape gathered;
  frontend::enqueue(name, op, in, nullptr, allocating([&](const Shape& shape) -> void* {
                      gathered = shape;
                      if (shape == expected) return output;
                      misfit.resize(static_cast<size_t>(shape_elements(shape)) * dtype_size(dtype));
                      return misfit.data();
                    }))
      .wait();
  if (gathered != expected)
    throw InvalidArgument(fmt::format(
        "allgather '{}': the ranks' shapes differ (gathered {}, this rank expected {}); "
        "allgather_async gathers tensors whose first dimensions differ",
        name, fmt::join(gathered, "x"), fmt::join(expected, "x")));
}

Handle broadcast_async(const std::string& name, void* data, DataType dtype, const Shape& shape,
                       int root, ProcessSet process_set) {
  return frontend::enqueue(
      name,
      frontend::Op{.type = frontend::OpType::kBroadcast, .process_set = process_set, .root = root},
      view(data, dtype, shape), data);
}

void broadcast(const std::string& name, void* data, DataType dtype, const Shape& shape, int root,
               ProcessSet process_set) {
  const frontend::Op op{
      .type = frontend::OpType::kBroadcast, .process_set = process_set, .root = root};
  if (frontend::run_direct(name, op, view(data, dtype, shape), data)) return;
  broadcast_async(name, data, dtype, shape, root, process_set).wait();
}

Handle alltoall_async(const std::string& name, const void* input, DataType dtype,
                      const Shape& shape, const std::vector<int64_t>& splits,
                      ProcessSet process_set, OutputAllocator allocate) {
  return frontend::enqueue(name,
                           frontend::Op{.type = frontend::OpType::kAlltoall,
                                        .process_set = process_set,
                                        .splits = splits},
                           view(input, dtype, shape), nullptr, allocating(std::move(allocate)));
}

Handle reducescatter_async(const std::string& name, const void* input, DataType dtype,
                           const Shape& shape, const ReduceOptions& options,
                           OutputAllocator allocate) {
  return frontend::enqueue(name, frontend::reduction(frontend::OpType::kReducescatter, options),
                           view(input, dtype, shape), nullptr, allocating(std::move(allocate)));
}

void barrier(ProcessSet process_set) {
  submit(tensor_args(api::control_request("__barrier", OpType::kBarrier, process_set.id), nullptr,
                     nullptr))
      .wait();
}

Handle join_async() { return frontend::join(); }

int join() {
  Handle h = join_async();
  h.wait();
  return static_cast<int>(h.value());
}

ProcessSet add_process_set(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  Request q = api::control_request(fmt::format("__add_process_set[{}]", fmt::join(ranks, ",")),
                                   OpType::kAddProcessSet, 0);
  q.set_ranks.assign(ranks.begin(), ranks.end());
  Handle h = submit(tensor_args(std::move(q), nullptr, nullptr));
  h.wait();
  return ProcessSet{static_cast<int32_t>(h.value())};
}

void remove_process_set(ProcessSet process_set) {
  Request q = api::control_request(fmt::format("__remove_process_set[{}]", process_set.id),
                                   OpType::kRemoveProcessSet, 0);
  q.target_process_set = process_set.id;
  submit(tensor_args(std::move(q), nullptr, nullptr)).wait();
}

std::vector<int> process_set_ranks(ProcessSet process_set) {
  auto ranks = current()->process_set_ranks(process_set.id);
  return {ranks.begin(), ranks.end()};
}

}  // namespace krug
