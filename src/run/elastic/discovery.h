// Elastic host discovery: the user's script prints the hosts the job may use now, one
// "host:slots" (or "host", meaning --slots-per-host slots) per line; krugrun runs it every
// second. Parsing is pure and unit-tested.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "run/cli/hosts.h"

namespace krug::run {

// Parses a discovery script's output. Blank lines and '#' comments are skipped. Throws
// krug::Error naming the script and the line when a line is not host[:slots] with slots >= 1,
// or a host is listed twice.
std::vector<HostSlots> parse_discovery_output(std::string_view text, const std::string& script,
                                              int default_slots);

// Runs `script` (through /bin/sh -c, so arguments may follow) and returns its standard output.
// Throws krug::Error with the script, its exit status and the first lines of its standard
// error when it fails, or when it runs longer than `timeout` (it is killed then).
std::string run_discovery_script(const std::string& script, std::chrono::milliseconds timeout);

}  // namespace krug::run
