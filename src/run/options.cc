#include "run/options.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <optional>
#include <string>

#include "common/log.h"
#include "krug/types.h"

namespace krug::run {
namespace {

// Values of the knob flags; unset flags leave the inherited environment alone.
struct KnobFlags {
  std::optional<int64_t> fusion_threshold_mb;
  std::optional<double> cycle_time_ms, timeout_s, stall_check_s, stall_shutdown_s;
  std::optional<int64_t> cache_capacity;
  std::optional<std::string> timeline, log_level;
};

// CLI11's PositiveNumber prints DBL_MAX in its message; these say what is wrong in words.
CLI::Validator number_at_least(double min, bool inclusive) {
  return CLI::Validator(
      [=](std::string& value) -> std::string {
        double v = 0;
        size_t used = 0;
        try {
          v = std::stod(value, &used);
        } catch (const std::exception&) {
        }
        if (used != value.size() || value.empty()) return "'" + value + "' is not a number";
        if (inclusive ? v < min : v <= min)
          return fmt::format("{} must be {} {}", value, inclusive ? "at least" : "greater than", min);
        return {};
      },
      inclusive ? "NONNEGATIVE" : "POSITIVE");
}

void add_flags(CLI::App& app, LaunchOptions& o, KnobFlags& k, std::vector<std::string>& xs,
               std::string& hosts) {
  // CLI11 2.1 rejects multi-letter single-dash names, so "-np" is rewritten to "--np" first.
  app.add_option("--np,--num-proc", o.np, "Number of ranks (write -np as with horovodrun)");
  app.add_option("-H,--hosts", hosts, "host:slots,... (default localhost:np)");
  app.add_option("-x", xs, "Forward VAR or set VAR=value in every rank's environment")
      ->allow_extra_args(false);
  app.add_option("--output-filename", o.output_dir,
                 "Also write DIR/rank.N/stdout and DIR/rank.N/stderr");
  app.add_flag("--verbose", o.verbose, "Print the rendezvous address and each rank's start");
  app.add_flag("--no-prefix", [&o](int64_t) { o.prefix = false; },
               "Do not prefix output lines with [rank]<stdout>:");
  app.add_flag("--mpi", o.mpi,
               "Start the ranks with Open MPI's mpirun (KRUG_CPU_OPERATIONS=mpi unless set)");
  app.add_option("--start-timeout", o.start_timeout_s, "Seconds to start remote ranks")
      ->check(number_at_least(0, false));
  app.add_option("--fusion-threshold-mb", k.fusion_threshold_mb, "KRUG_FUSION_THRESHOLD in MiB")
      ->check(number_at_least(0, true));
  app.add_option("--cycle-time-ms", k.cycle_time_ms, "KRUG_CYCLE_TIME")
      ->check(number_at_least(0, false));
  app.add_option("--timeline-filename", k.timeline, "KRUG_TIMELINE");
  app.add_option("--timeout-seconds", k.timeout_s, "KRUG_TIMEOUT_SECONDS")
      ->check(number_at_least(0, false));
  app.add_option("--log-level", k.log_level, "KRUG_LOG_LEVEL: trace|debug|info|warning|error|fatal");
  app.add_option("--stall-check-seconds", k.stall_check_s, "KRUG_STALL_CHECK_TIME_SECONDS")
      ->check(number_at_least(0, true));
  app.add_option("--stall-shutdown-seconds", k.stall_shutdown_s,
                 "KRUG_STALL_SHUTDOWN_TIME_SECONDS")
      ->check(number_at_least(0, true));
  app.add_option("--cache-capacity", k.cache_capacity, "KRUG_CACHE_CAPACITY (0 disables)")
      ->check(number_at_least(0, true));
  // Stop at the first positional: the rest, options included, belongs to the rank command.
  app.prefix_command();
}

// Rewrites "-np" (horovodrun's spelling) to "--np" among krugrun's own arguments only, so a
// command such as `mpirun -np 2` after the first positional is left untouched.
std::vector<std::string> normalize_args(const CLI::App& app, int argc, const char* const* argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--" || a.empty() || a[0] != '-') break;
    if (a == "-np") a = "--np";
    if (a.rfind("-np=", 0) == 0) a = "-" + a;
    if (a.find('=') != std::string::npos) continue;
    const CLI::Option* opt = app.get_option_no_throw(a);
    if (opt == nullptr) break;                 // unknown: CLI11 / the check below reports it
    if (opt->get_items_expected_min() > 0) ++i;  // skip the option's value (flags have none)
  }
  return args;
}

void split_env(const std::vector<std::string>& xs, LaunchOptions& o) {
  for (const auto& x : xs) {
    size_t eq = x.find('=');
    std::string name = x.substr(0, eq);
    bool valid = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0]));
    for (char c : name) valid = valid && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
    if (!valid) throw Error("krugrun: -x '" + x + "': '" + name + "' is not a variable name");
    if (eq == std::string::npos)
      o.forward_env.push_back(name);
    else
      o.set_env.emplace_back(name, x.substr(eq + 1));
  }
}

void set_knobs(const KnobFlags& k, LaunchOptions& o) {
  auto& env = o.knob_env;
  if (k.fusion_threshold_mb) env["KRUG_FUSION_THRESHOLD"] = std::to_string(*k.fusion_threshold_mb * 1024 * 1024);
  if (k.cycle_time_ms) env["KRUG_CYCLE_TIME"] = fmt::format("{}", *k.cycle_time_ms);
  if (k.timeline) env["KRUG_TIMELINE"] = *k.timeline;
  if (k.timeout_s) env["KRUG_TIMEOUT_SECONDS"] = fmt::format("{}", *k.timeout_s);
  if (k.log_level) {
    try {
      log::parse_level(*k.log_level);
    } catch (const Error& e) {
      throw Error(std::string("krugrun: --log-level: ") + e.what());
    }
    env["KRUG_LOG_LEVEL"] = *k.log_level;
  }
  if (k.stall_check_s) env["KRUG_STALL_CHECK_TIME_SECONDS"] = fmt::format("{}", *k.stall_check_s);
  if (k.stall_shutdown_s)
    env["KRUG_STALL_SHUTDOWN_TIME_SECONDS"] = fmt::format("{}", *k.stall_shutdown_s);
  if (k.cache_capacity) env["KRUG_CACHE_CAPACITY"] = std::to_string(*k.cache_capacity);
}

void take_command(std::vector<std::string> rest, LaunchOptions& o) {
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
  else if (!rest.empty() && rest.front().size() > 1 && rest.front()[0] == '-')
    throw Error("krugrun: unknown option '" + rest.front() + "' (see krugrun --help)");
  if (rest.empty()) throw Error("krugrun: no command given; usage: krugrun -np N command args...");
  o.command = std::move(rest);
}

}  // namespace

std::variant<LaunchOptions, int> parse_command_line(int argc, const char* const* argv) {
  CLI::App app{"krugrun: start N ranks of a krug (or Horovod) training command", "krugrun"};
  app.footer("Synopsis: krugrun -np N [-H host:slots,...] [options] command [args...]\n"
             "Example: krugrun -np 4 -H localhost:4 python3 train.py --lr 0.1\n");
  LaunchOptions o;
  KnobFlags k;
  std::vector<std::string> xs;
  std::string hosts;
  add_flags(app, o, k, xs, hosts);
  std::vector<std::string> args = normalize_args(app, argc, argv);
  try {
    std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
    app.parse(args);
    split_env(xs, o);
    set_knobs(k, o);
    if (app.count("--np") == 0) throw Error("krugrun: -np N is required (see krugrun --help)");
    take_command(app.remaining(), o);
    o.hosts = app.count("-H") ? parse_hosts(hosts) : std::vector<HostSlots>{{"localhost", o.np}};
    layout_ranks(o.hosts, o.np);  // checks -np >= 1 and that the slots cover it
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return o;
}

}  // namespace krug::run
