// krug.torch._torch_core: the pybind11 module under python/krug/torch/mpi_ops.py. It exposes the
// torch adapter (adapter.h) and krug's lifecycle and process-set calls; Horovod's API (names,
// defaults, autograd, handle maps) is built in Python on top of it.
//
// Exceptions: krug::Error becomes krug.common.exceptions.HorovodInternalError (a RuntimeError),
// torch_adapter::UnsupportedTensor (a bad argument found before enqueueing) becomes ValueError.
// Every call that may block releases the GIL.
#include <torch/extension.h>

#include <string>
#include <vector>

#include "frameworks/torch/adapter.h"
#include "krug/elastic.h"
#include "krug/krug.h"
#include "krug/types.h"

namespace py = pybind11;
namespace ta = krug::torch_adapter;

namespace {

krug::ReduceOptions reduce_options(int op, double prescale, double postscale, int process_set) {
  krug::ReduceOptions o;
  o.op = static_cast<krug::ReduceOp>(op);
  o.prescale_factor = prescale;
  o.postscale_factor = postscale;
  o.process_set = krug::ProcessSet{process_set};
  return o;
}

krug::ProcessSet ps(int id) { return krug::ProcessSet{id}; }

}  // namespace

PYBIND11_MODULE(_torch_core, m) {
  m.doc() = "krug's torch adapter (internal; use krug.torch)";

  // Registered before the exceptions themselves are raised: the Python classes live in
  // krug.common.exceptions so that they exist without torch too (elastic, the launcher).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ta::UnsupportedTensor& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const krug::elastic::WorkerRemoved& e) {
      py::object cls = py::module_::import("krug.common.exceptions").attr("WorkerRemoved");
      PyErr_SetString(cls.ptr(), e.what());
    } catch (const krug::Error& e) {
      py::object cls = py::module_::import("krug.common.exceptions").attr("HorovodInternalError");
      PyErr_SetString(cls.ptr(), e.what());
    }
  });

  m.def("init", &krug::init, py::call_guard<py::gil_scoped_release>());
  m.def("shutdown", &krug::shutdown, py::call_guard<py::gil_scoped_release>());
  m.def("is_initialized", &krug::is_initialized);
  m.def("rank", &krug::rank);
  m.def("size", &krug::size);
  m.def("local_rank", &krug::local_rank);
  m.def("local_size", &krug::local_size);
  m.def("cross_rank", &krug::cross_rank);
  m.def("cross_size", &krug::cross_size);
  m.def("cpu_operations", &krug::cpu_operations);
  // Elastic mode (krug.torch.elastic builds Horovod's API on these).
  m.def("elastic_enabled", &krug::elastic::enabled);
  m.def("elastic_round", [] {
    auto r = krug::elastic::round_info();
    return py::make_tuple(r.round, r.has_new_workers);
  });
  m.def("elastic_host_update", [] {
    krug::elastic::HostUpdate u;
    {
      py::gil_scoped_release release;  // a round trip to krugrun
      u = krug::elastic::host_update();
    }
    return py::make_tuple(u.changed, u.only_removed);
  });
  m.def("mpi_built", &krug::mpi_built);
  m.def("mpi_threads_supported", &krug::mpi_threads_supported);
  m.def("adasum_available", &ta::adasum_available);
  m.def("adasum_op", &ta::adasum_op);

  m.def("add_process_set", [](std::vector<int> ranks) {
    return krug::add_process_set(std::move(ranks)).id;
  }, py::call_guard<py::gil_scoped_release>());
  m.def("remove_process_set", [](int id) { krug::remove_process_set(ps(id)); },
        py::call_guard<py::gil_scoped_release>());
  m.def("process_set_ranks", [](int id) { return krug::process_set_ranks(ps(id)); });
  m.def("barrier", [](int id) { krug::barrier(ps(id)); },
        py::call_guard<py::gil_scoped_release>());

  py::class_<ta::TorchHandle, ta::HandlePtr>(m, "Handle")
      .def("poll", &ta::TorchHandle::poll)
      .def("wait", &ta::TorchHandle::wait, py::call_guard<py::gil_scoped_release>())
      .def("wait_for", &ta::TorchHandle::wait_for, py::call_guard<py::gil_scoped_release>())
      .def("error", &ta::TorchHandle::error)
      .def("outputs", &ta::TorchHandle::outputs)
      .def("output", &ta::TorchHandle::output, py::arg("i") = 0)
      .def("received_splits", &ta::TorchHandle::received_splits)
      .def("value", &ta::TorchHandle::value);

  m.def("allreduce_async",
        [](const std::string& name, const at::Tensor& input, const at::Tensor& output, int op,
           double prescale, double postscale, int process_set) {
          return ta::allreduce_async(name, input, output,
                                     reduce_options(op, prescale, postscale, process_set));
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
    return ta::alltoall_async(name, input, splits, ps(process_set));
  });
  m.def("reducescatter_async",
        [](const std::string& name, const at::Tensor& input, int op, double prescale,
           double postscale, int process_set) {
          return ta::reducescatter_async(name, input,
                                         reduce_options(op, prescale, postscale, process_set));
        });
  m.def("grouped_reducescatter_async",
        [](const std::string& name, const std::vector<at::Tensor>& inputs, int op,
           double prescale, double postscale, int process_set) {
          return ta::grouped_reducescatter_async(
              name, inputs, reduce_options(op, prescale, postscale, process_set));
        });
  m.def("join_async", &ta::join_async);
}
