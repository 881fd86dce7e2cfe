#include "net/limits.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include "krug/types.h"

namespace krug::net {

size_t raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return limit.rlim_cur == RLIM_INFINITY ? SIZE_MAX : static_cast<size_t>(limit.rlim_cur);
}

void require_open_files(size_t needed, std::string_view who) {
  const size_t limit = raise_open_file_limit();
  if (limit >= needed) return;
  throw Error(
      fmt::format("{} needs about {} open files, but this process may open only {} "
                  "(the hard limit, `ulimit -Hn`); raise it on this host, e.g. in "
                  "/etc/security/limits.conf (nofile), LimitNOFILE= of a systemd unit, or "
                  "`ulimit -n {}` as root before starting the job",
                  who, needed, limit, needed));
}

}  // namespace krug::net
