#include "transport/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "krug/types.h"
#include "net/socket.h"

namespace krug::transport {
namespace {

std::string random_tag() {
  std::random_device device;
  return fmt::format("{:08x}{:08x}", device(), device());
}

// Unlinks the name when it goes out of scope unless released: the creator's guard against
// leaving a segment behind when set-up fails half way.
class UnlinkGuard {
 public:
  explicit UnlinkGuard(std::string name) : name_(std::move(name)) {}
  ~UnlinkGuard() {
    if (!name_.empty()) ::shm_unlink(name_.c_str());
  }
  void unlink_now() {
    ::shm_unlink(name_.c_str());
    name_.clear();
  }

 private:
  std::string name_;
};

}  // namespace

std::string segment_prefix(const std::string& job_id) {
  std::string clean;
  for (char c : job_id)
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') clean += c;
  if (clean.empty()) clean = "nojob";
  return "krug-" + clean + "-";
}

int remove_job_segments(const std::string& job_id) {
  const std::string prefix = segment_prefix(job_id);
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return 0;
  int removed = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(prefix, 0) == 0 && ::shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

Segment::Segment(int member, int size, size_t bytes, const std::string& job_id,
                 rendezvous::Store& store, std::chrono::milliseconds timeout)
    : bytes_(bytes) {
  std::unique_ptr<UnlinkGuard> guard;
  net::Fd fd;
  if (member == 0) {
    name_ = "/" + segment_prefix(job_id) + random_tag();
    fd = net::Fd(::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
    if (!fd.valid())
      throw Error(fmt::format("shared-memory data plane: cannot create {} in /dev/shm: {}; set "
                              "KRUG_CPU_OPERATIONS=gloo to use TCP instead",
                              name_, std::strerror(errno)));
    guard = std::make_unique<UnlinkGuard>(name_);
    // posix_fallocate reserves the pages now: a full /dev/shm (64 MiB in a default Docker
    // container) is an error here rather than a SIGBUS in the middle of a collective.
    if (int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes)); err != 0)
      throw Error(fmt::format("shared-memory data plane: cannot reserve {} MiB in /dev/shm for "
                              "{} ranks: {}; enlarge /dev/shm (docker run --shm-size=1g) or set "
                              "KRUG_CPU_OPERATIONS=gloo",
                              (bytes + (1 << 20) - 1) >> 20, size, std::strerror(err)));
    store.set("shm/name", rendezvous::Bytes(name_.begin(), name_.end()));
  } else {
    const auto value = store.get("shm/name", timeout);
    name_.assign(value.begin(), value.end());
    fd = net::Fd(::shm_open(name_.c_str(), O_RDWR | O_CLOEXEC, 0));
    if (!fd.valid())
      throw Error(fmt::format("shared-memory data plane: cannot open {} made by the process "
                              "set's first rank: {}; are all ranks of the set on one host, run "
                              "by the same user?",
                              name_, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || static_cast<size_t>(st.st_size) != bytes)
      throw Error(fmt::format("shared-memory data plane: {} has {} bytes, expected {}: ranks "
                              "disagree on the segment layout (different krug builds?)",
                              name_, static_cast<long long>(st.st_size), bytes));
  }
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (mapped == MAP_FAILED)
    throw Error(fmt::format("shared-memory data plane: mmap of {} ({} bytes) failed: {}", name_,
                            bytes, std::strerror(errno)));
  data_ = static_cast<uint8_t*>(mapped);
  // The last member to map announces it; the creator then unlinks the name, so nothing is left
  // in /dev/shm whatever happens to the job later.
  try {
    if (store.add("shm/mapped", 1) == size) store.set("shm/all_mapped", {1});
    if (member == 0) {
      store.wait({"shm/all_mapped"}, timeout);
      guard->unlink_now();
    }
  } catch (...) {
    ::munmap(data_, bytes_);
    throw;
  }
}

Segment::~Segment() {
  if (data_) ::munmap(data_, bytes_);
}

}  // namespace krug::transport
