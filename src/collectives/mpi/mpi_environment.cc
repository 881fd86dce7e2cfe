#include "collectives/mpi/mpi_environment.h"

#include <fmt/format.h>

#include "collectives/mpi/mpi_backend.h"
#include "krug/types.h"

namespace krug::collectives::mpi {
namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "an unknown thread level";
  }
}

}  // namespace

Environment& Environment::get() {
  static Environment environment;
  return environment;
}

void Environment::ensure_initialized() {
  std::lock_guard lock(mu_);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized)
    throw Error(
        "krug: MPI was finalized already in this process; MPI cannot be initialized "
        "twice, so krug cannot use it (do not call MPI_Finalize before krug is done)");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &thread_level_),
          "MPI_Init_thread");
    initialized_by_krug_ = true;
    // Nobody else uses this process's MPI: errors on MPI_COMM_WORLD (communicator creation)
    // come back as codes krug turns into exceptions instead of aborting the job.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  } else {
    MPI_Query_thread(&thread_level_);
  }
  if (thread_level_ < MPI_THREAD_SERIALIZED)
    throw Error(fmt::format(
        "krug: MPI provides only {}; krug's background thread makes MPI calls, which needs at "
        "least MPI_THREAD_SERIALIZED. If your program initializes MPI itself, ask for "
        "MPI_THREAD_MULTIPLE (mpi4py does by default)",
        thread_level_name(thread_level_)));
}

Environment::~Environment() {
  // Process exit. Only what krug started is finished: a program (or mpi4py) that initialized MPI
  // finalizes it itself.
  if (!initialized_by_krug_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return fmt::format("MPI error code {}", code);
  return std::string(text, static_cast<size_t>(length));
}

void check(int code, const std::string& what) {
  if (code != MPI_SUCCESS) throw Error(fmt::format("MPI {} failed: {}", what, error_string(code)));
}

bool built() {
  return true;
}

void pin_lifetime() {
  Environment::get();
}

bool thread_multiple() {
  int initialized = 0, level = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Query_thread(&level);
  return level == MPI_THREAD_MULTIPLE;
}

}  // namespace krug::collectives::mpi
