// The counters behind krug::unnamed_op_name: one per operation kind and process set. The
// runtime makes a fresh set at every init(), so names start again at 0 in every initialization.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace krug {

class OpNameCounters {
 public:
  // "<kind>.noname.<n>" with this (kind, process set)'s next n.
  std::string next(std::string_view kind, int32_t process_set);

 private:
  std::mutex mu_;
  std::map<std::pair<std::string, int32_t>, uint64_t> counters_;
};

}  // namespace krug
