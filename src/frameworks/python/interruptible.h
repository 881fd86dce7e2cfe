// Blocking calls from Python that stay interruptible, for every pybind11 module of krug (the
// torch module, krug.common._basics): a wait releases the GIL and returns to the interpreter
// every 50 ms to run its signal handlers, so Ctrl-C (KeyboardInterrupt) or a test's timeout
// stops a wait that would never end. A handler's exception stops krug on this rank and tells the
// other ranks (krug::report_interrupted), so that they fail with an error naming this rank
// instead of waiting for it until the timeout.
#pragma once

#include <fmt/format.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <future>
#include <string>
#include <utility>

#include "krug/binding_rules.h"

namespace krug::python {

inline constexpr std::chrono::milliseconds kSignalCheckInterval{50};

// With the GIL held and the exception of a signal handler set (PyErr_CheckSignals failed):
// stops krug on this rank, tells the other ranks why, then raises the handler's exception.
[[noreturn]] inline void raise_interrupted(const char* what) {
  namespace py = pybind11;
  py::error_already_set interrupt;  // takes the pending exception (KeyboardInterrupt, say)
  const std::string how =
      fmt::format("{} ({} in Python)", what, interrupt.type().attr("__name__").cast<std::string>());
  {
    py::gil_scoped_release release;
    krug::report_interrupted(how);
  }
  throw interrupt;
}

// Runs `wait_for(interval) -> bool` (true: done) with the GIL released until it says done,
// giving Python's signal handlers a turn between slices.
template <typename WaitFor>
void wait_interruptibly(const WaitFor& wait_for, const char* what) {
  for (;;) {
    bool done;
    {
      pybind11::gil_scoped_release release;
      done = wait_for(kSignalCheckInterval);
    }
    if (done) return;
    if (PyErr_CheckSignals() != 0) raise_interrupted(what);
  }
}

// A blocking call of the C++ API (barrier, process-set changes), made interruptible: it runs on
// a helper thread while this one waits in slices. An interruption stops krug on this rank
// (raise_interrupted), which fails the call, so the helper always ends.
template <typename Call>
auto call_interruptibly(Call call, const char* what) {
  auto result = std::async(std::launch::async, std::move(call));
  try {
    wait_interruptibly(
        [&](auto interval) { return result.wait_for(interval) == std::future_status::ready; },
        what);
  } catch (...) {
    pybind11::gil_scoped_release release;
    result.wait();  // the engine stopped: the call has failed or is about to
    throw;
  }
  return result.get();  // its value, or its exception
}

}  // namespace krug::python
