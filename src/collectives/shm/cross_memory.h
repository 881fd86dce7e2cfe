// Cross-memory attach: copying straight out of another process's memory (process_vm_readv),
// one copy where shared memory needs two (into the shared buffer and out again).
//
// The kernel allows it where the reader may ptrace the owner: the same user, and no Yama
// ptrace_scope or container seccomp profile that forbids it. Whether it does is learnt by
// trying (probe_cross_memory), once, by every member of a group: they use it only where all can.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "rendezvous/store.h"

namespace krug::collectives::shm {

// Copies `bytes` at `remote` in process `pid` into `local`. Empty on success; otherwise what
// went wrong (the system's reason), and `local` may be partly written.
std::string read_process_memory(pid_t pid, void* local, const void* remote, size_t bytes);

// Collective over `size` members through `store`: each member offers a word of its memory and
// reads every other's. Returns every member's pid, in member order, where all of them could read
// all the others; empty (on every member) where any could not. Waits up to `timeout` for the
// others' answers.
std::vector<pid_t> probe_cross_memory(int member, int size, rendezvous::Store& store,
                                      std::chrono::milliseconds timeout);

}  // namespace krug::collectives::shm
