// Small RAII owners for file descriptors, so every exit path (including exceptions while ranks
// are being started) closes what it opened.
#pragma once

#include <unistd.h>

#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace krug::run {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

struct Pipe {
  Fd read;
  Fd write;
};

// A close-on-exec pipe; throws krug::Error on failure.
Pipe make_pipe();

// Opens `path` for writing (created, truncated, close-on-exec); throws krug::Error naming it.
Fd open_for_writing(const std::string& path);

// Writes all of `data`, retrying on EINTR and short writes. Returns false when the fd is gone
// (EPIPE and friends): the launcher keeps supervising ranks even if its own output is closed.
bool write_all(int fd, std::string_view data);

// A pipe read to its end into `text`; drain_pipes() closes `pipe` at end of file.
struct PipeReader {
  Fd* pipe;
  std::string* text;
};
// Reads every pipe until each is at end of file (closed) or `deadline` passes; returns whether
// they all ended. Child processes' output (host checks, the discovery script) is read this way.
bool drain_pipes(const std::vector<PipeReader>& pipes,
                 std::chrono::steady_clock::time_point deadline);

}  // namespace krug::run
