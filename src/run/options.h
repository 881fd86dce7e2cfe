// krugrun's command line: flags mirror horovodrun's; everything from the first positional on is
// the rank command.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "run/hosts.h"

namespace krug::run {

struct LaunchOptions {
  int np = 0;
  std::vector<HostSlots> hosts;            // -H parsed; localhost:np without -H
  std::vector<std::string> forward_env;    // -x VAR: inherited locally, kept for remote starts
  std::vector<std::pair<std::string, std::string>> set_env;  // -x VAR=value, in order
  std::map<std::string, std::string> knob_env;  // KRUG_* knobs set by flags, already formatted
  std::string output_dir;                  // --output-filename
  bool verbose = false;
  bool prefix = true;                      // false with --no-prefix
  bool mpi = false;                        // --mpi: start the ranks with mpirun (run/mpi_run.h)
  double start_timeout_s = 30.0;           // only used once remote starts exist
  std::vector<std::string> command;
};

// Parses argv (argv[0] is the program) and checks that -H covers -np. Returns the options, or the
// exit code when parsing ends the run: 0 after --help, 2 (CLI11's own codes for its errors)
// after a usage error, already printed to stderr.
std::variant<LaunchOptions, int> parse_command_line(int argc, const char* const* argv);

}  // namespace krug::run
