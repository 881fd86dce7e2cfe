// krug's TensorFlow kernels (CPU): asynchronous kernels that describe their tensors as views
// and enqueue them through the frontend seam (krug/frontend.h), the only part of the core they
// use. In a graph a kernel returns at once; the seam's done callback completes it on krug's
// thread, as Horovod's kernels are completed by its background thread. Eagerly, TensorFlow
// waits on the calling thread anyway: the kernel waits there itself, running krug's loop. Results
// whose size negotiation decides are allocated as the kernel's outputs by the seam's allocate
// callback, so no result passes through an intermediate buffer.
//
// Errors: what can never work (krug not initialized, bad splits) fails the kernel at once with
// InvalidArgument; what the engine refuses at submission too (Status kRejected); what fails
// later (mismatched shapes across ranks, a dead peer) with Unknown, as Horovod's kernels do, so
// that elastic code recognizes it. The message is krug's.
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "krug/binding_rules.h"
#include "krug/frontend.h"
#include "krug/krug.h"
#include "krug/types.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace {

namespace tf = tensorflow;
namespace fe = krug::frontend;
using krug::DataType;

std::optional<DataType> krug_dtype(tf::DataType t) {
  switch (t) {
    case tf::DT_UINT8:
      return DataType::kUInt8;
    case tf::DT_INT8:
      return DataType::kInt8;
    case tf::DT_INT16:
      return DataType::kInt16;
    case tf::DT_INT32:
      return DataType::kInt32;
    case tf::DT_INT64:
      return DataType::kInt64;
    case tf::DT_HALF:
      return DataType::kFloat16;
    case tf::DT_BFLOAT16:
      return DataType::kBFloat16;
    case tf::DT_FLOAT:
      return DataType::kFloat32;
    case tf::DT_DOUBLE:
      return DataType::kFloat64;
    case tf::DT_BOOL:
      return DataType::kBool;
    case tf::DT_UINT16:
      return DataType::kUInt16;
    case tf::DT_UINT32:
      return DataType::kUInt32;
    case tf::DT_UINT64:
      return DataType::kUInt64;
    default:
      return std::nullopt;
  }
}

tf::TensorShape tf_shape(const krug::Shape& shape) {
  tf::TensorShape s;
  for (int64_t d : shape) s.AddDim(d);
  return s;
}

// The done callback of a kernel that completes on the calling thread.
void nothing() {}

// One running operation: what it reads and writes stays alive here until it completes. It
// completes when both the seam's done callback has run and enqueue has returned the handle
// (either may come first), so that results read from the handle (alltoall's received splits,
// join's rank) are there. With `caller_waits` there is no done callback: the kernel's thread
// waits for the handle and completes the operation through wait_and_finish.
class Pending {
 public:
  Pending(tf::OpKernelContext* ctx, tf::AsyncOpKernel::DoneCallback done, bool caller_waits)
      : ctx_(ctx), done_(std::move(done)), caller_waits_(caller_waits) {}

  // Called on success, before the kernel's done, with the handle (for results it holds).
  std::function<void(const fe::Handle&)> on_success;

  // The view of `t`; its shape lives here (inputs are added before enqueue, never after).
  fe::TensorView view(const tf::Tensor& t) {
    keep_.push_back(t);
    const auto dims = t.shape().dim_sizes();
    shapes_.emplace_back(dims.begin(), dims.end());
    return fe::TensorView{.dtype = *krug_dtype(t.dtype()),
                          .shape = {shapes_.back().data(), shapes_.back().size()},
                          .data = t.tensor_data().data()};
  }
  void reserve(size_t n) {
    keep_.reserve(n);
    shapes_.reserve(n);
  }
  // Keeps an output alive while the engine writes it.
  void keep(const tf::Tensor& t) { keep_.push_back(t); }

  // Alltoall: the splits of this operation (the seam borrows them until it completes).
  std::vector<int64_t> splits;

  // The seam's callbacks for this operation; `sized_later`: outputs are allocated as the
  // kernel's outputs when negotiation has decided their shapes.
  fe::Callbacks callbacks(const std::shared_ptr<Pending>& self, bool sized_later) {
    fe::Callbacks c;
    // Without a done callback an allreduce or broadcast takes the seam's allocation-free path,
    // and the seam does not wake krug's background thread for it: the waiting caller drives.
    if (!caller_waits_) c.done = [self](const fe::Status& s) { self->status_arrived(s); };
    if (sized_later) {
      // Weak: the engine's entry must not keep the operation alive on its own.
      std::weak_ptr<Pending> weak = self;
      c.allocate = [weak](size_t i, const krug::Shape& shape) -> void* {
        auto p = weak.lock();
        if (!p) throw krug::Error("the TensorFlow kernel ended while its operation ran");
        tf::Tensor* out = nullptr;
        absl::Status s = p->ctx_->allocate_output(static_cast<int>(i), tf_shape(shape), &out);
        if (!s.ok())
          throw krug::Error(fmt::format("TensorFlow cannot allocate the output: {}", s.message()));
        void* data = const_cast<char*>(out->tensor_data().data());
        return data != nullptr ? data : &p->empty_room_;  // zero elements: any valid address
      };
    }
    return c;
  }

  void handle_arrived(fe::Handle handle) {
    std::unique_lock lock(mu_);
    handle_ = std::move(handle);
    have_handle_ = true;
    if (status_) finish(lock);
  }

  // caller_waits: blocks until the operation ends, running krug's loop on this thread meanwhile
  // (Handle::wait_for drives it as krug.torch's synchronize does), then completes the kernel.
  // The engine ends every operation within its timeouts, as it fails them on a lost peer.
  void wait_and_finish(fe::Handle handle) {
    while (!handle.wait_for(std::chrono::seconds(1))) continue;
    const fe::Status s = handle.status();
    handle_arrived(std::move(handle));
    status_arrived(s);
  }

 private:
  void status_arrived(const fe::Status& s) {
    std::unique_lock lock(mu_);
    status_ = s;
    if (have_handle_) finish(lock);
  }

  // With mu_ held; both halves are there. Runs once.
  void finish(std::unique_lock<std::mutex>& lock) {
    fe::Handle handle = std::move(handle_);  // breaks the cycle handle -> callback -> this
    fe::Status s = std::move(*status_);
    lock.unlock();
    if (s.ok()) {
      if (on_success) on_success(handle);
    } else if (s.code == fe::Status::Code::kRejected) {
      ctx_->SetStatus(absl::InvalidArgumentError(s.message));
    } else if (s.code == fe::Status::Code::kPrecondition) {
      ctx_->SetStatus(absl::FailedPreconditionError(s.message));  // Horovod's code for it
    } else {
      ctx_->SetStatus(absl::UnknownError(s.message));
    }
    auto done = std::move(done_);
    keep_.clear();
    done();
  }

  tf::OpKernelContext* ctx_;
  tf::AsyncOpKernel::DoneCallback done_;
  const bool caller_waits_;
  std::vector<tf::Tensor> keep_;
  std::vector<std::vector<int64_t>> shapes_;
  std::mutex mu_;
  fe::Handle handle_;
  bool have_handle_ = false;
  std::optional<fe::Status> status_;
  char empty_room_ = 0;
};

// What every collective kernel shares: its name and process set from the node and attrs, the
// dtype check, and enqueueing with error handling.
class CollectiveKernel : public tf::AsyncOpKernel {
 public:
  explicit CollectiveKernel(tf::OpKernelConstruction* c) : AsyncOpKernel(c) {
    bool ignore_name_scope = false;
    OP_REQUIRES_OK(c, c->GetAttr("ignore_name_scope", &ignore_name_scope));
    int64_t set = 0;
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &set));
    process_set_ = krug::ProcessSet{static_cast<int32_t>(set)};
    name_ = name();
    if (ignore_name_scope) {
      const auto slash = name_.find_last_of('/');
      if (slash != std::string::npos) name_ = name_.substr(slash + 1);
    }
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    Start(ctx, std::move(done), /*caller_waits=*/false);
  }

  // TensorFlow calls Compute rather than ComputeAsync where it blocks the calling thread until
  // the kernel is done anyway: eager execution runs the op on the Python thread and waits there.
  // That thread then runs krug's loop itself, as krug.torch's synchronize does, instead of
  // waking krug's background thread to start the operation and being woken by it at the end:
  // two scheduler hand-offs, each tens to hundreds of µs on a loaded machine. (Graphs run
  // collectives through ComputeAsync on TensorFlow's inter-op threads: those never block.)
  void Compute(tf::OpKernelContext* ctx) override { Start(ctx, nothing, /*caller_waits=*/true); }

 private:
  void Start(tf::OpKernelContext* ctx, DoneCallback done, bool caller_waits) {
    if (!krug::is_initialized()) {
      ctx->SetStatus(absl::FailedPreconditionError(fmt::format(
          "krug has not been initialized; call hvd.init() before {} '{}'", type_string(), name_)));
      done();
      return;
    }
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      if (!krug_dtype(ctx->input(i).dtype())) {
        ctx->SetStatus(absl::InvalidArgumentError("krug does not support tensors of dtype " +
                                                  tf::DataTypeString(ctx->input(i).dtype())));
        done();
        return;
      }
    }
    auto p = std::make_shared<Pending>(ctx, done, caller_waits);
    fe::Handle handle;
    try {
      handle = Enqueue(ctx, p);
    } catch (const std::exception& e) {
      // Nothing was enqueued (an argument that can never work): done was not called.
      ctx->SetStatus(absl::InvalidArgumentError(e.what()));
      done();
      return;
    }
    if (caller_waits)
      p->wait_and_finish(std::move(handle));
    else
      p->handle_arrived(std::move(handle));
  }

 protected:
  // Enqueues the operation with p's views and callbacks; returns its handle.
  virtual fe::Handle Enqueue(tf::OpKernelContext* ctx, const std::shared_ptr<Pending>& p) = 0;

  const std::string& op_name() const { return name_; }
  krug::ProcessSet process_set() const { return process_set_; }

  // Enqueues an op whose outputs negotiation sizes (allgather, reducescatter; one tensor, or a
  // group): each input is split or concatenated along its first dimension, so it needs one.
  fe::Handle EnqueueSizedLater(tf::OpKernelContext* ctx, const std::shared_ptr<Pending>& p,
                               const fe::Op& op, bool grouped) {
    const int n = ctx->num_inputs();
    p->reserve(n);
    std::vector<fe::TensorView> inputs;
    for (int i = 0; i < n; ++i) {
      if (ctx->input(i).dims() == 0)
        throw krug::InvalidArgument(fmt::format(
            "{} '{}': the tensor must have at least one dimension (it is {} along the first)",
            fe::op_name(op.type), op_name(),
            op.type == fe::OpType::kAllgather ? "concatenated" : "split"));
      inputs.push_back(p->view(ctx->input(i)));
    }
    if (!grouped) return fe::enqueue(op_name(), op, inputs[0], nullptr, p->callbacks(p, true));
    return fe::enqueue_group(op_name(), op, inputs, {}, p->callbacks(p, true));
  }

 private:
  std::string name_;
  krug::ProcessSet process_set_;
};

// Allreduce and reducescatter: the reduction, its scale factors and process set.
class ReducingKernel : public CollectiveKernel {
 public:
  ReducingKernel(tf::OpKernelConstruction* c, fe::OpType type) : CollectiveKernel(c) {
    int64_t op = 0;
    float prescale = 1.0f;
    float postscale = 1.0f;
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &op));
    OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &prescale));
    OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &postscale));
    op_ = fe::Op{.type = type,
                 .process_set = process_set(),
                 .reduce_op = static_cast<krug::ReduceOp>(op),
                 .prescale = prescale,
                 .postscale = postscale};
  }

 protected:
  fe::Op op_;
};

class AllreduceKernel : public ReducingKernel {
 public:
  explicit AllreduceKernel(tf::OpKernelConstruction* c)
      : ReducingKernel(c, fe::OpType::kAllreduce) {}

 protected:
  fe::Handle Enqueue(tf::OpKernelContext* ctx, const std::shared_ptr<Pending>& p) override {
    const int n = ctx->num_inputs();
    p->reserve(2 * n);
    std::vector<fe::TensorView> inputs;
    std::vector<void*> outputs;
    for (int i = 0; i < n; ++i) {
      tf::Tensor* out = nullptr;
      auto s = ctx->forward_input_or_allocate_output({i}, i, ctx->input(i).shape(), &out);
      if (!s.ok()) throw krug::Error(std::string(s.message()));
      inputs.push_back(p->view(ctx->input(i)));
      outputs.push_back(const_cast<char*>(out->tensor_data().data()));
      p->keep(*out);
    }
    if (n == 1 && !grouped_)
      return fe::enqueue(op_name(), op_, inputs[0], outputs[0], p->callbacks(p, false));
    return fe::enqueue_group(op_name(), op_, inputs, outputs, p->callbacks(p, false));
  }

  bool grouped_ = false;
};

class GroupedAllreduceKernel : public AllreduceKernel {
 public:
  explicit GroupedAllreduceKernel(tf::OpKernelConstruction* c) : AllreduceKernel(c) {
    grouped_ = true;
  }
};

// Ops whose outputs negotiation sizes: allgather, reducescatter and their grouped forms.
class SizedLaterKernel : public CollectiveKernel {
 public:
  SizedLaterKernel(tf::OpKernelConstruction* c, fe::Op op, bool grouped)
      : CollectiveKernel(c), op_(op), grouped_(grouped) {
    op_.process_set = process_set();
  }

 protected:
  fe::Handle Enqueue(tf::OpKernelContext* ctx, const std::shared_ptr<Pending>& p) override {
    return EnqueueSizedLater(ctx, p, op_, grouped_);
  }

  fe::Op op_;
  bool grouped_;
};

class AllgatherKernel : public SizedLaterKernel {
 public:
  explicit AllgatherKernel(tf::OpKernelConstruction* c)
      : SizedLaterKernel(c, fe::Op{.type = fe::OpType::kAllgather}, false) {}
};
class GroupedAllgatherKernel : public SizedLaterKernel {
 public:
  explicit GroupedAllgatherKernel(tf::OpKernelConstruction* c)
      : SizedLaterKernel(c, fe::Op{.type = fe::OpType::kAllgather}, true) {}
};

// Reducescatter reads the reduction attributes like allreduce.
template <bool kGrouped>
class ReducescatterKernel : public ReducingKernel {
 public:
  explicit ReducescatterKernel(tf::OpKernelConstruction* c)
      : ReducingKernel(c, fe::OpType::kReducescatter) {}

 protected:
  fe::Handle Enqueue(tf::OpKernelContext* ctx, const std::shared_ptr<Pending>& p) override {
    return EnqueueSizedLater(ctx, p, op_, kGrouped);
  }
};

class BroadcastKernel : public CollectiveKernel {
 public:
  explicit BroadcastKernel(tf::OpKernelConstruction* c) : CollectiveKernel(c) {
    int64_t root = 0;
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root));
    root_ = static_cast<int32_t>(root);
  }

 protected:
  fe::Handle Enqueue(tf::OpKernelContext* ctx, const std::shared_ptr<Pending>& p) override {
    // In place on the output: every rank starts from its own input, the root's wins.
    const tf::Tensor& input = ctx->input(0);
    tf::Tensor* out = nullptr;
    auto s = ctx->allocate_output(0, input.shape(), &out);
    if (!s.ok()) throw krug::Error(std::string(s.message()));
    const auto bytes = input.tensor_data();
    if (!bytes.empty())
      std::memcpy(const_cast<char*>(out->tensor_data().data()), bytes.data(), bytes.size());
    p->reserve(1);
    fe::TensorView view = p->view(*out);
    const fe::Op op{.type = fe::OpType::kBroadcast, .process_set = process_set(), .root = root_};
    return fe::enqueue(op_name(), op, view, const_cast<void*>(view.data), p->callbacks(p, false));
  }

 private:
  int32_t root_ = 0;
};

class AlltoallKernel : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;

 protected:
  fe::Handle Enqueue(tf::OpKernelContext* ctx, const std::shared_ptr<Pending>& p) override {
    const tf::Tensor& input = ctx->input(0);
    const tf::Tensor& splits = ctx->input(1);
    if (input.dims() == 0)
      throw krug::InvalidArgument(
          fmt::format("alltoall '{}': the tensor must have at least one dimension", op_name()));
    if (splits.dims() != 1)
      throw krug::InvalidArgument(
          fmt::format("alltoall '{}': splits must be a vector, got shape {}", op_name(),
                      splits.shape().DebugString()));
    const auto s = splits.vec<int32_t>();
    p->splits.assign(s.data(), s.data() + s.size());
    krug::check_alltoall_splits(p->splits, input.dim_size(0), process_set());
    p->reserve(1);
    fe::TensorView view = p->view(input);
    const fe::Op op{
        .type = fe::OpType::kAlltoall, .process_set = process_set(), .splits = p->splits};
    p->on_success = [ctx](const fe::Handle& h) {
      const auto& received = h.received_splits();
      tf::Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(
                              1, tf::TensorShape({static_cast<int64_t>(received.size())}), &out));
      auto v = out->vec<int32_t>();
      for (size_t i = 0; i < received.size(); ++i) v(i) = static_cast<int32_t>(received[i]);
    };
    return fe::enqueue(op_name(), op, view, nullptr, p->callbacks(p, true));
  }
};

class JoinKernel : public tf::AsyncOpKernel {
 public:
  using AsyncOpKernel::AsyncOpKernel;

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    if (!krug::is_initialized()) {
      ctx->SetStatus(absl::FailedPreconditionError(
          "krug has not been initialized; call hvd.init() before join"));
      done();
      return;
    }
    auto p = std::make_shared<Pending>(ctx, done, /*caller_waits=*/false);
    p->on_success = [ctx](const fe::Handle& h) {
      tf::Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &out));
      out->scalar<int32_t>()() = static_cast<int32_t>(h.value());
    };
    p->handle_arrived(fe::join(p->callbacks(p, false)));
  }
};

// Topology as ops.
enum class Topology { kSize, kRank, kLocalSize, kLocalRank, kIncluded };

template <Topology kWhat>
class TopologyKernel : public tf::OpKernel {
 public:
  explicit TopologyKernel(tf::OpKernelConstruction* c) : OpKernel(c) {
    int64_t set = 0;
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &set));
    set_ = krug::ProcessSet{static_cast<int32_t>(set)};
  }

  void Compute(tf::OpKernelContext* ctx) override {
    OP_REQUIRES(ctx, krug::is_initialized(),
                absl::FailedPreconditionError(
                    "krug has not been initialized; call hvd.init() before " + type_string()));
    int value = 0;
    try {
      value = compute();
    } catch (const std::exception& e) {
      ctx->SetStatus(absl::InvalidArgumentError(e.what()));
      return;
    }
    tf::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &out));
    out->scalar<int32_t>()() = value;
  }

 private:
  int compute() const {
    if constexpr (kWhat == Topology::kLocalSize || kWhat == Topology::kLocalRank) {
      if (set_ != krug::kGlobalProcessSet)
        throw krug::InvalidArgument(
            "local_size and local_rank are defined for the global "
            "process set only");
      return kWhat == Topology::kLocalSize ? krug::local_size() : krug::local_rank();
    }
    const std::vector<int> ranks = krug::process_set_ranks(set_);
    if constexpr (kWhat == Topology::kSize) return static_cast<int>(ranks.size());
    const int me = krug::rank();
    for (size_t i = 0; i < ranks.size(); ++i)
      if (ranks[i] == me) return kWhat == Topology::kRank ? static_cast<int>(i) : 1;
    return kWhat == Topology::kRank ? -1 : 0;
  }

  krug::ProcessSet set_;
};

}  // namespace

namespace tensorflow {

REGISTER_KERNEL_BUILDER(Name("KrugAllreduce").Device(DEVICE_CPU), AllreduceKernel);
REGISTER_KERNEL_BUILDER(Name("KrugGroupedAllreduce").Device(DEVICE_CPU), GroupedAllreduceKernel);
REGISTER_KERNEL_BUILDER(Name("KrugAllgather").Device(DEVICE_CPU), AllgatherKernel);
REGISTER_KERNEL_BUILDER(Name("KrugGroupedAllgather").Device(DEVICE_CPU), GroupedAllgatherKernel);
REGISTER_KERNEL_BUILDER(Name("KrugBroadcast").Device(DEVICE_CPU), BroadcastKernel);
REGISTER_KERNEL_BUILDER(Name("KrugAlltoall").Device(DEVICE_CPU), AlltoallKernel);
REGISTER_KERNEL_BUILDER(Name("KrugReducescatter").Device(DEVICE_CPU), ReducescatterKernel<false>);
REGISTER_KERNEL_BUILDER(Name("KrugGroupedReducescatter").Device(DEVICE_CPU),
                        ReducescatterKernel<true>);
REGISTER_KERNEL_BUILDER(Name("KrugJoin").Device(DEVICE_CPU), JoinKernel);
REGISTER_KERNEL_BUILDER(Name("KrugSize").Device(DEVICE_CPU), TopologyKernel<Topology::kSize>);
REGISTER_KERNEL_BUILDER(Name("KrugRank").Device(DEVICE_CPU), TopologyKernel<Topology::kRank>);
REGISTER_KERNEL_BUILDER(Name("KrugLocalSize").Device(DEVICE_CPU),
                        TopologyKernel<Topology::kLocalSize>);
REGISTER_KERNEL_BUILDER(Name("KrugLocalRank").Device(DEVICE_CPU),
                        TopologyKernel<Topology::kLocalRank>);
REGISTER_KERNEL_BUILDER(Name("KrugProcessSetIncluded").Device(DEVICE_CPU),
                        TopologyKernel<Topology::kIncluded>);

}  // namespace tensorflow
