#include "engine/engine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "collectives/adasum.h"
#include "collectives/gloo/gloo_communicator.h"
#include "collectives/hierarchical/hierarchical_communicator.h"
#include "collectives/mpi/mpi_backend.h"
#include "collectives/shm/shm_communicator.h"
#include "common/huge_pages.h"
#include "common/log.h"
#include "controller/negotiator.h"
#include "controller/response_cache.h"
#include "engine/control_plane.h"
#include "engine/executor.h"
#include "net/socket.h"
#include "observe/autotuner.h"
#include "observe/timeline.h"
#include "reduce/copy.h"
#include "reduce/reduce.h"
#include "rendezvous/elastic_protocol.h"

namespace krug::engine {

using controller::OpType;
using controller::Request;
using controller::RequestList;
using controller::Response;
using controller::ResponseList;
using controller::ResponseType;
using Clock = std::chrono::steady_clock;

namespace {

int64_t elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string upper(std::string_view s) {
  std::string u(s);
  for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return u;
}

// What an allreduce or reducescatter response decided, as the executor takes it.
Reduction reduction(const Response& r) {
  return Reduction{.dtype = r.dtype,
                   .op = r.reduce_op,
                   .prescale = r.prescale,
                   .postscale = r.postscale,
                   .process_set = r.process_set,
                   .on_device = r.device != controller::kHostMemory};
}

std::chrono::milliseconds seconds_to_ms(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0));
}

}  // namespace

// The loop's state belongs to whichever thread holds loop_mu_: the background thread, or a user
// thread waiting for a handle (drive()), which runs the same loop itself instead of sleeping
// until the background thread has done the work and woken it.
class Engine::Impl : public Driver, public std::enable_shared_from_this<Engine::Impl> {
 public:
  Impl(const Config& config, std::shared_ptr<rendezvous::Store> store,
       std::vector<std::shared_ptr<CycleObserver>> observers);
  ~Impl() override { shutdown(); }

  void shutdown();
  void abort(const std::string& reason);
  std::shared_ptr<HandleState> enqueue(std::span<TensorArgs> tensors);
  std::shared_ptr<HandleState> enqueue(const TensorView& tensor);
  std::vector<int32_t> process_set_ranks(int32_t id) const;
  std::string allreduce_algorithm(int32_t id) const;
  std::pair<int64_t, double> tuned_parameters() const {
    std::lock_guard lock(mu_);
    return tuned_;
  }
  void apply_tuning(int64_t fusion_threshold, double cycle_time_ms);
  void start_autotuner();
  const Config& config() const { return config_; }
  void drive(const HandleState& handle, Clock::time_point deadline) override;

 private:
  struct LocalEntry {
    TensorArgs args;
    std::shared_ptr<HandleState> handle;
    int64_t cache_id = -1;  // the response cache id it was sent as, if any
  };
  // Keyed by table_key(set, name). Entries travel as node handles: made (or reused) by enqueue,
  // queued, inserted into the table, extracted when finished and kept for reuse.
  using Table = std::unordered_map<std::string, LocalEntry>;
  using TableSlot = Table::value_type;
  using KeySet = std::unordered_set<std::string>;
  struct ProcessSetState {
    std::vector<int32_t> ranks;
    int my_index = -1;
    std::unique_ptr<collectives::Communicator> comm;
  };

  // Background thread.
  void run();
  bool loop_once();  // false once the loop has stopped
  // With loop_mu_ held, on either thread: one round of local work (new operations, requests,
  // the coordinator's decisions and their execution), and whatever peers sent, without waiting.
  // `background`: the background thread's round, which leaves a burst of operations that is still
  // being submitted to the thread that will wait for them (absorb_queue).
  void advance(bool background = false);
  // `sockets` false: the mailboxes only (with mailboxes, the sockets carry only doorbells for a
  // sleeper, lists a mailbox had no room for, and a dead peer's hang-up: a driving thread looks
  // at them every 64th round).
  void receive(bool sockets = true);
  std::vector<pollfd> poll_fds() const;
  // A waiting thread leaves drive() (having held the loop or not): the background thread must
  // look again if anything is left for it (its poll() may sleep on a state from before).
  void leave_loop(bool held);
  void wake_background();  // writes the eventfd the background thread polls
  void set_wake_timer(std::chrono::microseconds delay);  // 0 disarms; with mu_ held
  void fail_loop(const std::exception& e);
  void absorb_queue(bool background);
  // Takes mu_: fills `count` entries (fill(i, args)), checks them and queues them under one
  // handle, or none of them (the handle then fails with the reason).
  template <typename Fill>
  std::shared_ptr<HandleState> enqueue_entries(size_t count, const Fill& fill);
  // With mu_ held: why `q` cannot run on this rank, or empty (fills in alltoall's even splits).
  std::string check_request(Request& q) const;
  // With mu_ held: a node for a new operation's entry and its in-flight key, reused if possible.
  Table::node_type entry_node();
  KeySet::node_type key_node();
  void send_requests(Clock::time_point now);
  void coordinate(Clock::time_point now);
  void on_readable(const std::vector<pollfd>& fds);  // the control plane's sockets, as polled
  void inspect_stalls(Clock::time_point now);
  void process(ResponseList list);
  void execute(const Response& r);
  void run_allreduce(const Response& r, ProcessSetState& set);
  void run_allgather(const Response& r, ProcessSetState& set, LocalEntry& e);
  void run_broadcast(const Response& r, ProcessSetState& set, LocalEntry& e);
  void run_alltoall(const Response& r, ProcessSetState& set, LocalEntry& e);
  void run_reducescatter(const Response& r, ProcessSetState& set, LocalEntry& e);
  void finish(const std::string& key, const std::string& error = {});
  // Completes the entries a collective ran (null: none here), taking mu_ once for all.
  void finish_slots(std::span<TableSlot* const> slots, const std::string& error = {});
  // The local entry a response's cache id stands for (null: none on this rank).
  TableSlot* slot_for_id(uint32_t id);
  void fail_names(const Response& r, const std::string& error);
  // Names of a response, from the cache when it carries ids only.
  std::vector<std::string> names_of(const Response& r) const;
  // Fails every pending and future operation with `message` and stops the loop.
  void fatal(std::string message, bool tell_peers, bool is_error = true);
  std::string root_cause(const std::string& local_error);
  int poll_timeout_ms(Clock::time_point now) const;
  void add_process_set(int32_t id, const std::vector<int32_t>& ranks);
  std::unique_ptr<collectives::Communicator> make_communicator(int32_t id,
                                                               const std::vector<int32_t>& ranks,
                                                               int index);
  std::unique_ptr<collectives::Communicator> make_gloo(int32_t id, const std::string& scope,
                                                       int rank, int size);
  std::unique_ptr<collectives::shm::ShmCommunicator> make_shm(int32_t id, const std::string& scope,
                                                              int rank, int size);
  std::optional<bool> agree_on_hierarchical_allreduce();
  void wait_for_every_rank_to_connect();
  void timeline_begin(const std::string& name, std::string_view phase);
  void timeline_end(const std::string& name, std::string_view phase);

  Config config_;
  // KRUG_CPU_OPERATIONS as the user set it (empty: shm or gloo per set); config_.cpu_operations
  // then reports the data plane the global process set uses.
  std::string requested_operations_;
  std::shared_ptr<rendezvous::Store> store_;
  std::vector<std::shared_ptr<CycleObserver>> observers_;  // told after every negotiation round
  std::string advertise_;  // the address peers reach this rank's TCP transports at
  std::once_flag device_once_;
  std::shared_ptr<gloo::transport::Device> device_;  // made by the first make_gloo
  std::unique_ptr<ControlPlane> control_;
  controller::ResponseCache cache_;
  std::unique_ptr<controller::Negotiator> negotiator_;  // coordinator only
  std::unique_ptr<observe::Timeline> timeline_;         // rank 0 only, when configured
  std::unique_ptr<observe::Autotuner> autotuner_;       // rank 0 only, with KRUG_AUTOTUNE
  std::ofstream autotune_log_;
  std::optional<observe::TunedParameters> tuning_to_send_;  // rides on the next response list
  // KRUG_HIERARCHICAL_ALLREDUCE as the coordinator has it (nullopt: auto), so that every rank
  // builds the same communicators even if their environments disagree.
  std::optional<bool> hierarchical_allreduce_;
  std::chrono::microseconds busy_poll_{0};  // KRUG_BUSY_POLL_MICROSECONDS, 0 when oversubscribed
  // Waiting threads drive the loop (see drive()): only while every rank of this host has a core,
  // because a driving thread polls for its answer.
  bool waiters_drive_ = false;
  std::atomic<int> drivers_{0};  // threads in drive(): the background loop does not busy-poll then
  std::atomic<bool> asleep_{false};  // the background thread is in its blocking poll()
  net::Fd wake_;
  // With waiters_drive_, an enqueue arms this (if it is not armed) instead of writing wake_: a
  // thread that waits for the operation soon runs it itself, and the background thread wakes
  // at most once per cycle time (KRUG_CYCLE_TIME) for operations nobody waits for: the
  // batching window Horovod's loop has too, far below a training step's compute between a
  // gradient's enqueue and the wait for it. Never disarmed: that would cost a system call per
  // operation, more than the timer's one wake-up per cycle.
  net::Fd wake_timer_;
  bool wake_timer_armed_ = false;  // under mu_
  Clock::time_point queue_since_{};  // under mu_: when queue_ last became non-empty

  // Shared with user threads.
  mutable std::mutex mu_;
  std::vector<Table::node_type> queue_;
  // Set with queue_ or shutdown_requested_ (under mu_): a driving thread's rounds look at it
  // instead of taking mu_ from the threads enqueueing.
  std::atomic<bool> queue_changed_{false};
  KeySet in_flight_keys_;
  // Nodes of finished operations, for enqueue to reuse with the capacity of their strings: a
  // step of many small tensors then allocates no table node, key or in-flight entry. (glibc
  // caches 7 free chunks per size; a step frees hundreds, which then take its slow paths.)
  std::vector<Table::node_type> spare_entries_;
  std::vector<KeySet::node_type> spare_keys_;
  static constexpr size_t kMaxSpareNodes = 4096;
  std::map<int32_t, std::vector<int32_t>> set_ranks_;  // mirror of sets_ for user threads
  std::map<int32_t, std::string> set_allreduce_;       // how each set this rank is in allreduces
  bool shutdown_requested_ = false;
  std::pair<int64_t, double> tuned_;  // (fusion threshold, cycle time) in force, for readers
  std::string failure_;  // once set, every pending and future operation fails with it

  // The loop's state: only with loop_mu_ held.
  std::mutex loop_mu_;
  std::map<int32_t, ProcessSetState> sets_;
  Table table_;  // names share long prefixes: hashed
  // Entries sent as cache hits, by id: a cached response finds its tensors without a name.
  // Pointers into table_'s nodes, which stay put until erased (finish clears the slot).
  std::vector<TableSlot*> by_id_;
  std::vector<Table::node_type> finished_;   // finish_slots' scratch
  std::vector<std::shared_ptr<HandleState>> finished_handles_;
  std::vector<std::string> finished_names_;  // with an error only: the tensors it fails
  std::vector<Table::node_type> arrived_;    // absorb_queue's
  std::vector<TableSlot*> allreduce_slots_;  // run_allreduce's
  std::vector<FusedTensor> allreduce_tensors_;
  std::vector<Request> outgoing_;
  std::vector<uint32_t> outgoing_hits_;
  int awaiting_response_ = 0;
  Clock::time_point last_send_{};
  Clock::time_point shutdown_deadline_{};
  bool shutdown_sent_ = false;
  bool stopped_ = false;
  bool negotiation_dirty_ = false;
  Clock::time_point next_stall_check_{};
  Clock::time_point next_stall_warning_{};
  Executor executor_;
  uint64_t lists_seen_ = 0;  // request or response lists received: drive() polls on while they come
  std::thread thread_;
};

Engine::Impl::Impl(const Config& config, std::shared_ptr<rendezvous::Store> store,
                   std::vector<std::shared_ptr<CycleObserver>> observers)
    : config_(config),
      store_(std::move(store)),
      observers_(std::move(observers)),
      cache_(config.cache_capacity) {
  if (config_.size < 1 || config_.rank < 0 || config_.rank >= config_.size)
    throw Error(fmt::format("krug: invalid rank {} / size {}: start the job with krugrun, or set "
                            "KRUG_RANK and KRUG_SIZE",
                            config_.rank, config_.size));
  requested_operations_ = config_.cpu_operations;
  // Busy polling only pays while every rank of this host has a core of its own; otherwise the
  // polling rank takes the core from the one it waits for.
  const int local_ranks = config_.local_size > 0 ? config_.local_size : config_.size;
  if (static_cast<unsigned>(local_ranks) <= std::max(1u, std::thread::hardware_concurrency()))
    busy_poll_ = std::chrono::microseconds(config_.busy_poll_us);
  waiters_drive_ = busy_poll_.count() > 0;
  if (config_.cpu_operations == "mpi") collectives::mpi::require_world(config_.rank, config_.size);
  if (config_.hostname.empty()) config_.hostname = net::hostname();
  const auto timeout = seconds_to_ms(config_.timeout_seconds);
  const bool single_host = config_.local_size < 0 || config_.local_size == config_.size;
  const std::string advertise = !config_.advertise_address.empty() ? config_.advertise_address
                                : single_host                      ? "127.0.0.1"
                                                                   : config_.hostname;

  wake_ = net::Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_.valid()) throw Error(fmt::format("eventfd failed: {}", std::strerror(errno)));
  wake_timer_ = net::Fd(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!wake_timer_.valid())
    throw Error(fmt::format("timerfd_create failed: {}", std::strerror(errno)));
  // Lists go through shared-memory mailboxes when every rank is on one host (the control plane
  // checks), unless TCP or MPI was asked for: then the data plane's choice holds here too.
  const bool mailboxes = requested_operations_ != "gloo" && requested_operations_ != "mpi";
  auto mailbox_segment = [&](size_t bytes) {
    rendezvous::PrefixStore prefixed("control/", store_);
    return std::make_unique<transport::Segment>(config_.rank, config_.size, bytes,
                                                       config_.job_id, prefixed, timeout);
  };
  control_ = std::make_unique<ControlPlane>(config_.rank, config_.size, advertise,
                                            config_.hostname, *store_, config_.secret, timeout,
                                            mailboxes, mailbox_segment);
  advertise_ = advertise;
  hierarchical_allreduce_ = agree_on_hierarchical_allreduce();
  std::vector<int32_t> all(config_.size);
  for (int i = 0; i < config_.size; ++i) all[i] = i;
  add_process_set(0, all);
  // What cpu_operations() reports: the transport between hosts for a hierarchical set (Gloo;
  // its groups inside a host use shared memory).
  const auto* global = sets_[0].comm.get();
  config_.cpu_operations =
      !global || dynamic_cast<const collectives::HierarchicalCommunicator*>(global)
          ? "gloo"
          : global->backend_name();
  wait_for_every_rank_to_connect();
  if (control_->is_coordinator()) {
    negotiator_ = std::make_unique<controller::Negotiator>(
        config_.size, config_.fusion_threshold_bytes, cache_);
    if (config_.elastic) negotiator_->track_readiness();  // for the elastic health report
  }
  if (config_.rank == 0 && !config_.timeline_path.empty())
    timeline_ = std::make_unique<observe::Timeline>(config_.timeline_path);
  executor_ = Executor(timeline_.get(), DeviceOptions{.timeout_seconds = config_.timeout_seconds,
                                                      .rank = config_.rank,
                                                      .hostname = config_.hostname});
  tuned_ = {config_.fusion_threshold_bytes, config_.cycle_time_ms};
  if (control_->is_coordinator() && config_.autotune) start_autotuner();
  thread_ = std::thread([this] { run(); });
}

void Engine::Impl::wait_for_every_rank_to_connect() {
  // A rank whose side of every mesh is up may return from init(), finish and close its sockets
  // while a peer is still completing its side (a hierarchical set connects several meshes one
  // after another): no rank leaves init() before every rank has connected everything.
  if (config_.size == 1) return;
  constexpr const char* kCount = "engine/connected", *kAll = "engine/all_connected";
  if (store_->add(kCount, 1) == config_.size) store_->set(kAll, {1});
  try {
    store_->wait({kAll}, seconds_to_ms(config_.timeout_seconds));
  } catch (const rendezvous::StoreTimeout&) {
    throw Error(fmt::format("rank {} ({}) timed out after {} s waiting for every rank to connect "
                            "its data plane; see the other ranks' errors (raise "
                            "KRUG_TIMEOUT_SECONDS for slow starts)",
                            config_.rank, config_.hostname, config_.timeout_seconds));
  }
}

std::optional<bool> Engine::Impl::agree_on_hierarchical_allreduce() {
  auto text = [](std::optional<bool> v) { return std::string(v ? (*v ? "1" : "0") : "auto"); };
  const std::string mine = text(config_.hierarchical_allreduce);
  constexpr const char* kKey = "engine/hierarchical_allreduce";
  if (config_.rank == 0) {
    store_->set(kKey, std::vector<uint8_t>(mine.begin(), mine.end()));
    return config_.hierarchical_allreduce;
  }
  const auto bytes = store_->get(kKey, seconds_to_ms(config_.timeout_seconds));
  const std::string coordinator(bytes.begin(), bytes.end());
  if (coordinator != mine)
    log::at(log::Level::kWarning, config_.rank,
            "KRUG_HIERARCHICAL_ALLREDUCE is {} here but {} on rank 0; every rank follows rank 0",
            mine, coordinator);
  if (coordinator == "auto") return std::nullopt;
  return coordinator == "1";
}

std::unique_ptr<collectives::Communicator> Engine::Impl::make_gloo(int32_t id,
                                                                    const std::string& scope,
                                                                    int rank, int size) {
  auto prefixed = std::make_shared<rendezvous::PrefixStore>(
      scope.empty() ? fmt::format("gloo/{}/", id) : fmt::format("gloo/{}/{}/", id, scope), store_);
  // Gloo carries what shared memory does not: sets across hosts, point-to-point messages. Its
  // device starts an event-loop thread that wakes every 10 ms, so it is made on first use: a
  // job whose sets all use shared memory never wakes the cores its training runs on.
  std::call_once(device_once_,
                 [&] { device_ = collectives::make_gloo_device(advertise_, config_.iface); });
  return std::make_unique<collectives::GlooCommunicator>(
      rank, size, std::move(prefixed), device_, seconds_to_ms(config_.timeout_seconds));
}

void Engine::Impl::start_autotuner() {
  observe::AutotuneOptions options;
  options.warmup_samples = static_cast<int>(config_.autotune_warmup_samples);
  options.steps_per_sample = static_cast<int>(config_.autotune_steps_per_sample);
  options.max_samples = static_cast<int>(config_.autotune_max_samples);
  options.noise = config_.autotune_gp_noise;
  if (!config_.autotune_log.empty()) {
    autotune_log_.open(config_.autotune_log, std::ios::out | std::ios::trunc);
    if (!autotune_log_)
      throw Error(fmt::format("KRUG_AUTOTUNE_LOG: cannot write {}: {}", config_.autotune_log,
                              std::strerror(errno)));
  }
  // Start inside the ranges: a fusion threshold of 0 (fusion off) starts from the smallest.
  // The log's hierarchical column records what the global set uses (the engine does not tune
  // it: see observe/autotuner.h).
  bool hierarchical = false;
  {
    std::lock_guard lock(mu_);
    auto it = set_allreduce_.find(0);
    hierarchical = it != set_allreduce_.end() && it->second.rfind("hierarchical", 0) == 0;
  }
  const observe::TunedParameters start{
      std::clamp(config_.fusion_threshold_bytes, options.min_fusion_bytes, options.max_fusion_bytes),
      std::clamp(config_.cycle_time_ms, options.min_cycle_ms, options.max_cycle_ms), hierarchical};
  autotuner_ = std::make_unique<observe::Autotuner>(start, options, [this](const std::string& line) {
    if (autotune_log_.is_open()) autotune_log_ << line << std::endl;
    if (line.rfind("settled,", 0) == 0)
      log::at(log::Level::kInfo, config_.rank, "autotune: {}", line);
  });
  apply_tuning(start.fusion_threshold_bytes, start.cycle_time_ms);
  tuning_to_send_ = start;
}

void Engine::Impl::apply_tuning(int64_t fusion_threshold, double cycle_time_ms) {
  config_.fusion_threshold_bytes = fusion_threshold;
  config_.cycle_time_ms = cycle_time_ms;
  if (negotiator_) negotiator_->set_fusion_threshold(fusion_threshold);
  std::lock_guard lock(mu_);
  tuned_ = {fusion_threshold, cycle_time_ms};
}

std::unique_ptr<collectives::shm::ShmCommunicator> Engine::Impl::make_shm(
    int32_t id, const std::string& scope, int rank, int size) {
  rendezvous::PrefixStore prefixed(
      scope.empty() ? fmt::format("shm/{}/", id) : fmt::format("shm/{}/{}/", id, scope), store_);
  collectives::shm::Options options;
  options.job_id = config_.job_id;
  options.timeout = seconds_to_ms(config_.timeout_seconds);
  return std::make_unique<collectives::shm::ShmCommunicator>(rank, size, prefixed, options);
}

std::unique_ptr<collectives::Communicator> Engine::Impl::make_communicator(
    int32_t id, const std::vector<int32_t>& ranks, int index) {
  if (requested_operations_ == "mpi") {
    // MPI sets keep their flat rank-ordered allreduce: the hierarchical one is built from Gloo
    // groups (see docs/architecture.md).
    collectives::mpi::Options options;
    options.timeout = seconds_to_ms(config_.timeout_seconds);
    return collectives::mpi::make_communicator(ranks, index, id, options);
  }
  const int size = static_cast<int>(ranks.size());
  std::vector<std::string> hosts;
  for (int32_t r : ranks) hosts.push_back(control_->host_of(r));
  const bool one_host = std::all_of(hosts.begin(), hosts.end(),
                                    [&](const std::string& h) { return h == hosts.front(); });
  const bool use_shm = requested_operations_ != "gloo";
  if (use_shm && one_host) {
    auto shm = make_shm(id, "", index, size);
    shm->set_point_to_point([this, id, index, size] { return make_gloo(id, "", index, size); });
    return shm;
  }
  auto layout = collectives::HostLayout::from_host_names(hosts);
  if (requested_operations_ == "shm") {
    std::vector<std::pair<std::string, std::vector<int32_t>>> by_host;  // in order of appearance
    for (size_t i = 0; i < ranks.size(); ++i) {
      auto it = std::find_if(by_host.begin(), by_host.end(),
                             [&](const auto& entry) { return entry.first == hosts[i]; });
      if (it == by_host.end()) it = by_host.insert(by_host.end(), {hosts[i], {}});
      it->second.push_back(ranks[i]);
    }
    std::vector<std::string> parts;
    for (const auto& [host, members] : by_host)
      parts.push_back(fmt::format("{}: [{}]", host, fmt::join(members, " ")));
    throw Error(fmt::format("KRUG_CPU_OPERATIONS=shm: process set {} has ranks on several hosts "
                            "({}), and shared memory joins only ranks of one host; unset "
                            "KRUG_CPU_OPERATIONS (shared memory inside a host, Gloo across hosts) "
                            "or set it to gloo",
                            id, fmt::join(parts, ", ")));
  }
  auto flat = make_gloo(id, "", index, size);
  // Every member decides alike: the same coordinator setting, host table and member list. The
  // choice depends on the topology only, never on timing or message size, because it fixes how
  // float sums are associated (see hierarchical_communicator.h).
  const bool hierarchical = hierarchical_allreduce_.value_or(true) && layout.has_hierarchy();
  const bool report = index == 0;  // one line per set, from its first member
  if (!hierarchical) {
    if (report && hierarchical_allreduce_.value_or(false) && size > 1)
      log::at(log::Level::kInfo, config_.rank,
              "process set {}: KRUG_HIERARCHICAL_ALLREDUCE=1, but a hierarchical allreduce needs "
              "several hosts with two ranks on one (members by host: {}); allreduce stays flat",
              id, layout.describe());
    return flat;
  }
  if (report)
    log::at(log::Level::kInfo, config_.rank,
            "process set {}: hierarchical allreduce ({}), members by host: {}", id,
            hierarchical_allreduce_ ? "KRUG_HIERARCHICAL_ALLREDUCE=1" : "auto",
            layout.describe());
  return std::make_unique<collectives::HierarchicalCommunicator>(
      std::move(layout), index, std::move(flat),
      [&](const std::string& scope, int rank, int group_size)
          -> std::unique_ptr<collectives::Communicator> {
        // Groups inside a host exchange through shared memory; they never send point to point.
        if (use_shm && scope.rfind("local/", 0) == 0)
          return make_shm(id, "hier/" + scope, rank, group_size);
        return make_gloo(id, "hier/" + scope, rank, group_size);
      });
}

void Engine::Impl::add_process_set(int32_t id, const std::vector<int32_t>& ranks) {
  ProcessSetState state;
  state.ranks = ranks;
  auto it = std::find(ranks.begin(), ranks.end(), config_.rank);
  if (it != ranks.end()) {
    state.my_index = static_cast<int>(it - ranks.begin());
    state.comm = make_communicator(id, ranks, state.my_index);
  }
  std::string algorithm;
  if (auto* h = dynamic_cast<collectives::HierarchicalCommunicator*>(state.comm.get()))
    algorithm = "hierarchical " + h->layout().describe();
  else if (state.comm)
    algorithm = "flat";
  sets_[id] = std::move(state);
  std::lock_guard lock(mu_);
  set_ranks_[id] = ranks;
  set_allreduce_[id] = algorithm;
}

std::string Engine::Impl::allreduce_algorithm(int32_t id) const {
  std::lock_guard lock(mu_);
  auto it = set_allreduce_.find(id);
  if (it == set_allreduce_.end()) throw Error(fmt::format("process set {} does not exist", id));
  return it->second;
}

std::vector<int32_t> Engine::Impl::process_set_ranks(int32_t id) const {
  std::lock_guard lock(mu_);
  auto it = set_ranks_.find(id);
  if (it == set_ranks_.end()) throw Error(fmt::format("process set {} does not exist", id));
  return it->second;
}

std::shared_ptr<HandleState> Engine::Impl::enqueue(std::span<TensorArgs> tensors) {
  return enqueue_entries(tensors.size(),
                         [&](size_t i, TensorArgs& args) { args = std::move(tensors[i]); });
}

std::shared_ptr<HandleState> Engine::Impl::enqueue(const TensorView& t) {
  return enqueue_entries(1, [&](size_t, TensorArgs& args) {
    // Assignments into the reused entry's capacity. Every field is set: the entry held another
    // operation before.
    Request& q = args.request;
    q.name = t.name;
    q.op = t.op;
    q.dtype = t.dtype;
    q.reduce_op = t.reduce_op;
    q.process_set = t.process_set;
    q.root = t.root;
    q.prescale = t.prescale;
    q.postscale = t.postscale;
    q.shape.assign(t.shape.begin(), t.shape.end());
    q.splits.clear();
    q.set_ranks.clear();
    q.target_process_set = 0;
    q.group.clear();
    q.group_size = 0;
    args.input = t.input;
    args.output = t.output;
    args.allocate_output = nullptr;
    args.ready = nullptr;
  });
}

std::string Engine::Impl::check_request(Request& q) const {
  auto set = set_ranks_.find(q.process_set);
  if (set == set_ranks_.end())
    return fmt::format("{} '{}': process set {} does not exist on rank {}",
                       controller::op_name(q.op), q.name, q.process_set, config_.rank);
  if (!std::binary_search(set->second.begin(), set->second.end(), config_.rank))
    return fmt::format("{} '{}': rank {} is not a member of process set {} (ranks [{}])",
                       controller::op_name(q.op), q.name, config_.rank, q.process_set,
                       fmt::join(set->second, ", "));
  if (std::any_of(q.shape.begin(), q.shape.end(), [](int64_t d) { return d < 0; }))
    return fmt::format("{} '{}': negative dimension in shape [{}]", controller::op_name(q.op),
                       q.name, fmt::join(q.shape, ", "));
  if (q.op == OpType::kAlltoall && q.splits.empty()) {
    const int64_t n = static_cast<int64_t>(set->second.size());
    const int64_t rows = q.shape.empty() ? 0 : q.shape[0];
    if (q.shape.empty() || rows % n != 0)
      return fmt::format("alltoall '{}': first dimension {} is not divisible by the {} ranks of "
                         "process set {}; pass splits",
                         q.name, rows, n, q.process_set);
    q.splits.assign(n, rows / n);
  }
  return {};
}

template <typename Fill>
std::shared_ptr<HandleState> Engine::Impl::enqueue_entries(size_t count, const Fill& fill) {
  auto handle = std::make_shared<HandleState>(static_cast<int>(count));
  auto fail = [&](const std::string& message, std::string_view tensor = {}) {
    for (size_t i = 0; i < count; ++i) handle->complete_part(message, tensor);
    return handle;
  };
  if (count == 0) return handle;
  if (waiters_drive_) handle->set_driver(weak_from_this());
  std::lock_guard lock(mu_);
  if (!failure_.empty()) return fail(failure_);
  if (shutdown_requested_)
    return fail(fmt::format("krug is shutting down on rank {}: no new operations", config_.rank));
  // The background thread takes the whole queue at once, so it needs waking only when the
  // queue was empty: otherwise an earlier enqueue's wake-up is still pending.
  // Nor while a waiting thread drives the loop: it takes the queue itself, and wakes the
  // background thread when it leaves with work left.
  const bool wake = queue_.empty() && drivers_.load() == 0;
  const size_t first = queue_.size();
  // A grouped request is all or nothing: a bad tensor takes the ones before it out again.
  auto reject = [&](const std::string& message, std::string_view tensor) {
    for (size_t j = first; j < queue_.size(); ++j) in_flight_keys_.erase(queue_[j].key());
    queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(first), queue_.end());
    handle->reject(message, tensor);
    return handle;
  };
  for (size_t i = 0; i < count; ++i) {
    Table::node_type entry = entry_node();
    LocalEntry& e = entry.mapped();
    fill(i, e.args);
    const Request& q = e.args.request;
    if (std::string why = check_request(e.args.request); !why.empty()) return reject(why, q.name);
    KeySet::node_type key = key_node();
    controller::assign_table_key(key.value(), q.process_set, q.name);
    auto placed = in_flight_keys_.insert(std::move(key));
    // A grouped request must not name a tensor twice either: its second insert fails too.
    if (!placed.inserted)
      return reject(fmt::format(
          "{} '{}' (process set {}): an operation with this name is already in flight on rank "
          "{}; wait for it before reusing the name",
          controller::op_name(q.op), q.name, q.process_set, config_.rank),
          q.name);
    entry.key() = *placed.position;  // into the reused node's capacity
    e.handle = handle;
    e.cache_id = -1;
    queue_.push_back(std::move(entry));
  }
  if (first == 0 && waiters_drive_) queue_since_ = Clock::now();  // a burst begins
  queue_changed_.store(true, std::memory_order_release);
  if (wake && waiters_drive_) {
    if (!wake_timer_armed_)
      set_wake_timer(std::chrono::microseconds(static_cast<int64_t>(tuned_.second * 1000)));
  } else if (wake) {
    wake_background();
  }
  return handle;
}

Engine::Impl::Table::node_type Engine::Impl::entry_node() {
  if (spare_entries_.empty()) {
    Table one;
    return one.extract(one.try_emplace(std::string()).first);
  }
  Table::node_type node = std::move(spare_entries_.back());
  spare_entries_.pop_back();
  return node;
}

Engine::Impl::KeySet::node_type Engine::Impl::key_node() {
  if (spare_keys_.empty()) {
    KeySet one;
    return one.extract(one.emplace().first);
  }
  KeySet::node_type node = std::move(spare_keys_.back());
  spare_keys_.pop_back();
  return node;
}

void Engine::Impl::shutdown() {
  {
    std::lock_guard lock(mu_);
    shutdown_requested_ = true;
    queue_changed_.store(true, std::memory_order_release);
  }
  if (wake_.valid()) wake_background();
  if (thread_.joinable()) thread_.join();
}

void Engine::Impl::abort(const std::string& reason) {
  {
    // The loop's state is ours while we hold loop_mu_ (as a waiting thread's drive() does).
    std::lock_guard lock(loop_mu_);
    fatal(reason, true);
  }
  // The background thread finds the loop stopped and ends.
  if (wake_.valid()) wake_background();
}

void Engine::Impl::run() {
  for (;;) {
    try {
      if (!loop_once()) break;
    } catch (const std::exception& e) {
      std::lock_guard lock(loop_mu_);
      fail_loop(e);
    }
  }
  // Communicators go away on this thread, after the last collective that used them.
  std::lock_guard lock(loop_mu_);
  sets_.clear();
}

void Engine::Impl::fail_loop(const std::exception& e) {
  fatal(root_cause(fmt::format("krug background loop failed on rank {} ({}): {}", config_.rank,
                               config_.hostname, e.what())),
        true);
}

std::vector<pollfd> Engine::Impl::poll_fds() const {
  std::vector<pollfd> fds;
  fds.push_back({wake_.get(), POLLIN, 0});
  fds.push_back({wake_timer_.get(), POLLIN, 0});
  for (int fd : control_->fds())
    if (fd >= 0) fds.push_back({fd, POLLIN, 0});
  return fds;
}

void Engine::Impl::advance(bool background) {
  absorb_queue(background);
  const auto now = Clock::now();
  if (control_->is_coordinator())
    coordinate(now);
  else
    send_requests(now);
}

void Engine::Impl::receive(bool sockets) {
  if (!sockets) {
    if (control_->has_mail()) on_readable({});
    return;
  }
  auto fds = poll_fds();
  const int n = ::poll(fds.data(), fds.size(), 0);
  if (n < 0 && errno != EINTR) throw Error(fmt::format("poll failed: {}", std::strerror(errno)));
  if (n <= 0 && !control_->has_mail()) return;
  uint64_t drained;
  if (fds[0].revents) (void)!::read(wake_.get(), &drained, sizeof(drained));
  if (fds[1].revents && ::read(wake_timer_.get(), &drained, sizeof(drained)) > 0) {
    std::lock_guard lock(mu_);
    wake_timer_armed_ = false;
  }
  on_readable(std::vector<pollfd>(fds.begin() + 2, fds.end()));
}

bool Engine::Impl::loop_once() {
  std::vector<pollfd> fds;
  int timeout = -1;
  bool busy = false;
  {
    std::lock_guard lock(loop_mu_);
    if (stopped_) return false;
    advance(/*background=*/true);
    if (stopped_) return false;
    fds = poll_fds();
    timeout = poll_timeout_ms(Clock::now());
    busy = busy_poll_.count() > 0 && timeout != 0 && !table_.empty() && drivers_ == 0;
  }
  // Sleep without the loop, so a thread that waits for a handle can run it meanwhile.
  int n = 0;
  // Busy-poll briefly while this rank has operations in flight: the answer usually comes within
  // tens of microseconds, and sleeping costs a wake-up as long again on a VM. (Measured and not
  // done: spinning in Handle::wait and polling on after the last completion; with a user thread
  // and this thread per rank on one core each they slowed the 4 KiB and 100 x 1 KiB steps.)
  if (busy) {
    const auto until = Clock::now() + busy_poll_;
    do n = control_->has_mail() ? 1 : ::poll(fds.data(), fds.size(), 0);
    while (n == 0 && Clock::now() < until && drivers_.load(std::memory_order_relaxed) == 0);
  }
  if (n == 0) {
    // Peers ring the doorbell only for a sleeper: say so, then look once more.
    asleep_ = true;
    if (!control_->prepare_to_sleep()) timeout = 0;
    n = ::poll(fds.data(), fds.size(), timeout);
    control_->awake();
    asleep_ = false;
    if (n == 0 && control_->has_mail()) n = 1;
  }
  if (n < 0 && errno != EINTR) throw Error(fmt::format("poll failed: {}", std::strerror(errno)));
  if (n <= 0) return true;
  // A waiting thread may have read it all in the meantime: receive() looks again.
  std::lock_guard lock(loop_mu_);
  if (stopped_) return false;
  receive();
  return !stopped_;
}

void Engine::Impl::drive(const HandleState& handle, Clock::time_point deadline) {
  ++drivers_;
  // Poll as long as lists keep coming, and for the answer as long as the background loop would
  // after the last one; then sleep and leave the rest to it: the peers may be far behind.
  auto until = std::min(deadline, Clock::now() + busy_poll_);
  // While the background thread is in a round (it may be finishing this very operation), poll
  // rather than sleep on the mutex: a sleeper costs a wake-up as long as the operation.
  std::unique_lock lock(loop_mu_, std::defer_lock);
  while (!lock.try_lock())
    if (handle.done() || Clock::now() >= until) return leave_loop(false);
  if (stopped_) return leave_loop(true);
  // Lists are read here now: peers need not ring the sleeping background thread's doorbell.
  control_->awake();
  try {
    for (unsigned round = 0;; ++round) {
      advance();
      if (stopped_ || handle.done()) break;
      const uint64_t before = lists_seen_;
      receive(!control_->uses_mailboxes() || round % 64 == 0);
      if (stopped_ || handle.done()) break;
      const auto now = Clock::now();
      if (lists_seen_ != before) until = std::min(deadline, now + busy_poll_);
      if (now >= until) break;
    }
  } catch (const std::exception& e) {
    fail_loop(e);
  }
  leave_loop(true);
}

void Engine::Impl::leave_loop(bool held) {
  // First no longer a driver, then look at the queue (under mu_, as enqueue reads drivers_):
  // an enqueue that saw this thread still driving did not wake the background thread.
  drivers_.fetch_sub(1);
  // The background thread sleeps on: peers must ring its doorbell again, unless a list came in
  // just now (then it must look, as it must at any work left).
  bool left = held && asleep_ && !control_->prepare_to_sleep();
  left = left || (held && (stopped_ || !table_.empty() || !outgoing_.empty() ||
                           !outgoing_hits_.empty() || shutdown_deadline_ != Clock::time_point{}));
  if (!left) {
    std::lock_guard lock(mu_);
    left = !queue_.empty() || shutdown_requested_;
  }
  if (left) wake_background();
}

void Engine::Impl::wake_background() {
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
}

void Engine::Impl::set_wake_timer(std::chrono::microseconds delay) {
  itimerspec spec{};
  spec.it_value.tv_sec = static_cast<time_t>(delay.count() / 1000000);
  spec.it_value.tv_nsec = static_cast<long>(delay.count() % 1000000 * 1000);
  (void)::timerfd_settime(wake_timer_.get(), 0, &spec, nullptr);
  wake_timer_armed_ = delay.count() > 0;
}

int Engine::Impl::poll_timeout_ms(Clock::time_point now) const {
  auto until = [&](Clock::time_point t) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count();
    return static_cast<int>(std::max<int64_t>(0, ms + 1));
  };
  int timeout = -1;  // sleep until work arrives or a peer speaks
  auto consider = [&](Clock::time_point t) {
    int ms = until(t);
    timeout = timeout < 0 ? ms : std::min(timeout, ms);
  };
  if (!outgoing_.empty() || !outgoing_hits_.empty())
    consider(last_send_ + std::chrono::microseconds(int64_t(config_.cycle_time_ms * 1000)));
  if (shutdown_deadline_ != Clock::time_point{} && !shutdown_sent_) consider(shutdown_deadline_);
  if (negotiator_ && negotiator_->has_pending() && !config_.stall_check_disable)
    consider(next_stall_check_);
  return timeout;
}

void Engine::Impl::absorb_queue(bool background) {
  if (!queue_changed_.load(std::memory_order_acquire)) return;
  std::vector<Table::node_type>& arrived = arrived_;
  bool shutting_down;
  {
    std::lock_guard lock(mu_);
    if (background && waiters_drive_ && !queue_.empty() && !shutdown_requested_) {
      // Woken by the cycle timer of an earlier burst, or by a peer, while this one is still being
      // submitted: taking part of it would split the step into several responses, each a
      // round trip and a collective. The thread that waits for it takes it whole; this thread
      // does only after the cycle time (Horovod's batching window too).
      const auto due = queue_since_ + std::chrono::microseconds(
                                          static_cast<int64_t>(tuned_.second * 1000));
      const auto now = Clock::now();
      if (now < due) {
        if (!wake_timer_armed_)
          set_wake_timer(std::chrono::ceil<std::chrono::microseconds>(due - now));
        return;
      }
    }
    queue_changed_.store(false, std::memory_order_relaxed);
    arrived.swap(queue_);  // both keep their capacity from step to step
    shutting_down = shutdown_requested_;
  }
  for (auto& node : arrived) {
    LocalEntry& e = node.mapped();
    const Request& q = e.args.request;
    int64_t hit = -1;
    if (controller::ResponseCache::cacheable(q))
      if (auto id = cache_.find(node.key(), q)) hit = *id;
    if (hit >= 0)
      outgoing_hits_.push_back(static_cast<uint32_t>(hit));
    else
      outgoing_.push_back(q);
    if (timeline_) timeline_begin(q.name, "NEGOTIATE_" + upper(controller::op_name(q.op)));
    e.cache_id = hit;
    auto placed = table_.insert(std::move(node));
    if (hit >= 0 && placed.inserted) {
      if (by_id_.size() <= static_cast<size_t>(hit)) by_id_.resize(cache_.size(), nullptr);
      by_id_[static_cast<size_t>(hit)] = &*placed.position;
    }
  }
  arrived.clear();
  if (shutting_down && shutdown_deadline_ == Clock::time_point{})
    shutdown_deadline_ = Clock::now() + seconds_to_ms(config_.timeout_seconds);
}

void Engine::Impl::send_requests(Clock::time_point now) {
  const bool has_new = !outgoing_.empty() || !outgoing_hits_.empty();
  const auto cycle = std::chrono::microseconds(int64_t(config_.cycle_time_ms * 1000));
  // Nagle-style batching: send at once when nothing of ours is awaiting a response (lowest
  // latency for a lone op), otherwise at most once per cycle so a burst fuses well.
  if (has_new && (awaiting_response_ == 0 || now >= last_send_ + cycle)) {
    RequestList list;
    list.rank = config_.rank;
    list.requests.swap(outgoing_);
    list.cache_hits.swap(outgoing_hits_);
    awaiting_response_ += static_cast<int>(list.requests.size() + list.cache_hits.size());
    control_->send_to_coordinator(list);
    last_send_ = now;
  }
  const bool drained = table_.empty() || now >= shutdown_deadline_;
  if (shutdown_deadline_ != Clock::time_point{} && drained && !shutdown_sent_) {
    RequestList list;
    list.rank = config_.rank;
    list.shutdown = true;
    control_->send_to_coordinator(list);
    shutdown_sent_ = true;
  }
}

void Engine::Impl::coordinate(Clock::time_point now) {
  if (!outgoing_.empty() || !outgoing_hits_.empty()) {
    RequestList own;
    own.rank = config_.rank;
    own.requests.swap(outgoing_);
    own.cache_hits.swap(outgoing_hits_);
    negotiator_->add(own, now);
    negotiation_dirty_ = true;
  }
  ResponseList list;
  if (negotiation_dirty_) {
    if (timeline_ && config_.timeline_mark_cycles) timeline_->mark_cycle(now);
    list.responses = negotiator_->compute();
    negotiation_dirty_ = false;
  }
  const bool drained = table_.empty() || now >= shutdown_deadline_;
  if (shutdown_deadline_ != Clock::time_point{} && drained) {
    list.shutdown = true;
    list.shutdown_reason = fmt::format("rank 0 ({}) called shutdown()", config_.hostname);
  }
  inspect_stalls(now);
  if (stopped_) return;
  for (const auto& observer : observers_) observer->on_cycle(now, negotiator_->readiness());
  if (list.responses.empty() && !list.shutdown) return;
  if (tuning_to_send_) {
    list.tuned_fusion_threshold = tuning_to_send_->fusion_threshold_bytes;
    list.tuned_cycle_time_ms = tuning_to_send_->cycle_time_ms;
    tuning_to_send_.reset();
  }
  for (int r : control_->broadcast(list))
    log::at(log::Level::kWarning, 0, "could not send responses to rank {}", r);
  process(std::move(list));
}

void Engine::Impl::inspect_stalls(Clock::time_point now) {
  if (config_.stall_check_disable || !negotiator_->has_pending() || now < next_stall_check_) return;
  const double check = config_.stall_check_seconds;
  const double stop = config_.stall_shutdown_seconds;
  auto stalls = negotiator_->stalls(now, stop > 0 ? std::min(check, stop) : check);
  if (!stalls.empty() && now >= next_stall_warning_) {
    log::at(log::Level::kWarning, config_.rank,
            "stalled operations: some ranks submitted them, others have not after {} s "
            "(a rank may be stuck, or ranks submit different names):{}",
            check, controller::describe(stalls));
    next_stall_warning_ = now + seconds_to_ms(check);
  }
  if (stop > 0 && !negotiator_->stalls(now, stop).empty()) {
    fatal(fmt::format("stalled for more than {} s (KRUG_STALL_SHUTDOWN_TIME_SECONDS), stopping "
                      "the job:{}",
                      stop, controller::describe(stalls)),
          true);
    return;
  }
  // Wake often enough to warn once per check period and to stop within a quarter of the limit.
  next_stall_check_ = now + seconds_to_ms(stop > 0 ? std::min(check, std::max(0.25, stop / 4)) : check);
}

void Engine::Impl::on_readable(const std::vector<pollfd>& fds) {
  const auto control_fds = control_->fds();
  // A peer that closed its socket may have written its last lists into the mailbox just before
  // (a coordinator's final responses and shutdown notice, a worker's shutdown): those are read
  // first, and the closed socket counts only when nothing of the peer's is left.
  if (!control_->is_coordinator()) {
    std::string lost;
    for (bool first = true;; first = false) {
      std::optional<ResponseList> list;
      try {
        if (first && !fds.empty() && fds[0].revents) control_->read_socket(0);
      } catch (const net::NetError& e) {
        lost = e.what();
      }
      try {
        list = control_->next_response_list();
      } catch (const net::NetError& e) {
        lost = e.what();
      }
      if (!list) {
        if (!lost.empty())
          fatal(fmt::format("rank {} lost its connection to the coordinator (rank 0 on {}): {}; "
                            "rank 0 probably exited or was killed: see its output",
                            config_.rank, control_->host_of(0), lost),
                false);
        return;
      }
      ++lists_seen_;
      process(std::move(*list));
      if (stopped_) return;
    }
  }
  auto disconnected = [&](int rank, const std::string& why) {
    control_->close_worker(rank);
    fatal(fmt::format("rank {} on {} disconnected from the coordinator ({}): it probably "
                      "exited or was killed; see its output for the cause",
                      rank, control_->host_of(rank), why),
          true);
  };
  std::map<int, std::string> lost;  // ranks whose socket failed, and why
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!fds[i].revents) continue;
    const int rank = static_cast<int>(
        std::find(control_fds.begin(), control_fds.end(), fds[i].fd) - control_fds.begin());
    try {
      control_->read_socket(rank);
    } catch (const net::NetError& e) {
      lost[rank] = e.what();
    }
  }
  const auto now = Clock::now();
  for (int rank = 1; rank < config_.size; ++rank) {
    for (;;) {
      std::optional<RequestList> list;
      try {
        list = control_->next_request_list(rank);
      } catch (const net::NetError& e) {
        lost[rank] = e.what();
      }
      if (!list) {
        if (auto it = lost.find(rank); it != lost.end()) {
          disconnected(rank, it->second);
          return;
        }
        break;
      }
      ++lists_seen_;
      if (!list->fatal_error.empty()) {
        fatal(list->fatal_error, true);
        return;
      }
      if (list->shutdown) {
        ResponseList bye;
        bye.shutdown = true;
        bye.shutdown_reason =
            fmt::format("rank {} ({}) called shutdown()", rank, control_->host_of(rank));
        control_->broadcast(bye);
        process(std::move(bye));
        return;
      }
      negotiator_->add(*list, now);
      negotiation_dirty_ = true;
    }
  }
}

void Engine::Impl::process(ResponseList list) {
  if (!control_->is_coordinator() && list.tuned_cycle_time_ms > 0)
    apply_tuning(list.tuned_fusion_threshold, list.tuned_cycle_time_ms);
  int64_t moved = 0;  // payload bytes executed in this cycle, for the autotuner
  // Expand cached responses first so the timeline can show every name's QUEUE phase: the time
  // between the decision and the start of its collective, behind earlier responses.
  for (auto& r : list.responses) {
    if (r.from_cache) {
      // The allreduce path finds its tensors by id; names only for what shows or needs them.
      cache_.expand(r, /*names=*/false);  // its op is known from here on
      if (timeline_ || r.op != OpType::kAllreduce) cache_.expand(r);
    } else {
      for (size_t i = 0; i < r.cache_ids.size(); ++i)
        if (!cache_.contains(r.cache_ids[i]))
          cache_.insert(r.cache_ids[i], controller::cache_form(r, i));
    }
    for (const auto& name : r.names) {
      if (!timeline_ || !table_.count(controller::table_key(r.process_set, name))) continue;
      timeline_end(name, "NEGOTIATE_" + upper(controller::op_name(r.op)));
      timeline_begin(name, "QUEUE");
    }
  }
  for (auto& r : list.responses) {
    for (const auto& name : r.names)
      if (timeline_ && table_.count(controller::table_key(r.process_set, name)))
        timeline_end(name, "QUEUE");
    if (r.type == ResponseType::kError) {
      fail_names(r, r.error);
      continue;
    }
    try {
      execute(r);
      if (autotuner_) {
        if (r.names.empty())
          for (uint32_t id : r.cache_ids)
            moved += cache_.elements(id) * static_cast<int64_t>(dtype_size(r.dtype));
        else
          moved += controller::response_bytes(r);
      }
    } catch (const std::exception& e) {
      std::string message = root_cause(fmt::format(
          "{} of [{}] (process set {}) failed on rank {} ({}): {}", controller::op_name(r.op),
          fmt::join(names_of(r), ", "), r.process_set, config_.rank, config_.hostname, e.what()));
      fail_names(r, message);
      fatal(message, true);
      return;
    }
    if (stopped_) return;
  }
  if (autotuner_ && moved > 0)
    if (auto tuned = autotuner_->observe(moved, Clock::now())) {
      apply_tuning(tuned->fusion_threshold_bytes, tuned->cycle_time_ms);
      tuning_to_send_ = *tuned;
    }
  if (list.shutdown) {
    std::string reason = list.fatal ? list.shutdown_reason
                                    : fmt::format("krug was shut down: {}", list.shutdown_reason);
    fatal(reason, false, list.fatal);
  }
}

void Engine::Impl::fail_names(const Response& r, const std::string& error) {
  for (const auto& name : names_of(r)) {
    auto key = controller::table_key(r.process_set, name);
    if (table_.count(key)) finish(key, error);
  }
}

std::vector<std::string> Engine::Impl::names_of(const Response& r) const {
  if (!r.names.empty() || r.cache_ids.empty()) return r.names;
  std::vector<std::string> names;
  for (uint32_t id : r.cache_ids) names.push_back(cache_.at(id).name);
  return names;
}

Engine::Impl::TableSlot* Engine::Impl::slot_for_id(uint32_t id) {
  if (id < by_id_.size() && by_id_[id]) return by_id_[id];
  // Sent as a full request (its entry was made after this rank had looked), or not here at all
  // (a joined rank).
  const Request& q = cache_.at(id);
  auto it = table_.find(controller::table_key(q.process_set, q.name));
  return it == table_.end() ? nullptr : &*it;
}

void Engine::Impl::finish_slots(std::span<TableSlot* const> slots, const std::string& error) {
  finished_.clear();
  for (TableSlot* slot : slots) {
    if (!slot) continue;
    if (slot->second.cache_id >= 0) by_id_[static_cast<size_t>(slot->second.cache_id)] = nullptr;
    finished_.push_back(table_.extract(slot->first));
  }
  awaiting_response_ = std::max(0, awaiting_response_ - static_cast<int>(finished_.size()));
  for (auto& node : finished_) {
    finished_handles_.push_back(std::move(node.mapped().handle));
    if (!error.empty()) finished_names_.push_back(node.mapped().args.request.name);
    node.mapped().args.ready = nullptr;
    node.mapped().args.allocate_output = nullptr;  // may hold a framework's state
  }
  {
    // Before the handles complete: a thread woken by one may submit the same name at once.
    std::lock_guard lock(mu_);
    for (auto& node : finished_) {
      KeySet::node_type key = in_flight_keys_.extract(node.key());
      if (key && spare_keys_.size() < kMaxSpareNodes) spare_keys_.push_back(std::move(key));
      if (spare_entries_.size() < kMaxSpareNodes) spare_entries_.push_back(std::move(node));
    }
  }
  finished_.clear();  // what did not fit among the spares
  for (size_t i = 0; i < finished_handles_.size(); ++i)
    finished_handles_[i]->complete_part(error, error.empty() ? "" : finished_names_[i]);
  finished_handles_.clear();
  finished_names_.clear();
}

void Engine::Impl::finish(const std::string& key, const std::string& error) {
  auto it = table_.find(key);
  if (it == table_.end()) return;
  TableSlot* slot = &*it;
  finish_slots({&slot, 1}, error);
}

void Engine::Impl::execute(const Response& r) {
  switch (r.op) {
    case OpType::kAddProcessSet:
      add_process_set(r.process_set, r.set_ranks);
      for (const auto& name : r.names) {
        auto key = controller::table_key(0, name);
        if (auto it = table_.find(key); it != table_.end()) it->second.handle->result().value = r.process_set;
        finish(key);
      }
      return;
    case OpType::kRemoveProcessSet:
      sets_.erase(r.root);
      {
        std::lock_guard lock(mu_);
        set_ranks_.erase(r.root);
        set_allreduce_.erase(r.root);
      }
      for (const auto& name : r.names) finish(controller::table_key(0, name));
      return;
    case OpType::kJoin: {
      auto key = controller::table_key(0, "__join");
      if (auto it = table_.find(key); it != table_.end())
        it->second.handle->result().value = r.last_joined_rank;
      finish(key);
      return;
    }
    case OpType::kBarrier:
      // Negotiation itself synchronized the ranks: the response exists only once all arrived.
      for (const auto& name : r.names) finish(controller::table_key(r.process_set, name));
      return;
    default:
      break;
  }
  auto set_it = sets_.find(r.process_set);
  if (set_it == sets_.end() || set_it->second.my_index < 0) return;
  ProcessSetState& set = set_it->second;
  if (r.op == OpType::kAllreduce) return run_allreduce(r, set);
  auto key = controller::table_key(r.process_set, r.names.at(0));
  auto it = table_.find(key);
  if (it == table_.end())
    throw Error(fmt::format("no local tensor for {} '{}' (only allreduce runs on joined ranks)",
                            controller::op_name(r.op), r.names[0]));
  wait_ready(it->second.args);
  const std::string phase = upper(controller::op_name(r.op));
  timeline_begin(r.names[0], phase);
  switch (r.op) {
    case OpType::kAllgather: run_allgather(r, set, it->second); break;
    case OpType::kBroadcast: run_broadcast(r, set, it->second); break;
    case OpType::kAlltoall: run_alltoall(r, set, it->second); break;
    case OpType::kReducescatter: run_reducescatter(r, set, it->second); break;
    default: throw Error(fmt::format("unexpected op {}", controller::op_name(r.op)));
  }
  timeline_end(r.names[0], phase);
  finish(key);
}

void Engine::Impl::run_allreduce(const Response& r, ProcessSetState& set) {
  // A response from the cache carries ids only (its names are expanded only for the timeline).
  const bool by_id = r.names.empty();
  const size_t n = by_id ? r.cache_ids.size() : r.names.size();
  auto& slots = allreduce_slots_;  // null: no tensor here (a joined rank contributes zeros)
  auto& tensors = allreduce_tensors_;
  slots.assign(n, nullptr);
  tensors.assign(n, FusedTensor{});
  for (size_t i = 0; i < n; ++i) {
    if (by_id) {
      slots[i] = slot_for_id(r.cache_ids[i]);
      tensors[i].count = static_cast<size_t>(cache_.elements(r.cache_ids[i]));
    } else {
      auto it = table_.find(controller::table_key(r.process_set, r.names[i]));
      slots[i] = it == table_.end() ? nullptr : &*it;
      tensors[i].count = static_cast<size_t>(elements(r.shapes[i]));
    }
    if (slots[i]) {
      wait_ready(slots[i]->second.args);
      tensors[i].args = &slots[i]->second.args;
    }
    if (!r.names.empty()) tensors[i].name = &r.names[i];
  }
  if (r.reduce_op == ReduceOp::kAdasum) {
    // The coordinator rejects these already; every rank reaches the same verdict without
    // talking to the others, so failing the names here leaves the engine running.
    std::string why = collectives::adasum_unsupported(r.dtype, static_cast<int>(set.ranks.size()),
                                                      r.process_set);
    if (!why.empty()) {
      fail_names(r, fmt::format("allreduce of [{}]: {}", fmt::join(names_of(r), ", "), why));
      return;
    }
  }
  executor_.allreduce(*set.comm, reduction(r), tensors);
  finish_slots(slots);
}

void Engine::Impl::run_allgather(const Response& r, ProcessSetState& set, LocalEntry& e) {
  executor_.allgather(*set.comm, r.dtype, r.rank_dims, e.args, e.handle->result());
}

void Engine::Impl::run_broadcast(const Response& r, ProcessSetState& set, LocalEntry& e) {
  executor_.broadcast(*set.comm, r.dtype, r.shapes[0], r.root, e.args);
}

void Engine::Impl::run_alltoall(const Response& r, ProcessSetState& set, LocalEntry& e) {
  executor_.alltoall(*set.comm, r.dtype, r.rank_dims, e.args, e.handle->result());
}

void Engine::Impl::run_reducescatter(const Response& r, ProcessSetState& set, LocalEntry& e) {
  executor_.reducescatter(*set.comm, reduction(r), e.args, e.handle->result());
}

std::string Engine::Impl::root_cause(const std::string& local_error) {
  // A failed collective is usually the echo of a peer dying. Give the control plane a moment to
  // report which peer, so every rank shows the first cause instead of "connection reset".
  const auto until = Clock::now() + std::chrono::milliseconds(1500);
  if (!control_) return local_error;
  const auto fds = control_->fds();
  const bool coordinator = control_->is_coordinator();
  std::vector<pollfd> pfds;
  std::vector<int> peers;  // of each pfds entry
  for (size_t i = 0; i < fds.size(); ++i)
    if (fds[i] >= 0) {
      pfds.push_back({fds[i], POLLIN, 0});
      peers.push_back(coordinator ? static_cast<int>(i) : 0);
    }
  // Lists in mailboxes ring no doorbell for a rank that does not sleep: look at them often.
  const int slice_ms = control_->uses_mailboxes() ? 5 : 100;
  while (!pfds.empty() && Clock::now() < until) {
    for (auto& p : pfds) p.revents = 0;
    ::poll(pfds.data(), pfds.size(), slice_ms);
    for (size_t j = 0; j < pfds.size(); ++j) {
      const int peer = peers[j];
      try {
        if (pfds[j].revents) control_->read_socket(peer);
        if (!coordinator) {
          while (auto list = control_->next_response_list())
            if (list->shutdown && list->fatal) return list->shutdown_reason;
        } else {
          while (auto list = control_->next_request_list(peer))
            if (!list->fatal_error.empty()) return list->fatal_error;
        }
      } catch (const std::exception&) {
        if (!coordinator) return local_error;  // the coordinator itself is gone; this says enough
        control_->close_worker(peer);
        return fmt::format("rank {} on {} exited or lost its connection (first failure seen); "
                           "on rank 0 this surfaced as: {}",
                           peer, control_->host_of(peer), local_error);
      }
    }
  }
  return local_error;
}

void Engine::Impl::fatal(std::string message, bool tell_peers, bool is_error) {
  if (stopped_) return;
  if (is_error) log::at(log::Level::kError, config_.rank, "{}", message);
  if (tell_peers) {
    try {
      if (control_->is_coordinator()) {
        ResponseList bye;
        bye.shutdown = true;
        bye.fatal = true;
        bye.shutdown_reason = message;
        control_->broadcast(bye);
      } else {
        RequestList report;
        report.rank = config_.rank;
        report.fatal_error = message;
        control_->send_to_coordinator(report);
      }
    } catch (const std::exception&) {
      // Peers will notice the closed connection instead.
    }
  }
  std::vector<Table::node_type> queued;
  {
    std::lock_guard lock(mu_);
    failure_ = message;
    queued.swap(queue_);
    in_flight_keys_.clear();
  }
  for (auto& node : queued)
    node.mapped().handle->complete_part(message, node.mapped().args.request.name);
  for (auto& [key, e] : table_) e.handle->complete_part(message, e.args.request.name);
  table_.clear();
  by_id_.clear();
  stopped_ = true;
}

void Engine::Impl::timeline_begin(const std::string& name, std::string_view phase) {
  if (timeline_) timeline_->begin(name, phase, Clock::now());
}

void Engine::Impl::timeline_end(const std::string& name, std::string_view phase) {
  if (timeline_) timeline_->end(name, phase, Clock::now());
}

Engine::Engine(const Config& config, std::shared_ptr<rendezvous::Store> store,
               std::vector<std::shared_ptr<CycleObserver>> observers)
    : impl_(std::make_shared<Impl>(config, std::move(store), std::move(observers))) {}
// A thread still driving a handle keeps the rest of Impl alive until it returns.
Engine::~Engine() { impl_->shutdown(); }
void Engine::shutdown() { impl_->shutdown(); }
void Engine::abort(const std::string& reason) {
  impl_->abort(reason);
}
std::shared_ptr<HandleState> Engine::enqueue(std::vector<TensorArgs> tensors) {
  return impl_->enqueue(tensors);
}
std::shared_ptr<HandleState> Engine::enqueue(TensorArgs tensor) {
  return impl_->enqueue({&tensor, 1});
}
std::shared_ptr<HandleState> Engine::enqueue(const TensorView& tensor) {
  return impl_->enqueue(tensor);
}
const Config& Engine::config() const { return impl_->config(); }
int Engine::rank() const { return impl_->config().rank; }
int Engine::size() const { return impl_->config().size; }
std::vector<int32_t> Engine::process_set_ranks(int32_t id) const {
  return impl_->process_set_ranks(id);
}
std::string Engine::allreduce_algorithm(int32_t id) const { return impl_->allreduce_algorithm(id); }
std::pair<int64_t, double> Engine::tuned_parameters() const { return impl_->tuned_parameters(); }

}  // namespace krug::engine
