// The process's MPI lifetime, and MPI error codes turned into krug::Error.
//
// MPI may be initialized once per process and finalized once, after its last call; krug may be
// initialized and shut down many times (elastic restarts, tests). So MPI's lifetime is owned by
// one function-local static, not by an Engine: the one piece of process-wide mutable state the
// MPI backend has, and it mirrors state that MPI itself keeps per process. It initializes MPI on
// first use (MPI_Init_thread asking for MPI_THREAD_MULTIPLE) unless the program already did
// (mpi4py, say), and at process exit finalizes MPI only if krug initialized it.
//
// Threads: krug's MPI calls come from the user thread during init() and the engine's
// constructor, then only from the engine's background thread; never two at once. So
// MPI_THREAD_SERIALIZED is enough and is what krug requires; MULTIPLE (which Open MPI provides)
// additionally lets the program make its own MPI calls from other threads while krug runs.
#pragma once

#include <mpi.h>

#include <mutex>
#include <string>

namespace krug::collectives::mpi {

class Environment {
 public:
  static Environment& get();

  // Initializes MPI unless it is initialized already; checks the thread level either way.
  // Throws krug::Error when MPI was finalized already or provides less than SERIALIZED.
  void ensure_initialized();
  // Thread level MPI provides (valid after ensure_initialized()).
  int thread_level() const { return thread_level_; }

  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

 private:
  Environment() = default;
  std::mutex mu_;
  bool initialized_by_krug_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
};

// MPI's text for an error code.
std::string error_string(int code);

// Throws krug::Error("MPI <what> failed: <MPI's message>") unless `code` is MPI_SUCCESS.
void check(int code, const std::string& what);

}  // namespace krug::collectives::mpi
