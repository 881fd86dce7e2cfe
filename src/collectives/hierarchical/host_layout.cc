#include "collectives/hierarchical/host_layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "krug/types.h"

namespace krug::collectives {

HostLayout HostLayout::from_host_names(const std::vector<std::string>& host_of_member) {
  HostLayout layout;
  std::map<std::string, size_t> position;  // host name -> index in hosts
  for (size_t i = 0; i < host_of_member.size(); ++i) {
    auto [it, added] = position.try_emplace(host_of_member[i], layout.hosts.size());
    if (added) layout.hosts.emplace_back();
    layout.hosts[it->second].push_back(static_cast<int>(i));
  }
  return layout;
}

int HostLayout::members() const {
  int n = 0;
  for (const auto& h : hosts) n += static_cast<int>(h.size());
  return n;
}

int HostLayout::host_of(int index) const {
  for (size_t h = 0; h < hosts.size(); ++h)
    if (std::binary_search(hosts[h].begin(), hosts[h].end(), index)) return static_cast<int>(h);
  throw Error(fmt::format("host layout {}: no member {}", describe(), index));
}

int HostLayout::local_index(int index) const {
  const auto& members = hosts.at(host_of(index));
  return static_cast<int>(std::lower_bound(members.begin(), members.end(), index) -
                          members.begin());
}

int HostLayout::max_local_size() const {
  size_t most = 0;
  for (const auto& h : hosts) most = std::max(most, h.size());
  return static_cast<int>(most);
}

bool HostLayout::has_hierarchy() const { return hosts.size() > 1 && max_local_size() > 1; }

std::string HostLayout::describe() const {
  std::string text;
  for (const auto& h : hosts) text += fmt::format("{}[{}]", text.empty() ? "" : " ", fmt::join(h, " "));
  return text;
}

}  // namespace krug::collectives
