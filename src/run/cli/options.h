// krugrun's command line: flags mirror horovodrun's; everything from the first positional on is
// the rank command.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "net/socket.h"
#include "run/cli/env_name.h"
#include "run/cli/hosts.h"

namespace krug::run {

// Elastic mode (run/elastic/driver.h, docs/elastic.md): on with --host-discovery-script.
struct ElasticOptions {
  std::string discovery_script;    // --host-discovery-script
  int min_np = 0;                  // --min-np (default: -np)
  int max_np = 0;                  // --max-np (0: every discovered slot)
  int slots_per_host = 1;          // --slots-per-host: slots of a host listed without :N
  int reset_limit = -1;            // --reset-limit (-1: none)
  std::optional<std::pair<double, double>> cooldown_range;  // --blacklist-cooldown-range A B
  double elastic_timeout_s = 600;  // --elastic-timeout
  double straggler_factor = 0;     // --straggler-factor (0: off)
  int straggler_window = 20;       // --straggler-window (steps)
  double discovery_interval_s = 1; // --discovery-interval
  bool enabled() const { return !discovery_script.empty(); }
};

struct LaunchOptions {
  int np = 0;
  std::vector<HostSlots> hosts;            // -H, else the Slurm allocation, else localhost:np
  std::string slurm_job_id;                // set when ranks start as steps of this Slurm job (srun)
  std::vector<std::string> forward_env;    // -x VAR: inherited locally, kept for remote starts
  std::vector<std::pair<std::string, std::string>> set_env;  // -x VAR=value, in order
  std::map<std::string, std::string> knob_env;  // KRUG_* knobs set by flags, already formatted
  std::string output_dir;                  // --output-filename
  bool verbose = false;
  bool prefix = true;                      // false with --no-prefix
  bool mpi = false;                        // --mpi: start the ranks with mpirun (run/hpc/mpi_run.h)
  double start_timeout_s = 30.0;           // --start-timeout: ssh connect and host checks
  std::string hostfile;                    // --hostfile (already parsed into hosts)
  int ssh_port = 0;                        // --ssh-port
  std::string ssh_identity_file;           // --ssh-identity-file
  std::string ssh_config_file;             // --ssh-config-file
  std::string network_interface;           // --network-interface (also KRUG_GLOO_IFACE)
  bool check_hosts_only = false;           // --check-hosts: check every host, start nothing
  std::string config_file;                 // --config: job spec file (run/cli/job_spec.h)
  std::vector<std::string> command;        // the command line's command; empty with --config
  // The job spec's `run:` steps, each {"/bin/sh", "-c", line}, to run one after another (a step
  // starts once every rank finished the previous one). Empty without --config, and when a
  // command on the command line replaces the file's steps: then `command` is the only step.
  std::vector<std::vector<std::string>> steps;
  ElasticOptions elastic;
};

// Whether the job's connections are encrypted (--encrypt, or KRUG_ENCRYPT in krugrun's own
// environment): for krugrun's own rendezvous server, which every rank must match.
net::Protection job_protection(const LaunchOptions& o);

// Parses argv (argv[0] is the program) and checks that -H covers -np. Without -H inside a Slurm
// allocation (SLURM_JOB_ID set), the hosts are the allocation's and -np defaults to its tasks. Returns the options, or the
// exit code when parsing ends the run: 0 after --help, 2 (CLI11's own codes for its errors)
// after a usage error, already printed to stderr.
std::variant<LaunchOptions, int> parse_command_line(int argc, const char* const* argv);

}  // namespace krug::run
