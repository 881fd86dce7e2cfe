#include "api/op_name_counters.h"

#include <fmt/format.h>

namespace krug {

std::string OpNameCounters::next(std::string_view kind, int32_t process_set) {
  uint64_t n;
  {
    std::lock_guard lock(mu_);
    n = counters_[{std::string(kind), process_set}]++;
  }
  return fmt::format("{}.noname.{}", kind, n);
}

}  // namespace krug
