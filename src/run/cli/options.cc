#include "run/cli/options.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "common/config.h"
#include "krug/types.h"
#include "run/cli/build_report.h"
#include "run/cli/horovod_config.h"
#include "run/cli/job_spec.h"
#include "run/cli/knob_flags.h"
#include "run/hpc/slurm.h"
#include "run/launch/rank_env.h"
#include "run/launch/ssh.h"

namespace krug::run {
namespace {

// Text of the knob flags given, by job spec key; unset flags leave the inherited environment alone.
using KnobText = std::map<std::string_view, std::string>;

// CLI11's PositiveNumber prints DBL_MAX in its message; these say what is wrong in words.
CLI::Validator number_at_least(double min, bool inclusive) {
  return CLI::Validator(
      [=](std::string& value) -> std::string {
        try {
          parse_number_at_least(value, min, inclusive);
        } catch (const Error& e) {
          return e.what();
        }
        return {};
      },
      inclusive ? "NONNEGATIVE" : "POSITIVE");
}

// The knob flags' checks are knob_value's, shared with the job spec file.
CLI::Validator knob_check(const KnobFlag& flag) {
  return CLI::Validator(
      [&flag](std::string& value) -> std::string {
        try {
          knob_value(flag, value);
        } catch (const Error& e) {
          return e.what();
        }
        return {};
      },
      "");
}

std::string knob_type_name(KnobFlag::Kind kind) {
  switch (kind) {
    case KnobFlag::Kind::kMebibytes:
      return "MB";
    case KnobFlag::Kind::kInteger:
      return "INT";
    case KnobFlag::Kind::kNumber:
      return "FLOAT";
    case KnobFlag::Kind::kText:
      return "PATH";
    case KnobFlag::Kind::kLogLevel:
      return "LEVEL";
  }
  return "TEXT";
}

// Values collected from the command line before they are checked and turned into LaunchOptions.
struct RawFlags {
  KnobText knobs;
  std::vector<std::string> xs;  // -x
  std::string hosts;            // -H
  std::vector<double> cooldown;
  std::vector<std::string> nics;  // --network-interface, repeated or comma-separated
  std::string horovod_config;     // --config-file
};

// --start-timeout's default from the environment, as horovodrun reads HOROVOD_START_TIMEOUT
// (krug's KRUG_START_TIMEOUT first): the knob table's KRUG_START_TIMEOUT.
void start_timeout_from_environment(LaunchOptions& o) {
  o.start_timeout_s = load_knobs({"KRUG_START_TIMEOUT"}).start_timeout.count();
}

// horovodrun's --config-file, under the flags given: a knob set by a flag keeps the flag's value.
void apply_horovod_config(const CLI::App& app, const std::string& path, LaunchOptions& o) {
  HorovodConfig config = load_horovod_config(path);
  for (auto& [name, value] : config.knob_env) o.knob_env.try_emplace(name, std::move(value));
  if (config.use_mpi && app.count("--gloo") == 0 && app.count("--mpi") == 0)
    o.mpi = *config.use_mpi;
}

// A switch that sets one knob to `value` in every rank's environment.
void add_knob_switch(CLI::App& app, LaunchOptions& o, const std::string& flag, const char* knob,
                     const char* value, const std::string& help) {
  app.add_flag_callback(
      flag, [&o, knob, value] { o.knob_env[knob] = value; }, help);
}

// horovodrun's flags that change nothing in krugrun, accepted so its command lines run as they
// are: ranks over TCP are Gloo's already, krugrun caches no host checks, and krug's log lines
// carry no timestamp.
void add_horovodrun_no_ops(CLI::App& app, LaunchOptions& o) {
  app.add_flag("--gloo")
      ->description("horovodrun's: krugrun's ranks use krug's TCP plane across hosts unless --mpi")
      ->excludes(app.get_option("--mpi"));
  app.add_flag("--disable-cache")->description("horovodrun's: krugrun caches no host checks");
  app.add_flag("--log-without-timestamp,--log-hide-timestamp")
      ->description("horovodrun's: krug's log lines have no timestamp");
  add_knob_switch(app, o, "--no-stall-check", "KRUG_STALL_CHECK_DISABLE", "1",
                  "KRUG_STALL_CHECK_DISABLE=1: turn the stall inspector off");
  add_knob_switch(app, o, "--timeline-mark-cycles", "KRUG_TIMELINE_MARK_CYCLES", "1",
                  "KRUG_TIMELINE_MARK_CYCLES=1 (the default)");
}

void add_flags(CLI::App& app, LaunchOptions& o, RawFlags& raw) {
  KnobText& k = raw.knobs;
  app.add_option("--config", o.config_file,
                 "Job spec file (YAML): settings and the steps to run; flags override it");
  app.add_option("--config-file", raw.horovod_config,
                 "horovodrun's settings file (YAML sections params, autotune, timeline, "
                 "stall_check, library_options, logging, controller); flags override it")
      ->check(CLI::ExistingFile);
  // Hosts and ssh
  app.add_option("--hostfile", o.hostfile, "File of 'host slots=N' lines (instead of -H)")
      ->check(CLI::ExistingFile);
  app.add_option("-p,--ssh-port", o.ssh_port, "Port of sshd on remote hosts")
      ->check(CLI::Range(1, 65535));
  app.add_option("-i,--ssh-identity-file", o.ssh_identity_file, "Private key for ssh (ssh -i)")
      ->check(CLI::ExistingFile);
  app.add_option("--ssh-config-file", o.ssh_config_file,
                 "ssh configuration file (ssh -F; default ~/.ssh/config)")
      ->check(CLI::ExistingFile);
  app.add_option("--network-interface,--network-interfaces", raw.nics,
                 "Network interface for the control and data planes, e.g. eth0 "
                 "(KRUG_GLOO_IFACE); of several (repeated or eth0,eth1) the first, and all "
                 "for NCCL (NCCL_SOCKET_IFNAME)")
      ->delimiter(',')
      ->allow_extra_args(false);
  app.add_flag("--check-hosts", o.check_hosts_only,
               "Check that every host is reachable over ssh and has krugrun, then exit");
  // CLI11 2.1 rejects multi-letter single-dash names, so "-np" is rewritten to "--np" first.
  app.add_option("--np,--num-proc", o.np, "Number of ranks (write -np as with horovodrun)");
  app.add_option("-H,--hosts", raw.hosts, "host:slots,... (default localhost:np)");
  app.add_option("-x", raw.xs, "Forward VAR or set VAR=value in every rank's environment")
      ->allow_extra_args(false);
  app.add_option("--output-filename", o.output_dir,
                 "Also write DIR/rank.N/stdout and DIR/rank.N/stderr");
  app.add_flag("--verbose", o.verbose, "Print the rendezvous address and each rank's start");
  app.add_flag(
      "--no-prefix", [&o](int64_t) { o.prefix = false; },
      "Do not prefix output lines with [rank]<stdout>:");
  app.add_flag("--mpi", o.mpi,
               "Start the ranks with Open MPI's mpirun (KRUG_CPU_OPERATIONS=mpi unless set)");
  app.add_option("--start-timeout", o.start_timeout_s,
                 "Seconds to reach each remote host over ssh (default: KRUG_START_TIMEOUT or "
                 "HOROVOD_START_TIMEOUT, else 30)")
      ->check(number_at_least(0, false));
  for (const KnobFlag& flag : knob_flags())
    app.add_option(flag.horovodrun_flag.empty()
                       ? flag_name(flag.key)
                       : flag_name(flag.key) + "," + std::string(flag.horovodrun_flag),
                   k[flag.key], std::string(flag.help))
        ->check(knob_check(flag))
        ->type_name(knob_type_name(flag.kind));
  // Not a value knob: two switches for one KRUG_HIERARCHICAL_ALLREDUCE (neither = auto).
  add_knob_switch(app, o, "--hierarchical-allreduce", "KRUG_HIERARCHICAL_ALLREDUCE", "1",
                  "KRUG_HIERARCHICAL_ALLREDUCE=1 (default: auto)");
  add_knob_switch(app, o, "--no-hierarchical-allreduce", "KRUG_HIERARCHICAL_ALLREDUCE", "0",
                  "KRUG_HIERARCHICAL_ALLREDUCE=0");
  add_knob_switch(app, o, "--encrypt", "KRUG_ENCRYPT", "1",
                  "KRUG_ENCRYPT=1: encrypt every connection of the job (AES-256-GCM), for "
                  "networks you do not trust (docs/security.md)");
  add_knob_switch(app, o, "--autotune", "KRUG_AUTOTUNE", "1",
                  "KRUG_AUTOTUNE=1: tune the fusion threshold and cycle time online "
                  "(docs/autotune.md)");
  // Elastic mode (docs/elastic.md)
  ElasticOptions& e = o.elastic;
  app.add_option("--host-discovery-script", e.discovery_script,
                 "Elastic mode: command printing the usable hosts, one host:slots per line; "
                 "run every --discovery-interval seconds");
  app.add_option("--min-np", e.min_np, "Elastic: fewest ranks to train with (default -np)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-np", e.max_np, "Elastic: most ranks to start (default: every slot)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--slots-per-host", e.slots_per_host,
                 "Elastic: slots of a discovered host listed without :N (default 1)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--reset-limit", e.reset_limit,
                 "Elastic: stop the job after this many resets (default: no limit)")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--blacklist-cooldown-range", raw.cooldown,
                 "Elastic: a failed host may return after a cooldown drawn from [A, B] seconds "
                 "(doubled per repeated failure); default: never")
      ->expected(2)
      ->allow_extra_args(false)
      ->type_name("A B");
  app.add_option("--elastic-timeout", e.elastic_timeout_s,
                 "Elastic: seconds to wait for --min-np slots or for workers to re-form the job "
                 "(default 600)")
      ->check(number_at_least(0, false));
  app.add_option("--straggler-factor", e.straggler_factor,
                 "Elastic: remove a host whose rank is this many times slower than the others "
                 "over --straggler-window steps (e.g. 1.5; default 0 = off)")
      ->check(number_at_least(0, true));
  app.add_option("--straggler-window", e.straggler_window,
                 "Elastic: steps a rank must be slow for before it is removed (default 20)")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--discovery-interval", e.discovery_interval_s,
                 "Elastic: seconds between runs of the discovery script (default 1)")
      ->check(number_at_least(0, false));
  add_horovodrun_no_ops(app, o);
  // Stop at the first positional: the rest, options included, belongs to the rank command.
  app.prefix_command();
}

// horovodrun's multi-letter single-dash spellings, which CLI11 would read as short options
// ("-hostfile" as -h).
constexpr std::pair<std::string_view, std::string_view> kSingleDashNames[] = {
    {"-np", "--np"}, {"-hostfile", "--hostfile"}, {"-cb", "--check-build"}};

// Rewrites horovodrun's single-dash names among krugrun's own arguments only, so a command such
// as `mpirun -np 2` after the first positional is left untouched.
std::vector<std::string> normalize_args(const CLI::App& app, int argc, const char* const* argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--" || a.empty() || a[0] != '-') break;
    for (const auto& [single, full] : kSingleDashNames) {
      if (a == single) a = full;
      if (a.starts_with(std::string(single) + "=")) a = "-" + a;
    }
    if (a.find('=') != std::string::npos) continue;
    const CLI::Option* opt = app.get_option_no_throw(a);
    if (opt == nullptr) break;  // unknown: CLI11 / the check below reports it
    i += static_cast<size_t>(std::max(0, opt->get_items_expected_min()));  // skip its values
  }
  return args;
}

// The elastic flags that mean nothing without --host-discovery-script.
constexpr const char* kElasticOnlyFlags[] = {
    "--slots-per-host",   "--reset-limit",      "--blacklist-cooldown-range", "--elastic-timeout",
    "--straggler-factor", "--straggler-window", "--discovery-interval"};

void split_env(const std::vector<std::string>& xs, LaunchOptions& o) {
  for (const auto& x : xs) {
    size_t eq = x.find('=');
    std::string name = x.substr(0, eq);
    if (!is_env_name(name))
      throw Error("krugrun: -x '" + x + "': '" + name + "' is not a variable name");
    if (eq == std::string::npos)
      o.forward_env.push_back(name);
    else
      o.set_env.emplace_back(name, x.substr(eq + 1));
  }
}

// The first of the interfaces for krug's planes (Horovod's choice for Gloo), all of them for NCCL
// unless NCCL_SOCKET_IFNAME is set already.
void set_network_interfaces(const std::vector<std::string>& nics, LaunchOptions& o) {
  for (const std::string& nic : nics)
    if (nic.empty()) throw Error("krugrun: --network-interface: an empty interface name");
  o.network_interface = nics.front();
  std::string all = nics.front();
  for (size_t i = 1; i < nics.size(); ++i) all += "," + nics[i];
  if (current_environment().count("NCCL_SOCKET_IFNAME") == 0)
    o.knob_env["NCCL_SOCKET_IFNAME"] = all;
}

void set_knobs(const CLI::App& app, const KnobText& k, LaunchOptions& o) {
  for (const KnobFlag& flag : knob_flags())
    if (app.count(flag_name(flag.key)) > 0)
      o.knob_env[std::string(flag.env)] = knob_value(flag, k.at(flag.key));
  if (app.count("--hierarchical-allreduce") > 0 && app.count("--no-hierarchical-allreduce") > 0)
    throw Error(
        "krugrun: --hierarchical-allreduce and --no-hierarchical-allreduce contradict "
        "each other; give one (neither leaves the choice to krug)");
}

// The flags given on the command line, named by their job spec keys (job_spec.h).
std::set<std::string> flags_given(const CLI::App& app) {
  const std::pair<const char*, const char*> names[] = {
      {"np", "--np"},
      {"hosts", "-H"},
      {"hostfile", "--hostfile"},
      {"output_filename", "--output-filename"},
      {"verbose", "--verbose"},
      {"prefix", "--no-prefix"},
      {"start_timeout", "--start-timeout"},
      {"ssh_port", "--ssh-port"},
      {"ssh_identity_file", "--ssh-identity-file"},
      {"ssh_config_file", "--ssh-config-file"},
      {"network_interface", "--network-interface"}};
  std::set<std::string> given;
  for (const auto& [key, flag] : names)
    if (app.count(flag) > 0) given.insert(key);
  return given;
}

// With --config the command is optional: it replaces the file's `run:` steps.
void take_command(std::vector<std::string> rest, LaunchOptions& o) {
  if (!rest.empty() && rest.front() == "--")
    rest.erase(rest.begin());
  else if (!rest.empty() && rest.front().size() > 1 && rest.front()[0] == '-')
    throw Error("krugrun: unknown option '" + rest.front() + "' (see krugrun --help)");
  if (rest.empty() && o.config_file.empty())
    throw Error("krugrun: no command given; usage: krugrun -np N command args...");
  o.command = std::move(rest);
}

// A discovery script that always prints `hosts`: horovodrun's elastic job on fixed hosts, where
// a failed host leaves (for its cooldown) and the job goes on while --min-np ranks remain.
std::string fixed_hosts_script(const std::vector<HostSlots>& hosts) {
  std::string script = "printf '%s\\n'";
  for (const HostSlots& h : hosts)
    script += " " + shell_quote(h.host + ":" + std::to_string(h.slots));
  return script;
}

// Elastic jobs take their hosts from the discovery script, or from -H / --hostfile / the job
// spec's workers when there is none; never from Slurm.
void check_elastic(const CLI::App& app, LaunchOptions& o) {
  ElasticOptions& e = o.elastic;
  if (!e.enabled() && !o.hosts.empty()) {
    e.discovery_script = fixed_hosts_script(o.hosts);
    o.hosts.clear();
  }
  if (!e.enabled())
    throw Error(
        "krugrun: --min-np / --max-np start an elastic job, which needs its hosts: "
        "--host-discovery-script (a command printing host:slots lines), or fixed hosts with "
        "-H / --hostfile");
  if (!o.hosts.empty())
    throw Error(o.config_file.empty() || app.count("-H") > 0 || app.count("--hostfile") > 0
                    ? "krugrun: an elastic job takes its hosts from --host-discovery-script; "
                      "drop -H / --hostfile"
                    : "krugrun: an elastic job takes its hosts from --host-discovery-script; "
                      "drop workers: from " +
                          o.config_file);
  if (o.mpi) throw Error("krugrun: --mpi cannot start an elastic job (mpirun's ranks are fixed)");
  if (!o.steps.empty() && o.steps.size() > 1)
    throw Error("krugrun: an elastic job runs one command, not several run: steps");
  if (!o.steps.empty()) o.command = o.steps.front();
  if (app.count("--np") == 0 && o.np == 0) o.np = e.min_np;
  if (o.np < 1)
    throw Error("krugrun: give -np (the ranks to start with) or --min-np for an elastic job");
  if (e.min_np == 0) e.min_np = o.np;
  if (e.max_np != 0 && e.max_np < e.min_np)
    throw Error(fmt::format("krugrun: --max-np {} is below --min-np {}", e.max_np, e.min_np));
  if (e.max_np != 0 && o.np > e.max_np)
    throw Error(fmt::format("krugrun: -np {} is above --max-np {}", o.np, e.max_np));
  if (e.cooldown_range &&
      (e.cooldown_range->first < 0 || e.cooldown_range->second < e.cooldown_range->first))
    throw Error("krugrun: --blacklist-cooldown-range A B needs 0 <= A <= B seconds");
  if (e.straggler_factor != 0 && e.straggler_factor <= 1)
    throw Error(
        "krugrun: --straggler-factor must be above 1 (how many times slower than the "
        "others a rank may be), or 0 to turn straggler removal off");
}

}  // namespace

// The hosts of -H or --hostfile, into o.hosts.
void read_hosts(const CLI::App& app, const std::string& hosts_flag, LaunchOptions& o) {
  if (app.count("-H") && app.count("--hostfile"))
    throw Error("krugrun: give the hosts with -H or --hostfile, not both");
  if (app.count("-H"))
    o.hosts = parse_hosts(hosts_flag);
  else if (app.count("--hostfile"))
    o.hosts = read_hostfile(o.hostfile);
}

// A fixed-size job's -np and hosts: given, from the job spec, from a Slurm allocation, or
// localhost; throws when the slots cannot hold the ranks.
void settle_ranks_and_hosts(const CLI::App& app, LaunchOptions& o) {
  // -np, or the job spec's np: (or the slots of its workers).
  const bool has_np = app.count("--np") > 0 || o.np != 0;
  // Given hosts win over Slurm: `-H localhost:N` starts ranks without srun in an allocation.
  std::optional<slurm::Allocation> allocation;
  if (o.hosts.empty()) allocation = slurm::detect_allocation(current_environment());
  if (!has_np && !allocation)
    throw Error(o.config_file.empty()
                    ? "krugrun: -np N is required (see krugrun --help)"
                    : "krugrun: -np N is required: give it on the command line, as np: in " +
                          o.config_file + ", or list workers there");
  if (allocation) {
    o.np = slurm::ranks_to_start(*allocation, has_np ? std::optional<int>(o.np) : std::nullopt);
    o.hosts = allocation->hosts;
    o.slurm_job_id = allocation->job_id;
  }
  if (o.hosts.empty()) o.hosts = {{"localhost", o.np}};
  layout_ranks(o.hosts, o.np);  // checks -np >= 1 and that the slots cover it
}

std::variant<LaunchOptions, int> parse_command_line(int argc, const char* const* argv) {
  CLI::App app{"krugrun: start N ranks of a krug (or Horovod) training command", "krugrun"};
  app.footer(
      "Synopsis: krugrun -np N [-H host:slots,...] [options] command [args...]\n"
      "Example: krugrun -np 4 -H localhost:4 python3 train.py --lr 0.1\n"
      "Inside a Slurm allocation without -H, ranks start with srun on the allocation's\n"
      "hosts and -np defaults to its task count.\n");
  LaunchOptions o;
  RawFlags raw;
  add_flags(app, o, raw);
  bool check_build = false;
  app.add_flag("--check-build", check_build,
               "Show what this krug was built with (frameworks, controllers, tensor "
               "operations), then exit (horovodrun's -cb too)");
  app.set_version_flag("-v,--version", version_line(this_build()));
  std::vector<std::string> args = normalize_args(app, argc, argv);
  try {
    std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
    app.parse(args);
    if (check_build) {
      fmt::print("{}", build_report(this_build()));
      return 0;
    }
    split_env(raw.xs, o);
    if (app.count("--start-timeout") == 0) start_timeout_from_environment(o);
    set_knobs(app, raw.knobs, o);
    if (!raw.horovod_config.empty()) apply_horovod_config(app, raw.horovod_config, o);
    read_hosts(app, raw.hosts, o);
    if (o.check_hosts_only && o.config_file.empty()) {
      if (o.hosts.empty()) throw Error("krugrun: --check-hosts needs -H or --hostfile");
      return o;
    }
    take_command(app.remaining(), o);
    if (!o.config_file.empty()) {
      JobSpec spec = load_job_spec(o.config_file);
      o = apply_job_spec(spec, std::move(o), flags_given(app));
    }
    if (raw.nics.empty() && !o.network_interface.empty())  // the job spec's
      raw.nics = CLI::detail::split(o.network_interface, ',');
    if (!raw.nics.empty()) set_network_interfaces(raw.nics, o);
    if (!o.network_interface.empty()) o.knob_env["KRUG_GLOO_IFACE"] = o.network_interface;
    // krugrun's servers and every rank must agree on encryption: KRUG_ENCRYPT in krugrun's own
    // environment becomes the job's setting, as --encrypt does.
    if (!o.knob_env.count("KRUG_ENCRYPT") && load_knobs({"KRUG_ENCRYPT"}).encrypt)
      o.knob_env["KRUG_ENCRYPT"] = "1";
    if (o.check_hosts_only) {
      if (o.hosts.empty())
        throw Error("krugrun: --check-hosts needs -H, --hostfile or workers in --config");
      return o;
    }
    if (raw.cooldown.size() == 2)
      o.elastic.cooldown_range = std::make_pair(raw.cooldown[0], raw.cooldown[1]);
    if (o.elastic.enabled() || app.count("--min-np") || app.count("--max-np")) {
      check_elastic(app, o);
      return o;
    }
    for (const char* flag : kElasticOnlyFlags)
      if (app.count(flag) > 0)
        throw Error(std::string("krugrun: ") + flag +
                    " is for elastic jobs: give --host-discovery-script, or --min-np with "
                    "fixed hosts");
    settle_ranks_and_hosts(app, o);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (or the help) and has a code of its own per kind of error;
    // krugrun's contract is one usage status, 2, whatever the mistake.
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return o;
}

net::Protection job_protection(const LaunchOptions& o) {
  const Config knob = load_knobs({"KRUG_ENCRYPT"}, [&o](const char* name) -> const char* {
    auto it = o.knob_env.find(name);
    return it == o.knob_env.end() ? nullptr : it->second.c_str();
  });
  return net::protection_for(knob.encrypt);
}

}  // namespace krug::run
