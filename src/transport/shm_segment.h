// A POSIX shared-memory segment that the ranks of one process set map together.
//
// The first member creates it (O_EXCL, mode 0600) under a name that carries the job id and a
// random tag, the others open it by the name they read from the rendezvous store, and the
// creator unlinks it as soon as every member has mapped it. From then on the memory lives only
// as long as some member's mapping: a normal exit, a crash or a SIGKILL leave nothing in
// /dev/shm. The window between creation and unlink is covered by krugrun, which removes
// /dev/shm/krug-<job id>-* when the job ends (remove_job_segments).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "rendezvous/store.h"

namespace krug::transport {

// "krug-<job id>-" (job id reduced to [A-Za-z0-9_]); every segment of the job starts with it.
std::string segment_prefix(const std::string& job_id);

// Removes /dev/shm/<segment_prefix(job_id)>* left behind by members that died between creating
// and unlinking a segment. Returns how many it removed. Never throws.
int remove_job_segments(const std::string& job_id);

class Segment {
 public:
  // Collective over the `size` members that share `store`'s namespace. Throws krug::Error with
  // what failed (e.g. /dev/shm too small) and what to do.
  Segment(int member, int size, size_t bytes, const std::string& job_id, rendezvous::Store& store,
          std::chrono::milliseconds timeout);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  uint8_t* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
};

}  // namespace krug::transport
