// krugrun's host lists (run/cli/hosts.h) on untrusted text: the same text as -H's value and as
// a hostfile. Each parses or throws krug::Error; a list that parses, written back in its own
// syntax, parses to the same list, and lays out ranks over all its slots.
#include "run/cli/hosts.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "krug/types.h"

namespace {

using krug::run::HostSlots;

// At most this many ranks are laid out: enough to cross every host of a fuzzed list.
constexpr long kMaxRanks = 4096;

bool same(const std::vector<HostSlots>& a, const std::vector<HostSlots>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const auto& x, const auto& y) {
    return x.host == y.host && x.slots == y.slots;
  });
}

void check_layout(const std::vector<HostSlots>& hosts) {
  long slots = 0;
  for (const auto& h : hosts) slots += h.slots;
  const int np = static_cast<int>(std::min(slots, kMaxRanks));
  const auto layout = krug::run::layout_ranks(hosts, np);
  if (static_cast<int>(layout.size()) != np) __builtin_trap();
}

void check_h_flag(std::string_view text) {
  std::vector<HostSlots> hosts;
  try {
    hosts = krug::run::parse_hosts(text);
  } catch (const krug::Error&) {
    return;
  }
  std::string again;
  for (const auto& h : hosts)
    again += (again.empty() ? "" : ",") + h.host + ":" + std::to_string(h.slots);
  if (!same(krug::run::parse_hosts(again), hosts)) __builtin_trap();
  check_layout(hosts);
}

void check_hostfile(std::string_view text) {
  std::vector<HostSlots> hosts;
  try {
    hosts = krug::run::parse_hostfile(text, "hostfile");
  } catch (const krug::Error&) {
    return;
  }
  std::string again;
  for (const auto& h : hosts) again += h.host + " slots=" + std::to_string(h.slots) + "\n";
  if (!same(krug::run::parse_hostfile(again, "hostfile"), hosts)) __builtin_trap();
  check_layout(hosts);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check_h_flag(text);
  check_hostfile(text);
  return 0;
}
