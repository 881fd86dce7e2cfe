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
#include <stop_token>
#include <string>
#include <utility>

#include "krug/binding_rules.h"

namespace krug::python {

inline constexpr std::chrono::milliseconds kSignalCheckInterval{50};

// Runs `wait_for(interval) -> bool` (true: done) with the GIL released until it says done,
// giving Python's signal handlers a turn between slices. When one raises, calls
// `on_interrupt(exception type name)` without the GIL, then raises the handler's exception.
template <typename WaitFor, typename OnInterrupt>
void wait_in_slices(const WaitFor& wait_for, const OnInterrupt& on_interrupt) {
  namespace py = pybind11;
  for (;;) {
    bool done;
    {
      py::gil_scoped_release release;
      done = wait_for(kSignalCheckInterval);
    }
    if (done) return;
    if (PyErr_CheckSignals() != 0) {
      py::error_already_set interrupt;  // takes the pending exception (KeyboardInterrupt, say)
      const auto name = interrupt.type().attr("__name__").cast<std::string>();
      {
        py::gil_scoped_release release;
        on_interrupt(name);
      }
      throw interrupt;
    }
  }
}

// wait_in_slices for a wait inside krug's operations: an interruption stops krug on this rank
// and tells the other ranks why.
template <typename WaitFor>
void wait_interruptibly(const WaitFor& wait_for, const char* what) {
  wait_in_slices(wait_for, [what](const std::string& name) {
    krug::report_interrupted(fmt::format("{} ({} in Python)", what, name));
  });
}

// A blocking call of the C++ API (barrier, process-set changes), made interruptible: it runs on
// a helper thread while this one waits in slices. An interruption stops krug on this rank
// (wait_interruptibly), which fails the call, so the helper always ends.
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

// init() or shutdown(), made interruptible: `call(std::stop_token)` runs on a helper thread
// while this one waits in slices. An interruption requests the stop, which ends the call within
// about 50 ms (init() leaves krug uninitialized; shutdown() stops krug on this rank at once and
// the other ranks are told), then raises the handler's exception. A call that had finished
// anyway (the signal came as it returned) is undone first (`undo()`), so the exception always
// means the same state.
template <typename Call, typename Undo>
void call_stoppably(Call call, Undo undo) {
  std::stop_source stop;
  auto result = std::async(std::launch::async,
                           [call = std::move(call), token = stop.get_token()] { call(token); });
  auto finished = [&](auto interval) {
    return result.wait_for(interval) == std::future_status::ready;
  };
  try {
    wait_in_slices(finished, [&](const std::string&) {
      stop.request_stop();
      try {
        result.get();  // the call's own error ("interrupted") gives way to the handler's
      } catch (...) {
        return;
      }
      try {
        undo();
      } catch (...) {  // the handler's exception is the one to raise; krug has stopped anyway
      }
    });
  } catch (...) {
    // Never leave with the helper running: it may still use this frame's `stop`.
    pybind11::gil_scoped_release release;
    stop.request_stop();
    if (result.valid()) result.wait();
    throw;
  }
  result.get();  // its exception, if it failed by itself
}

}  // namespace krug::python
