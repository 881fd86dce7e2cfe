// Host list parsing and rank layout: pure functions, unit-tested without processes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace krug::run {

struct HostSlots {
  std::string host;
  int slots = 0;
};

// Parses horovodrun's -H syntax "host1:2,host2:4" (a bare "host" means one slot). Throws
// krug::Error with the offending entry and the expected form on empty names, bad or
// non-positive slot counts, empty entries and hosts listed twice.
std::vector<HostSlots> parse_hosts(std::string_view spec);

// Where one rank runs and its coordinates. Ranks fill hosts in -H order, host by host.
struct RankSlot {
  int rank = 0, size = 0;
  int local_rank = 0, local_size = 0;  // index within its host, ranks on that host
  int cross_rank = 0, cross_size = 0;  // index of its host, number of hosts used
  std::string host;
};

// Lays out `np` ranks over `hosts`, filling each host before the next; hosts left without a
// rank are not used. cross_rank/cross_size follow Horovod: the index among, and the number of,
// ranks with the same local_rank. Throws krug::Error when np < 1 or the slots do not cover np.
std::vector<RankSlot> layout_ranks(const std::vector<HostSlots>& hosts, int np);

// Number of distinct hosts in a layout.
int count_hosts(const std::vector<RankSlot>& layout);

// Parses a hostfile (horovodrun / mpirun syntax): one "host slots=N" or "host" (one slot) per
// line, '#' comments and blank lines ignored. Throws krug::Error naming path:line and the fix.
std::vector<HostSlots> parse_hostfile(std::string_view text, const std::string& path);
std::vector<HostSlots> read_hostfile(const std::string& path);

// True for names that mean this machine: localhost, 127.x.y.z, `this_hostname` and any address
// in `local_addresses` (net::local_addresses(): this network namespace's interfaces).
bool is_local_host(std::string_view host, std::string_view this_hostname,
                   const std::vector<std::string>& local_addresses = {});

// gethostname(), or "localhost" if that fails.
std::string local_hostname();

}  // namespace krug::run
