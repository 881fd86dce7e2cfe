// The open-file limit, which bounds how many connections one process can hold: rank 0's control
// plane and krugrun's rendezvous server hold one per rank.
#pragma once

#include <cstddef>
#include <string_view>

namespace krug::net {

// Raises this process's soft RLIMIT_NOFILE to its hard limit (what an unprivileged process may
// do); returns the soft limit now in force.
size_t raise_open_file_limit();

// raise_open_file_limit(), then throws krug::Error when the limit is below `needed`, naming
// `who` ("rank 0's control plane for 4096 ranks"), the limit and how to raise it: better than
// failing later in accept() with "Too many open files" half-way through a start.
void require_open_files(size_t needed, std::string_view who);

}  // namespace krug::net
