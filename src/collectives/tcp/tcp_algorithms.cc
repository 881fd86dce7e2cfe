#include "collectives/tcp/tcp_algorithms.h"

#include <bit>
#include <cstring>

#include "collectives/ordered_reduce.h"
#include "reduce/copy.h"
#include "reduce/reduce.h"

namespace krug::collectives::tcp {
namespace {

void send_to(Links& links, int peer, const void* data, size_t bytes) {
  const Send s{peer, data, bytes};
  links.round({&s, 1}, {});
}
void recv_from(Links& links, int peer, void* data, size_t bytes) {
  const Recv r{peer, data, bytes};
  links.round({}, {&r, 1});
}
void exchange(Links& links, int peer, const void* out, size_t out_bytes, void* in,
              size_t in_bytes) {
  const Send s{peer, out, out_bytes};
  const Recv r{peer, in, in_bytes};
  links.round({&s, 1}, {&r, 1});
}

// Byte offset of each unit's block (and the total, last), from the members' byte offsets.
std::vector<size_t> unit_offsets(const Units& units, const std::vector<size_t>& member_offsets) {
  std::vector<size_t> out(static_cast<size_t>(units.count) + 1);
  for (int u = 0; u < units.count; ++u)
    out[static_cast<size_t>(u)] = member_offsets[static_cast<size_t>(units.leader(u))];
  out.back() = member_offsets.back();
  return out;
}

// Recursive halving over units: afterwards, this unit's block of `data` (bytes per unit at
// `offsets`) holds the reduction of every unit's block, associated as tcp_algorithms.h says.
void halve(Links& links, const Units& units, uint8_t* data, const std::vector<size_t>& offsets,
           uint8_t* incoming, DataType dtype, ReduceOp op) {
  const int u = units.of(links.rank());
  const size_t esize = dtype_size(dtype);
  for (int d = units.count / 2; d >= 1; d /= 2) {
    const int lo = u & ~(2 * d - 1);
    const int keep = (u & d) ? lo + d : lo;
    const int give = (u & d) ? lo : lo + d;
    auto at = [&](int unit) { return offsets[static_cast<size_t>(unit)]; };
    const size_t keep_bytes = at(keep + d) - at(keep);
    exchange(links, units.leader(u ^ d), data + at(give), at(give + d) - at(give), incoming,
             keep_bytes);
    reduce::reduce_into(dtype, op, data + at(keep), incoming, keep_bytes / esize);
  }
}

// Recursive doubling allgather over units: each unit starts with its own block of `data` and
// ends with all of them.
void double_up(Links& links, const Units& units, uint8_t* data,
               const std::vector<size_t>& offsets) {
  const int u = units.of(links.rank());
  for (int d = 1; d < units.count; d *= 2) {
    const int mine = u & ~(d - 1);
    const int theirs = mine ^ d;
    auto at = [&](int unit) { return offsets[static_cast<size_t>(unit)]; };
    exchange(links, units.leader(u ^ d), data + at(mine), at(mine + d) - at(mine),
             data + at(theirs), at(theirs + d) - at(theirs));
  }
}

// Recursive doubling with reduction: the same tree as halve(), whole buffers each round.
void double_reduce(Links& links, const Units& units, uint8_t* data, size_t count, uint8_t* incoming,
                   DataType dtype, ReduceOp op) {
  const int u = units.of(links.rank());
  const size_t bytes = count * dtype_size(dtype);
  for (int d = units.count / 2; d >= 1; d /= 2) {
    exchange(links, units.leader(u ^ d), data, bytes, incoming, bytes);
    reduce::reduce_into(dtype, op, data, incoming, count);
  }
}

}  // namespace

Units::Units(int members)
    : count(static_cast<int>(std::bit_floor(static_cast<unsigned>(members)))),
      paired(members - count) {}

uint8_t* Scratch::get(size_t bytes) {
  if (bytes > size_) {
    data_ = std::make_unique_for_overwrite<uint8_t[]>(bytes);
    size_ = bytes;
  }
  return data_.get();
}

void allreduce(Links& links, Buffers& buffers, void* data, size_t count, DataType dtype,
               ReduceOp op) {
  const int me = links.rank();
  if (links.size() == 1 || count == 0) return;
  const Units units(links.size());
  const size_t bytes = count * dtype_size(dtype);
  auto* bytes_of = static_cast<uint8_t*>(data);
  if (units.folded(me)) {
    send_to(links, me - 1, data, bytes);
    recv_from(links, me - 1, data, bytes);
    return;
  }
  uint8_t* incoming = buffers.incoming.get(bytes);
  if (units.leads_pair(me)) {
    recv_from(links, me + 1, incoming, bytes);
    reduce::reduce_into(dtype, op, data, incoming, count);
  }
  if (bytes <= kDoublingBytes || units.count <= 2 || count < static_cast<size_t>(units.count)) {
    double_reduce(links, units, bytes_of, count, incoming, dtype, op);
  } else {
    auto offsets = prefix_offsets(split_counts(count, units.count));
    for (auto& o : offsets) o *= dtype_size(dtype);
    halve(links, units, bytes_of, offsets, incoming, dtype, op);
    double_up(links, units, bytes_of, offsets);
  }
  if (units.leads_pair(me)) send_to(links, me + 1, data, bytes);
}

void reduce_scatter(Links& links, Buffers& buffers, const void* in, void* out,
                    const std::vector<size_t>& counts, DataType dtype, ReduceOp op) {
  const int me = links.rank();
  const size_t esize = dtype_size(dtype);
  const auto m = static_cast<size_t>(me);
  auto member_offsets = prefix_offsets(counts);
  for (auto& o : member_offsets) o *= esize;
  const size_t total = member_offsets.back();
  const size_t mine = counts[m] * esize;
  if (links.size() == 1) {
    if (mine) reduce::move(out, in, mine);
    return;
  }
  const Units units(links.size());
  if (units.folded(me)) {
    send_to(links, me - 1, in, total);
    recv_from(links, me - 1, out, mine);
    return;
  }
  uint8_t* work = buffers.work.get(total);
  uint8_t* incoming = buffers.incoming.get(total);
  if (total) reduce::copy(work, in, total);
  if (units.leads_pair(me)) {
    recv_from(links, me + 1, incoming, total);
    reduce::reduce_into(dtype, op, work, incoming, total / esize);
  }
  halve(links, units, work, unit_offsets(units, member_offsets), incoming, dtype, op);
  if (mine) reduce::copy(out, work + member_offsets[m], mine);
  if (units.leads_pair(me))
    send_to(links, me + 1, work + member_offsets[m + 1], counts[m + 1] * esize);
}

void allgatherv(Links& links, const void* in, void* out,
                const std::vector<size_t>& bytes_per_rank) {
  const int me = links.rank();
  const auto m = static_cast<size_t>(me);
  const auto offsets = prefix_offsets(bytes_per_rank);
  auto* dst = static_cast<uint8_t*>(out);
  if (bytes_per_rank[m] && in != dst + offsets[m])
    reduce::move(dst + offsets[m], in, bytes_per_rank[m]);
  if (links.size() == 1) return;
  const Units units(links.size());
  if (units.folded(me)) {
    send_to(links, me - 1, dst + offsets[m], bytes_per_rank[m]);
    recv_from(links, me - 1, dst, offsets.back());
    return;
  }
  if (units.leads_pair(me)) recv_from(links, me + 1, dst + offsets[m + 1], bytes_per_rank[m + 1]);
  double_up(links, units, dst, unit_offsets(units, offsets));
  if (units.leads_pair(me)) send_to(links, me + 1, dst, offsets.back());
}

void broadcast(Links& links, void* data, size_t bytes, int root) {
  const int n = links.size();
  const int relative = (links.rank() - root + n) % n;
  auto member = [&](int r) { return (r + root) % n; };
  int mask = 1;
  for (; mask < n; mask <<= 1)
    if (relative & mask) {
      recv_from(links, member(relative - mask), data, bytes);
      break;
    }
  std::vector<Send> children;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (relative + mask < n) children.push_back({member(relative + mask), data, bytes});
  links.round(children, {});
}

void alltoallv(Links& links, const void* in, const std::vector<size_t>& send_bytes, void* out,
               const std::vector<size_t>& recv_bytes) {
  const int n = links.size();
  const int me = links.rank();
  const auto [send_offsets, recv_offsets] = copy_own_part(me, in, send_bytes, out, recv_bytes);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  for (int s = 1; s < n; ++s) {
    const auto to = static_cast<size_t>((me + s) % n);
    const auto from = static_cast<size_t>((me - s + n) % n);
    const Send send{static_cast<int>(to), src + send_offsets[to], send_bytes[to]};
    const Recv recv{static_cast<int>(from), dst + recv_offsets[from], recv_bytes[from]};
    links.round({&send, 1}, {&recv, 1});
  }
}

}  // namespace krug::collectives::tcp
