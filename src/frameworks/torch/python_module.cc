// krug.torch._torch_core: the pybind11 module under python/krug/torch/mpi_ops.py. It exposes the
// torch adapter (adapter.h) and krug's lifecycle and process-set calls; Horovod's API (names,
// defaults, autograd, handle maps) is built in Python on top of it.
//
// Exceptions: krug::Error becomes krug.common.exceptions.HorovodInternalError (a RuntimeError),
// krug::InvalidArgument, torch_adapter::UnsupportedTensor among them (a bad argument found before
// enqueueing), becomes ValueError.
// Every call that may block releases the GIL and runs Python's signal handlers every 50 ms; a
// handler's exception (Ctrl-C) ends the wait and stops krug on this rank, telling the others.
#include <fmt/format.h>
#include <torch/extension.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "frameworks/python/basics.h"
#include "frameworks/python/interruptible.h"
#include "frameworks/torch/adapter.h"
#include "krug/binding_rules.h"
#include "krug/elastic.h"
#include "krug/frontend.h"
#include "krug/krug.h"
#include "krug/types.h"

namespace py = pybind11;
namespace ta = krug::torch_adapter;
using krug::python::wait_interruptibly;

namespace {

krug::ReduceOptions reduce_options(int op, double prescale, double postscale, int process_set) {
  krug::ReduceOptions o;
  o.op = static_cast<krug::ReduceOp>(op);
  o.prescale_factor = prescale;
  o.postscale_factor = postscale;
  o.process_set = krug::ProcessSet{process_set};
  return o;
}

krug::ProcessSet ps(int id) {
  return krug::ProcessSet{id};
}

// Horovod's handles are integers. This table maps them to the operations, so that the per-call
// path (allreduce_async, synchronize) creates no Python object for a handle. One table per
// krug.torch module (it owns it), shared by its threads.
//
// Slots are reused through a free list (a step's handles allocate nothing). An id is a slot and
// the slot's generation, which each reuse bumps: an id already synchronized finds nothing,
// however often its slot has been reused since.
class HandleTable {
 public:
  int64_t add(ta::HandlePtr h) {
    std::lock_guard lock(mu_);
    uint32_t index;
    if (free_.empty()) {
      index = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    } else {
      index = free_.back();
      free_.pop_back();
    }
    Slot& slot = slots_[index];
    slot.handle = std::move(h);
    return static_cast<int64_t>(slot.generation) << 32 | index;
  }

  bool poll(int64_t id) { return find(id)->poll(); }

  // Waits for the operation, removes it, raises on failure. Returns its first output with
  // `first_output`, else the core handle (for results read from it); None for an unknown id.
  py::object synchronize(int64_t id, bool first_output) {
    ta::HandlePtr h;
    {
      std::lock_guard lock(mu_);
      Slot* slot = slot_of(id);
      if (!slot) return py::none();
      h = std::move(slot->handle);
      release(static_cast<uint32_t>(id));
    }
    // An operation already done (most of a step's handles) costs no GIL hand-off at all.
    if (!h->poll())
      wait_interruptibly(
          [&](std::chrono::duration<double> interval) {
            return h->wait_for(std::chrono::ceil<std::chrono::nanoseconds>(interval));
          },
          "synchronize");
    h->wait();  // done: returns at once (copies back into non-contiguous targets)
    if (first_output) return py::cast(h->output(0));
    return py::cast(h);
  }

  // After shutdown: every operation has completed, so dropping them waits for none.
  void clear() {
    std::vector<Slot> dropped;
    {
      std::lock_guard lock(mu_);
      // Generations carry on in empty slots: ids handed out before stay unknown.
      for (uint32_t i = 0; i < slots_.size(); ++i) {
        if (!slots_[i].handle) continue;
        dropped.push_back(std::move(slots_[i]));
        release(i);
      }
    }
  }

 private:
  struct Slot {
    ta::HandlePtr handle;  // null: free
    uint32_t generation = 0;
  };

  // With mu_ held: empties slot `index` for reuse under its next generation.
  void release(uint32_t index) {
    slots_[index].handle = nullptr;
    slots_[index].generation = (slots_[index].generation + 1) & 0x7fffffff;  // ids stay >= 0
    free_.push_back(index);
  }

  // With mu_ held: the slot of a live id, or null.
  Slot* slot_of(int64_t id) {
    const auto index = static_cast<uint64_t>(id) & 0xffffffffu;
    if (id < 0 || index >= slots_.size()) return nullptr;
    Slot& slot = slots_[index];
    if (!slot.handle || slot.generation != static_cast<uint64_t>(id) >> 32) return nullptr;
    return &slot;
  }

  ta::HandlePtr find(int64_t id) {
    std::lock_guard lock(mu_);
    Slot* slot = slot_of(id);
    if (!slot)
      throw py::value_error("unknown handle " + std::to_string(id) +
                            ": it was not returned by an *_async call, or was already "
                            "synchronized");
    return slot->handle;
  }

  std::mutex mu_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
};

// `output` when `run(name)` ran the call on the direct lane, else the name the engine must use:
// `name`, or the unnamed call's own, made here (see allreduce_direct below).
template <typename Run>
py::object output_or_name(std::optional<std::string> name, std::string_view kind,
                          const std::optional<at::Tensor>& output, Run&& run) {
  std::string n = name ? std::move(*name) : krug::unnamed_op_name(kind);
  if (output && run(n, *output)) return py::cast(*output);
  return py::str(n);
}

}  // namespace

PYBIND11_MODULE(_torch_core, m) {
  m.doc() = "krug's torch adapter (internal; use krug.torch)";

  // Lifecycle, topology, elastic, op values, process sets, barrier, exception translation.
  krug::python::define_basics(m);
  m.def("adasum_available", &ta::adasum_available);

  // A finished operation's results; waiting goes through Handles.synchronize.
  py::class_<ta::TorchHandle, ta::HandlePtr>(m, "Handle")
      .def("outputs", &ta::TorchHandle::outputs)
      .def("output", &ta::TorchHandle::output, py::arg("i") = 0)
      .def("received_splits", &ta::TorchHandle::received_splits)
      .def("value", &ta::TorchHandle::value);

  py::class_<HandleTable>(m, "Handles")
      .def(py::init<>())
      .def("add", &HandleTable::add)
      .def("poll", &HandleTable::poll)
      .def("synchronize", &HandleTable::synchronize)
      .def("clear", &HandleTable::clear)
      // The per-call path of hvd.allreduce_async(_): the handle goes straight into the table.
      .def("allreduce_async", [](HandleTable& table, const std::string& name,
                                 const at::Tensor& input, const at::Tensor& output, int op,
                                 double prescale, double postscale, int process_set) {
        return table.add(ta::allreduce_async(name, input, output,
                                             reduce_options(op, prescale, postscale, process_set)));
      });

  // hvd.allreduce(_), broadcast(_) and allgather of a small CPU tensor on the global set: the
  // output when the call ran at once on the direct lane, else the name it takes through the
  // engine. That is `name`, or for an unnamed call (None) its "<kind>.noname.<n>", made here so
  // the call costs one trip into the core and one name whichever way it goes. An output of
  // None is made here, for a tensor the lane takes.
  m.def("allreduce_direct", [](std::optional<std::string> name, const at::Tensor& input,
                               std::optional<at::Tensor> output, int op, double prescale,
                               double postscale) {
    if (!output) output = ta::direct_output(input, 1);
    return output_or_name(
        std::move(name), "allreduce", output, [&](const std::string& n, const at::Tensor& out) {
          return ta::allreduce_direct(n, input, out, reduce_options(op, prescale, postscale, 0));
        });
  });
  m.def("broadcast_direct",
        [](std::optional<std::string> name, const at::Tensor& tensor, int root) {
          return output_or_name(std::move(name), "broadcast", tensor,
                                [&](const std::string& n, const at::Tensor& t) {
                                  return ta::broadcast_direct(n, t, root);
                                });
        });
  m.def("allgather_direct", [](std::optional<std::string> name, const at::Tensor& input,
                               std::optional<at::Tensor> output) {
    if (!output) output = ta::direct_output(input, krug::size());
    return output_or_name(std::move(name), "allgather", output,
                          [&](const std::string& n, const at::Tensor& out) {
                            return ta::allgather_direct(n, input, out);
                          });
  });
  m.def("grouped_allreduce_async",
        [](const std::string& name, const std::vector<at::Tensor>& inputs,
           const std::vector<at::Tensor>& outputs, int op, double prescale, double postscale,
           int process_set) {
          return ta::grouped_allreduce_async(name, inputs, outputs,
                                             reduce_options(op, prescale, postscale, process_set));
        });
  m.def("allgather_async", [](const std::string& name, const at::Tensor& input, int process_set) {
    return ta::allgather_async(name, input, ps(process_set));
  });
  m.def("grouped_allgather_async",
        [](const std::string& name, const std::vector<at::Tensor>& inputs, int process_set) {
          return ta::grouped_allgather_async(name, inputs, ps(process_set));
        });
  m.def("broadcast_async",
        [](const std::string& name, const at::Tensor& tensor, int root, int process_set) {
          return ta::broadcast_async(name, tensor, root, ps(process_set));
        });
  m.def("alltoall_async", [](const std::string& name, const at::Tensor& input,
                             const std::vector<int64_t>& splits, int process_set) {
    krug::check_alltoall_splits(splits, input.dim() > 0 ? input.size(0) : 0, ps(process_set));
    return ta::alltoall_async(name, input, splits, ps(process_set));
  });
  m.def("reducescatter_async", [](const std::string& name, const at::Tensor& input, int op,
                                  double prescale, double postscale, int process_set) {
    return ta::reducescatter_async(name, input,
                                   reduce_options(op, prescale, postscale, process_set));
  });
  m.def("grouped_reducescatter_async",
        [](const std::string& name, const std::vector<at::Tensor>& inputs, int op, double prescale,
           double postscale, int process_set) {
          return ta::grouped_reducescatter_async(
              name, inputs, reduce_options(op, prescale, postscale, process_set));
        });
  m.def("join_async", &ta::join_async);
}
