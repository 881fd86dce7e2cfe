// Which members of a process set share a host: the topology the hierarchical allreduce works on.
// A pure function of the members' host names, so every rank, given the same names (the control
// plane hands every rank the coordinator's table), derives the same layout.
#pragma once

#include <string>
#include <vector>

namespace krug::collectives {

struct HostLayout {
  // hosts[h]: indexes in the set of the members on host h, ascending. Hosts are ordered by their
  // lowest member, so for krugrun's host-by-host layout host h holds the h-th block of ranks.
  std::vector<std::vector<int>> hosts;

  // `host_of_member[i]` names the host of the set's i-th member.
  static HostLayout from_host_names(const std::vector<std::string>& host_of_member);

  int members() const;
  // Position of member `index`: its host, and its place among that host's members.
  int host_of(int index) const;
  int local_index(int index) const;
  // Members on the most populated host; also the number of slices the allreduce splits into.
  int max_local_size() const;
  // Several hosts, and more than one member on at least one of them: only then does the
  // hierarchical allreduce differ from the flat one (one host: it is the flat reduction inside
  // that host; one member per host: it is the flat reduction across hosts).
  bool has_hierarchy() const;
  // "[0 1] [2 3]": members per host, for logs and tests.
  std::string describe() const;
};

}  // namespace krug::collectives
