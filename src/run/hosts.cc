#include "run/hosts.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <set>

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
                " slots but -H provides only " + std::to_string(total));

  std::vector<RankSlot> ranks;
  int cross_size = 0;
  for (const auto& h : hosts) {
    int on_host = std::min(h.slots, np - static_cast<int>(ranks.size()));
    if (on_host <= 0) break;
    for (int i = 0; i < on_host; ++i) {
      RankSlot r;
      r.rank = static_cast<int>(ranks.size());
      r.size = np;
      r.local_rank = i;
      r.local_size = on_host;
      r.cross_rank = cross_size;
      r.host = h.host;
      ranks.push_back(std::move(r));
    }
    ++cross_size;
  }
  for (auto& r : ranks) r.cross_size = cross_size;
  return ranks;
}

bool is_local_host(std::string_view host, std::string_view this_hostname) {
  return host == "localhost" || host == "127.0.0.1" || host == this_hostname;
}

std::string local_hostname() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace krug::run
