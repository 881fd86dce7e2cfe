// The calls every Python frontend of krug exposes from its pybind11 module, defined once:
// lifecycle, the timeline, topology, elastic rounds, the core's op values and unnamed names,
// process sets and barrier; and the translation of krug's exceptions (krug::InvalidArgument
// becomes ValueError, krug::elastic::WorkerRemoved and krug::Error the classes of
// krug.common.exceptions, which exist without any framework). Blocking calls release the GIL
// and stay interruptible.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "frameworks/python/interruptible.h"
#include "krug/binding_rules.h"
#include "krug/elastic.h"
#include "krug/krug.h"
#include "krug/types.h"

namespace krug::python {

inline krug::ProcessSet ps(int id) { return krug::ProcessSet{id}; }

inline void define_basics(pybind11::module_& m) {
  namespace py = pybind11;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const krug::InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const krug::elastic::WorkerRemoved& e) {
      py::object cls = py::module_::import("krug.common.exceptions").attr("WorkerRemoved");
      PyErr_SetString(cls.ptr(), e.what());
    } catch (const krug::Error& e) {
      py::object cls = py::module_::import("krug.common.exceptions").attr("HorovodInternalError");
      PyErr_SetString(cls.ptr(), e.what());
    }
  });

  m.def("init", [] {
    call_stoppably([](std::stop_token stop) { krug::init(std::move(stop)); },
                   [] {
                     krug::report_interrupted("init (interrupted in Python as it finished)");
                     krug::shutdown();
                   });
  });
  m.def("shutdown", [] {
    call_stoppably([](std::stop_token stop) { krug::shutdown(std::move(stop)); }, [] {});
  });
  // These read the runtime under the lock init() holds throughout: without the GIL, so that
  // another thread asking during init() cannot keep the main thread from its signal handlers.
  const auto without_gil = py::call_guard<py::gil_scoped_release>();
  m.def("is_initialized", &krug::is_initialized, without_gil);
  // Waits for the loop's round in progress and closes a file: without the GIL.
  m.def("start_timeline", &krug::start_timeline, py::arg("path"), py::arg("mark_cycles"),
        without_gil);
  m.def("stop_timeline", &krug::stop_timeline, without_gil);
  m.def("rank", &krug::rank, without_gil);
  m.def("size", &krug::size, without_gil);
  m.def("local_rank", &krug::local_rank, without_gil);
  m.def("local_size", &krug::local_size, without_gil);
  m.def("cross_rank", &krug::cross_rank, without_gil);
  m.def("cross_size", &krug::cross_size, without_gil);
  m.def("cpu_operations", &krug::cpu_operations, without_gil);
  m.def("mpi_built", &krug::mpi_built);
  m.def("cuda_built", &krug::cuda_built);
  m.def("nccl_version_code", &krug::nccl_version_code);
  m.def("mpi_threads_supported", &krug::mpi_threads_supported, without_gil);
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
  m.def("reduce_ops", [] {
    std::vector<std::pair<std::string, int>> ops;
    for (const auto& o : krug::reduce_ops()) ops.emplace_back(o.name, static_cast<int>(o.op));
    return ops;
  });
  m.def("unnamed_op_name", [](const std::string& kind, int process_set) {
    return krug::unnamed_op_name(kind, ps(process_set));
  });
  // The core's rule for alltoall splits (krug/binding_rules.h); raises ValueError.
  m.def("check_alltoall_splits", [](const std::vector<int64_t>& splits, int64_t rows, int id) {
    krug::check_alltoall_splits(splits, rows, ps(id));
  });
  m.def("add_process_set", [](std::vector<int> ranks) {
    return call_interruptibly(
        [ranks = std::move(ranks)]() mutable { return krug::add_process_set(std::move(ranks)).id; },
        "add_process_set");
  });
  m.def("remove_process_set", [](int id) {
    call_interruptibly([=] { krug::remove_process_set(ps(id)); }, "remove_process_set");
  });
  m.def("process_set_ranks", [](int id) { return krug::process_set_ranks(ps(id)); });
  m.def("barrier", [](int id) { call_interruptibly([=] { krug::barrier(ps(id)); }, "barrier"); });
}

}  // namespace krug::python
