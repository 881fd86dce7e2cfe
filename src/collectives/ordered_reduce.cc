#include "collectives/ordered_reduce.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "reduce/copy.h"
#include "reduce/reduce.h"

namespace krug::collectives {

std::vector<size_t> prefix_offsets(const std::vector<size_t>& sizes) {
  std::vector<size_t> offsets(sizes.size() + 1, 0);
  std::partial_sum(sizes.begin(), sizes.end(), offsets.begin() + 1);
  return offsets;
}

std::vector<size_t> split_counts(size_t count, int size) {
  std::vector<size_t> counts(size);
  for (int r = 0; r < size; ++r)
    counts[r] = count / size + (static_cast<size_t>(r) < count % size ? 1 : 0);
  return counts;
}

void allgather_in_place(Exchange& exchange, void* data, const std::vector<size_t>& bytes_per_rank) {
  const int rank = exchange.rank(), size = exchange.size();
  const auto offsets = prefix_offsets(bytes_per_rank);
  if (offsets[size] == 0) return;
  auto* bytes = static_cast<uint8_t*>(data);
  const Region region{data, offsets[size]};
  exchange.begin({&region, 1}, 1);
  // All receives before any send (see reduce_scatter).
  for (int p = 0; p < size; ++p)
    if (p != rank && bytes_per_rank[p] > 0)
      exchange.recv(bytes + offsets[p], bytes_per_rank[p], p, 0);
  for (int p = 0; p < size; ++p)
    if (p != rank && bytes_per_rank[rank] > 0)
      exchange.send(bytes + offsets[rank], bytes_per_rank[rank], p, 0);
  exchange.wait_recvs(0);
  exchange.wait_sends();
}

void allgatherv(Exchange& exchange, const void* in, void* out,
                const std::vector<size_t>& bytes_per_rank) {
  const int rank = exchange.rank();
  const auto offsets = prefix_offsets(bytes_per_rank);
  auto* dst = static_cast<uint8_t*>(out);
  if (bytes_per_rank[rank] > 0 && dst + offsets[rank] != in)
    reduce::move(dst + offsets[rank], in, bytes_per_rank[rank]);
  if (exchange.size() == 1) return;
  allgather_in_place(exchange, out, bytes_per_rank);
}

std::pair<std::vector<size_t>, std::vector<size_t>> copy_own_part(
    int rank, const void* in, const std::vector<size_t>& send_bytes, void* out,
    const std::vector<size_t>& recv_bytes) {
  auto offsets = std::make_pair(prefix_offsets(send_bytes), prefix_offsets(recv_bytes));
  if (send_bytes[rank] > 0)
    reduce::move(static_cast<uint8_t*>(out) + offsets.second[rank],
                 static_cast<const uint8_t*>(in) + offsets.first[rank], send_bytes[rank]);
  return offsets;
}

void alltoallv(Exchange& exchange, const void* in, const std::vector<size_t>& send_bytes, void* out,
               const std::vector<size_t>& recv_bytes) {
  const int rank = exchange.rank(), size = exchange.size();
  const auto [send_offsets, recv_offsets] = copy_own_part(rank, in, send_bytes, out, recv_bytes);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  // Only buffers with bytes in them: a transport may not register an empty one.
  std::vector<Region> regions;
  if (send_offsets[size] > 0) regions.push_back({in, send_offsets[size]});
  if (recv_offsets[size] > 0) regions.push_back({out, recv_offsets[size]});
  exchange.begin(regions, 1);
  for (int p = 0; p < size; ++p)
    if (p != rank && recv_bytes[p] > 0) exchange.recv(dst + recv_offsets[p], recv_bytes[p], p, 0);
  for (int p = 0; p < size; ++p)
    if (p != rank && send_bytes[p] > 0) exchange.send(src + send_offsets[p], send_bytes[p], p, 0);
  exchange.wait_recvs(0);
  exchange.wait_sends();
}

uint8_t* OrderedReducer::scratch_for(size_t bytes) {
  // Reused across calls and never zero-filled: every byte read was received first.
  if (scratch_size_ < bytes) {
    scratch_ = std::make_unique_for_overwrite<uint8_t[]>(bytes);
    scratch_size_ = bytes;
  }
  return scratch_.get();
}

void OrderedReducer::reduce_scatter(Exchange& exchange, const void* in, void* out,
                                    const std::vector<size_t>& counts, DataType dtype,
                                    ReduceOp op) {
  const int rank = exchange.rank(), size = exchange.size();
  const size_t esize = dtype_size(dtype);
  const auto offsets = prefix_offsets(counts);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  if (size == 1) {
    if (dst != src && counts[0] > 0) reduce::move(dst, src, counts[0] * esize);
    return;
  }
  const size_t max_count = *std::max_element(counts.begin(), counts.end());
  if (max_count == 0) return;
  // Small buffers get small segments: scratch is sized by what actually moves.
  const size_t seg_elems = std::max<size_t>(1, std::min(segment_bytes_ / esize, max_count));
  const size_t steps = (max_count + seg_elems - 1) / seg_elems;
  // Two scratch halves: step s+1's receives land in one while step s is reduced in the other.
  const size_t half_bytes = static_cast<size_t>(size) * seg_elems * esize;
  uint8_t* scratch = scratch_for(2 * half_bytes);
  const Region regions[] = {
      {src, offsets[size] * esize}, {scratch, half_bytes}, {scratch + half_bytes, half_bytes}};
  exchange.begin(regions, steps);

  auto seg_len = [&](int r, size_t step) -> size_t {
    const size_t begin = step * seg_elems;
    return begin >= counts[r] ? 0 : std::min(seg_elems, counts[r] - begin);
  };
  auto post_recvs = [&](size_t step) {
    const size_t n = seg_len(rank, step);
    if (n == 0) return;
    uint8_t* half = scratch + (step % 2) * half_bytes;
    for (int p = 0; p < size; ++p)
      if (p != rank) exchange.recv(half + p * seg_elems * esize, n * esize, p, step);
  };

  // The first receives before any send: a send whose receive is already posted can go straight
  // onto the wire instead of waiting for a "ready to receive" round trip. Then every send at
  // once, so the wire never waits for a reduction.
  post_recvs(0);
  for (size_t step = 0; step < steps; ++step)
    for (int p = 0; p < size; ++p) {
      const size_t n = seg_len(p, step);
      if (p != rank && n > 0)
        exchange.send(src + (offsets[p] + step * seg_elems) * esize, n * esize, p, step);
    }
  for (size_t step = 0; step < steps; ++step) {
    if (step + 1 < steps) post_recvs(step + 1);
    exchange.wait_recvs(step);
    const size_t n = seg_len(rank, step);
    if (n == 0) continue;
    uint8_t* half = scratch + (step % 2) * half_bytes;
    const uint8_t* mine = src + (offsets[rank] + step * seg_elems) * esize;
    auto contribution = [&](int r) { return r == rank ? mine : half + r * seg_elems * esize; };
    // Reduce in rank order into this rank's scratch slot first: `out` may alias the input.
    uint8_t* acc = half + rank * seg_elems * esize;
    reduce::copy(acc, contribution(0), n * esize);
    for (int r = 1; r < size; ++r) reduce::reduce_into(dtype, op, acc, contribution(r), n);
    reduce::copy(dst + step * seg_elems * esize, acc, n * esize);
  }
  exchange.wait_sends();
}

void OrderedReducer::allreduce(Exchange& reduce_scatter_exchange, Exchange& allgather_exchange,
                               void* data, size_t count, DataType dtype, ReduceOp op) {
  const int rank = reduce_scatter_exchange.rank(), size = reduce_scatter_exchange.size();
  if (count == 0 || size == 1) return;
  const auto counts = split_counts(count, size);
  const auto offsets = prefix_offsets(counts);
  const size_t esize = dtype_size(dtype);
  auto* bytes = static_cast<uint8_t*>(data);
  reduce_scatter(reduce_scatter_exchange, data, bytes + offsets[rank] * esize, counts, dtype, op);
  std::vector<size_t> chunk_bytes(size);
  for (int r = 0; r < size; ++r) chunk_bytes[r] = counts[r] * esize;
  allgather_in_place(allgather_exchange, data, chunk_bytes);
}

}  // namespace krug::collectives
