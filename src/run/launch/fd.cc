#include "run/launch/fd.h"

#include <fcntl.h>
#include <poll.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "krug/types.h"

namespace krug::run {

Pipe make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw Error(std::string("krugrun: cannot create a pipe: ") + std::strerror(errno));
  return Pipe{Fd(fds[0]), Fd(fds[1])};
}

Fd open_for_writing(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error("krugrun: cannot open '" + path + "' for writing: " + std::strerror(errno));
  return Fd(fd);
}

bool drain_pipes(const std::vector<PipeReader>& pipes,
                 std::chrono::steady_clock::time_point deadline) {
  while (true) {
    std::vector<pollfd> fds;
    std::vector<const PipeReader*> owners;
    for (const auto& p : pipes)
      if (*p.pipe) {
        fds.push_back({p.pipe->get(), POLLIN, 0});
        owners.push_back(&p);
      }
    if (fds.empty()) return true;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) return false;
    if (::poll(fds.data(), fds.size(), static_cast<int>(left)) < 0 && errno != EINTR)
      throw Error(std::string("krugrun: poll failed: ") + std::strerror(errno));
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n > 0)
        owners[i]->text->append(buf, static_cast<size_t>(n));
      else if (n == 0 || (errno != EINTR && errno != EAGAIN))
        owners[i]->pipe->reset();
    }
  }
}

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace krug::run
