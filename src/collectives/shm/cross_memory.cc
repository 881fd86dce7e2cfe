#include "collectives/shm/cross_memory.h"

#include <fmt/format.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

namespace krug::collectives::shm {
namespace {

// What member m's probe word holds: a reader that gets it read the right process's memory.
uint64_t probe_value(int member) {
  return 0x6b72756700000000ULL | static_cast<uint32_t>(member);  // "krug" and the member
}

rendezvous::Bytes bytes_of(const std::string& s) {
  return rendezvous::Bytes(s.begin(), s.end());
}

std::string text_of(const rendezvous::Bytes& b) {
  return std::string(b.begin(), b.end());
}

}  // namespace

std::string read_process_memory(pid_t pid, void* local, const void* remote, size_t bytes) {
  auto* to = static_cast<uint8_t*>(local);
  const auto* from = static_cast<const uint8_t*>(remote);
  while (bytes > 0) {
    iovec here{to, bytes};
    iovec there{const_cast<uint8_t*>(from), bytes};
    const ssize_t got = ::process_vm_readv(pid, &here, 1, &there, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return fmt::format("process_vm_readv from pid {}: {}", pid, std::strerror(errno));
    if (got == 0) return fmt::format("process_vm_readv from pid {}: read nothing", pid);
    to += got;
    from += got;
    bytes -= static_cast<size_t>(got);
  }
  return {};
}

std::vector<pid_t> probe_cross_memory(int member, int size, rendezvous::Store& store,
                                      std::chrono::milliseconds timeout) {
  // Lives until every member has answered below, so no reader finds it gone.
  const uint64_t word = probe_value(member);
  store.set(fmt::format("cma/{}", member),
            bytes_of(fmt::format("{} {}", ::getpid(), reinterpret_cast<uintptr_t>(&word))));
  std::vector<pid_t> pids(static_cast<size_t>(size));
  bool could = true;
  for (int m = 0; m < size; ++m) {
    std::istringstream offer(text_of(store.get(fmt::format("cma/{}", m), timeout)));
    uintptr_t address = 0;
    offer >> pids[static_cast<size_t>(m)] >> address;
    if (m == member || !could) continue;
    uint64_t seen = 0;
    could = read_process_memory(pids[static_cast<size_t>(m)], &seen,
                                reinterpret_cast<const void*>(address), sizeof seen)
                .empty() &&
            seen == probe_value(m);
  }
  store.set(fmt::format("cma_ok/{}", member), bytes_of(could ? "1" : "0"));
  bool all = true;
  for (int m = 0; m < size; ++m)
    all = text_of(store.get(fmt::format("cma_ok/{}", m), timeout)) == "1" && all;
  return all ? pids : std::vector<pid_t>{};
}

}  // namespace krug::collectives::shm
