#include "run/elastic/discovery.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <cstring>
#include <set>

#include "krug/types.h"
#include "run/launch/process.h"
#include "run/launch/rank_env.h"
#include "run/launch/starter.h"

namespace krug::run {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

}  // namespace

std::vector<HostSlots> parse_discovery_output(std::string_view text, const std::string& script,
                                              int default_slots) {
  std::vector<HostSlots> hosts;
  std::set<std::string> seen;
  int line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = trim(text.substr(pos, end - pos));
    pos = end + 1;
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    auto bad = [&](std::string_view why) {
      return Error(
          fmt::format("krugrun: host discovery script '{}', output line {}: '{}': {}; "
                      "each line must be host:slots (or host for --slots-per-host)",
                      script, line_no, line, why));
    };
    HostSlots h;
    const size_t colon = line.rfind(':');
    if (colon == std::string_view::npos) {
      h.host = std::string(line);
      h.slots = default_slots;
    } else {
      h.host = std::string(trim(line.substr(0, colon)));
      std::string_view n = trim(line.substr(colon + 1));
      auto [p, ec] = std::from_chars(n.data(), n.data() + n.size(), h.slots);
      if (ec != std::errc() || p != n.data() + n.size() || h.slots < 1)
        throw bad("the slot count must be a whole number >= 1");
    }
    if (h.host.empty()) throw bad("empty host name");
    if (h.host.find_first_of(" \t") != std::string::npos) throw bad("spaces in the host name");
    if (!seen.insert(h.host).second) throw bad("host listed twice");
    hosts.push_back(std::move(h));
  }
  return hosts;
}

std::string run_discovery_script(const std::string& script, std::chrono::milliseconds timeout) {
  // krugrun's own environment: nothing of the job (no secret) is added.
  StartedRank child = spawn_process({"/bin/sh", "-c", script}, to_envp(current_environment()),
                                    false, "host discovery script '" + script + "'");
  std::string out, err;
  const bool timed_out = !drain_pipes({{&child.stdout_pipe, &out}, {&child.stderr_pipe, &err}},
                                      std::chrono::steady_clock::now() + timeout);
  if (timed_out) {
    child.process.signal_group(SIGKILL);
    throw Error(
        fmt::format("krugrun: host discovery script '{}' ran longer than {} s and was "
                    "killed",
                    script, timeout.count() / 1000.0));
  }
  // Both pipes closed: the script has exited (or closed them); wait for its status.
  const int status = child.process.wait();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string first = err.substr(0, err.find('\n', std::min<size_t>(err.size(), 200)));
    throw Error(fmt::format("krugrun: host discovery script '{}' {}{}", script,
                            describe_wait_status(status), first.empty() ? "" : ": " + first));
  }
  return out;
}

}  // namespace krug::run
