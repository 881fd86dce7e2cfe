#include "collectives/communicator.h"

#include <fmt/format.h>

#include <cstring>

namespace krug::collectives {

std::string describe_sendrecv(size_t send_bytes, int send_to, size_t recv_bytes, int recv_from) {
  std::string what;
  if (send_to != -1) what = fmt::format("send of {} bytes to rank {}", send_bytes, send_to);
  if (recv_from != -1)
    what += fmt::format("{}receive of {} bytes from rank {}", what.empty() ? "" : " and ",
                        recv_bytes, recv_from);
  return what;
}

bool Communicator::sendrecv_with_self(const void* send_data, size_t send_bytes, int send_to,
                                      void* recv_data, size_t recv_bytes, int recv_from) const {
  const int me = rank(), n = size();
  const auto fail = [&](std::string_view why) {
    throw Error(fmt::format("{} point-to-point {} on rank {} of {}: {}", backend_name(),
                            describe_sendrecv(send_bytes, send_to, recv_bytes, recv_from), me, n,
                            why));
  };
  if (send_to < -1 || send_to >= n || recv_from < -1 || recv_from >= n) fail("peer out of range");
  if ((send_to == me) != (recv_from == me))
    fail("a rank can exchange with itself only in both directions");
  if (send_to != me) return false;
  if (send_bytes != recv_bytes)
    fail(fmt::format("it sends {} bytes to itself but expects {}", send_bytes, recv_bytes));
  if (send_bytes > 0 && send_data != recv_data) std::memmove(recv_data, send_data, send_bytes);
  return true;
}

}  // namespace krug::collectives
