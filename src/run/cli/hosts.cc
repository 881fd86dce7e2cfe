#include "run/cli/hosts.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "krug/types.h"

namespace krug::run {
namespace {

constexpr std::string_view kForm = "expected host:slots[,host:slots...], e.g. localhost:4";

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

HostSlots parse_entry(std::string_view entry, std::string_view spec) {
  auto fail = [&](const std::string& why) {
    return Error("krugrun: bad -H '" + std::string(spec) + "': " + why + "; " + std::string(kForm));
  };
  entry = trim(entry);
  if (entry.empty()) throw fail("empty host entry");
  HostSlots hs;
  size_t colon = entry.rfind(':');
  if (colon == std::string_view::npos) {
    hs.host = std::string(entry);
    hs.slots = 1;
    return hs;
  }
  hs.host = std::string(trim(entry.substr(0, colon)));
  std::string_view count = trim(entry.substr(colon + 1));
  if (hs.host.empty()) throw fail("missing host name in '" + std::string(entry) + "'");
  if (hs.host.find(':') != std::string::npos)
    throw fail("more than one ':' in '" + std::string(entry) + "'");
  auto [end, ec] = std::from_chars(count.data(), count.data() + count.size(), hs.slots);
  if (count.empty() || ec != std::errc() || end != count.data() + count.size())
    throw fail("slot count '" + std::string(count) + "' of host '" + hs.host + "' is not a number");
  if (hs.slots < 1)
    throw fail("host '" + hs.host + "' has " + std::to_string(hs.slots) + " slots; need at least 1");
  return hs;
}

}  // namespace

std::vector<HostSlots> parse_hosts(std::string_view spec) {
  if (trim(spec).empty()) throw Error("krugrun: -H is empty; " + std::string(kForm));
  std::vector<HostSlots> hosts;
  std::set<std::string> seen;
  size_t start = 0;
  while (true) {
    size_t comma = spec.find(',', start);
    auto entry = spec.substr(start, comma == std::string_view::npos ? spec.npos : comma - start);
    HostSlots hs = parse_entry(entry, spec);
    if (!seen.insert(hs.host).second)
      throw Error("krugrun: bad -H '" + std::string(spec) + "': host '" + hs.host +
                  "' is listed twice; give its total slot count once");
    hosts.push_back(std::move(hs));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return hosts;
}

std::vector<RankSlot> layout_ranks(const std::vector<HostSlots>& hosts, int np) {
  if (np < 1) throw Error("krugrun: -np must be at least 1 (got " + std::to_string(np) + ")");
  long total = 0;
  for (const auto& h : hosts) total += h.slots;
  if (total < np)
    throw Error("krugrun: -np " + std::to_string(np) + " needs " + std::to_string(np) +
                " slots but the hosts provide only " + std::to_string(total));

  std::vector<RankSlot> ranks;
  // Horovod's meaning: cross_rank / cross_size number the ranks that share this local_rank (one
  // per host that has that many ranks), which is the host index when hosts are filled evenly.
  std::vector<int> hosts_with_local_rank;
  for (const auto& h : hosts) {
    int on_host = std::min(h.slots, np - static_cast<int>(ranks.size()));
    if (on_host <= 0) break;
    if (static_cast<int>(hosts_with_local_rank.size()) < on_host)
      hosts_with_local_rank.resize(on_host, 0);
    for (int i = 0; i < on_host; ++i) {
      RankSlot r;
      r.rank = static_cast<int>(ranks.size());
      r.size = np;
      r.local_rank = i;
      r.local_size = on_host;
      r.cross_rank = hosts_with_local_rank[i]++;
      r.host = h.host;
      ranks.push_back(std::move(r));
    }
  }
  for (auto& r : ranks) r.cross_size = hosts_with_local_rank[r.local_rank];
  return ranks;
}

int count_hosts(const std::vector<RankSlot>& layout) {
  std::set<std::string> names;
  for (const auto& r : layout) names.insert(r.host);
  return static_cast<int>(names.size());
}

std::vector<HostSlots> parse_hostfile(std::string_view text, const std::string& path) {
  std::vector<HostSlots> hosts;
  std::set<std::string> seen;
  size_t line_no = 0, start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    std::string_view line = text.substr(start, end == std::string_view::npos ? text.npos : end - start);
    start = end == std::string_view::npos ? text.size() + 1 : end + 1;
    ++line_no;
    if (auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (!line.empty() && line.back() == '\r') line = trim(line.substr(0, line.size() - 1));
    if (line.empty()) continue;
    auto fail = [&](const std::string& why) {
      return Error(fmt::format("krugrun: {}:{}: {}; expected 'host slots=N' (or 'host' for one "
                               "slot) per line",
                               path, line_no, why));
    };
    size_t space = line.find_first_of(" \t");
    HostSlots hs;
    hs.host = std::string(line.substr(0, space));
    hs.slots = 1;
    if (space != std::string_view::npos) {
      std::string_view rest = trim(line.substr(space));
      constexpr std::string_view kSlots = "slots=";
      if (rest.substr(0, kSlots.size()) != kSlots)
        throw fail("unexpected '" + std::string(rest) + "'");
      std::string_view count = trim(rest.substr(kSlots.size()));
      auto [ptr, ec] = std::from_chars(count.data(), count.data() + count.size(), hs.slots);
      if (count.empty() || ec != std::errc() || ptr != count.data() + count.size())
        throw fail("slot count '" + std::string(count) + "' is not a number");
      if (hs.slots < 1) throw fail("host '" + hs.host + "' needs at least 1 slot");
    }
    if (hs.host.find(':') != std::string::npos && hs.host.find("::") == std::string::npos)
      throw fail("'" + hs.host + "': write 'host slots=N', not host:N");
    if (!seen.insert(hs.host).second) throw fail("host '" + hs.host + "' is listed twice");
    hosts.push_back(std::move(hs));
  }
  if (hosts.empty()) throw Error("krugrun: hostfile " + path + " lists no hosts");
  return hosts;
}

std::vector<HostSlots> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("krugrun: cannot read hostfile '" + path + "': " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  return parse_hostfile(text.str(), path);
}

bool is_local_host(std::string_view host, std::string_view this_hostname,
                   const std::vector<std::string>& local_addresses) {
  if (host == "localhost" || host == this_hostname || host.substr(0, 4) == "127.") return true;
  return std::find(local_addresses.begin(), local_addresses.end(), host) != local_addresses.end();
}

std::string local_hostname() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace krug::run
