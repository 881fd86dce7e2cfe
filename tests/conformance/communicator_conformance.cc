#include "communicator_conformance.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include "reduce/reduce.h"

namespace krug::collectives::conformance {
namespace {

constexpr DataType kAllTypes[] = {
    DataType::kUInt8,  DataType::kInt8,     DataType::kInt16,   DataType::kInt32,
    DataType::kInt64,  DataType::kUInt16,   DataType::kUInt32,  DataType::kUInt64,
    DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
    DataType::kBool};

std::string where(const Communicator& comm, const std::string& what) {
  return what + " on member " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) +
         " (" + comm.backend_name() + ")";
}

// Bitwise equality, naming the first element that differs (a whole-buffer dump helps nobody).
void expect_same(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                 size_t element_bytes, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (got == want) return;
  size_t i = 0;
  while (std::memcmp(got.data() + i * element_bytes, want.data() + i * element_bytes,
                     element_bytes) == 0)
    ++i;
  ADD_FAILURE() << what << ": element " << i << " of " << got.size() / element_bytes
                << " differs from the reference";
}

size_t sum(const std::vector<size_t>& v, size_t end) {
  return std::accumulate(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(end), size_t{0});
}

// The TCP plane's tree: pairs (0 1) (2 3) ... folded until a power of two k of units is left,
// then unit i combined with unit i + m/2 while m halves from k.
std::vector<uint8_t> tcp_tree_fold(std::vector<std::vector<uint8_t>> values, DataType dtype,
                                   ReduceOp op, size_t count) {
  size_t k = 1;
  while (k * 2 <= values.size()) k *= 2;
  const size_t paired = values.size() - k;
  std::vector<std::vector<uint8_t>> units;
  for (size_t i = 0; i < k; ++i) {
    if (i < paired) {
      reduce::reduce_into(dtype, op, values[2 * i].data(), values[2 * i + 1].data(), count);
      units.push_back(std::move(values[2 * i]));
    } else {
      units.push_back(std::move(values[i + paired]));
    }
  }
  for (size_t m = k; m > 1; m /= 2)
    for (size_t i = 0; i < m / 2; ++i)
      reduce::reduce_into(dtype, op, units[i].data(), units[i + m / 2].data(), count);
  return std::move(units[0]);
}

// Members' buffers (input_of(member)) reduced in `association`'s order by krug's kernels.
std::vector<uint8_t> fold(const Association& association, DataType dtype, ReduceOp op, size_t count,
                          const std::function<std::vector<uint8_t>(int)>& input_of) {
  std::vector<std::vector<uint8_t>> partials;
  for (const auto& members : association.groups) {
    std::vector<uint8_t> group = input_of(members[0]);
    for (size_t k = 1; k < members.size(); ++k)
      reduce::reduce_into(dtype, op, group.data(), input_of(members[k]).data(), count);
    partials.push_back(std::move(group));
  }
  if (association.across == Fold::kTcpTree)
    return tcp_tree_fold(std::move(partials), dtype, op, count);
  for (size_t g = 1; g < partials.size(); ++g)
    reduce::reduce_into(dtype, op, partials[0].data(), partials[g].data(), count);
  return std::move(partials[0]);
}

void check_allreduce(Communicator& comm, const Association& association, DataType dtype,
                     ReduceOp op, size_t count) {
  auto data = input(comm.rank(), dtype, count);
  comm.allreduce(data.data(), count, dtype, op);
  expect_same(data, reference(dtype, op, count, association), dtype_size(dtype),
              where(comm, fmt::format("allreduce {} of {} {}", reduce_op_name(op), count,
                                      dtype_name(dtype))));
}

// Every dtype and op over counts that take one step or many (and both shared-memory paths).
void allreduce_every_dtype_op_and_count(Communicator& comm, const Association& association) {
  for (DataType dtype : kAllTypes)
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{70001}})
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax})
        check_allreduce(comm, association, dtype, op, count);
  for (DataType dtype : {DataType::kInt32, DataType::kFloat32, DataType::kFloat16})
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kProduct})
      check_allreduce(comm, association, dtype, op, 1000);
  check_allreduce(comm, association, DataType::kFloat32, ReduceOp::kSum, size_t{1} << 20);
}

// Where a tensor sits in a fused buffer changes which member reduces its elements and how they
// are cut; each element's result must not change by a bit.
void allreduce_is_layout_independent(Communicator& comm, const Association& association) {
  const size_t count = 1001, bytes = count * sizeof(float);
  const auto want = reference(DataType::kFloat32, ReduceOp::kSum, count, association);
  for (size_t offset : {size_t{0}, size_t{1}, size_t{333}, size_t{4097}}) {
    const auto x = input(comm.rank(), DataType::kFloat32, count);
    std::vector<uint8_t> fused((offset + count + 5) * sizeof(float), 0);
    std::memcpy(fused.data() + offset * sizeof(float), x.data(), bytes);
    comm.allreduce(fused.data(), offset + count + 5, DataType::kFloat32, ReduceOp::kSum);
    const std::vector<uint8_t> got(fused.begin() + offset * sizeof(float),
                                   fused.begin() + offset * sizeof(float) + bytes);
    expect_same(got, want, sizeof(float), where(comm, "offset " + std::to_string(offset)));
  }
}

// allreduce_parts (where a backend has it) is bitwise the fusion buffer's result: inputs
// scaled, reduced as one buffer, results scaled; a null input counts as zeros, a null output
// is dropped. Elsewhere it refuses, saying so, without communicating.
void allreduce_parts_equal_one_fused_buffer(Communicator& comm, const Association& association) {
  const DataType dtype = DataType::kFloat32;
  const std::vector<size_t> counts = {3, 0, 1000, 5, 70001, 2};
  if (!comm.has_allreduce_parts()) {
    EXPECT_THROW(comm.allreduce_parts({}, dtype, ReduceOp::kSum, 1.0, 1.0), Error);
    return;
  }
  const double prescale = 0.5, postscale = 1.0 / 3;
  // Reference: each member's concatenation (part 3 null: zeros), prescaled, reduced, scaled.
  const size_t total = sum(counts, counts.size());
  std::vector<std::vector<uint8_t>> concatenated;
  for (int m = 0; m < comm.size(); ++m) {
    auto all = input(m, dtype, total);
    std::memset(all.data() + sum(counts, 3) * sizeof(float), 0, counts[3] * sizeof(float));
    reduce::scale(dtype, all.data(), total, prescale);
    concatenated.push_back(std::move(all));
  }
  auto want = fold(association, dtype, ReduceOp::kSum, total,
                   [&](int m) { return concatenated[static_cast<size_t>(m)]; });
  reduce::scale(dtype, want.data(), total, postscale);

  const auto mine = input(comm.rank(), dtype, total);
  std::vector<std::vector<uint8_t>> in(counts.size()), out(counts.size());
  std::vector<FusedPart> parts;
  for (size_t p = 0; p < counts.size(); ++p) {
    const size_t at = sum(counts, p) * sizeof(float), bytes = counts[p] * sizeof(float);
    in[p].assign(mine.begin() + at, mine.begin() + at + bytes);
    out[p].assign(bytes, 0xEE);
    FusedPart part{in[p].data(), out[p].data(), counts[p]};
    if (p == 3) part.in = nullptr;                  // a joined member's zeros
    if (p == 1 || p == 4) part.out = in[p].data();  // in place
    if (p == 5) part.out = nullptr;                 // result not kept
    parts.push_back(part);
  }
  comm.allreduce_parts(parts, dtype, ReduceOp::kSum, prescale, postscale);
  for (size_t p = 0; p < counts.size(); ++p) {
    if (p == 5) continue;
    const size_t at = sum(counts, p) * sizeof(float), bytes = counts[p] * sizeof(float);
    const std::vector<uint8_t> expected(want.begin() + at, want.begin() + at + bytes);
    expect_same(p == 1 || p == 4 ? in[p] : out[p], expected, sizeof(float),
                where(comm, "part " + std::to_string(p)));
  }
}

void reducescatter_uneven_counts(Communicator& comm, const Association& association) {
  const int n = comm.size(), me = comm.rank();
  std::vector<size_t> counts(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = r % 3 == 1 ? 0 : 5 + 3 * r;
  const size_t total = sum(counts, counts.size()), before = sum(counts, static_cast<size_t>(me));
  const size_t mine = counts[static_cast<size_t>(me)];
  for (DataType dtype : {DataType::kInt32, DataType::kBFloat16, DataType::kFloat64}) {
    const size_t esize = dtype_size(dtype);
    const auto in = input(me, dtype, total);
    // Reducescatter is flat on every backend (the hierarchical one runs it on its flat one).
    const auto all = reference(dtype, ReduceOp::kSum, total,
                               association.flat == Fold::kLeft ? rank_order(n) : tcp_tree(n));
    std::vector<uint8_t> out(mine * esize + 1, 0xEE);
    comm.reducescatter(in.data(), out.data(), counts, dtype, ReduceOp::kSum);
    EXPECT_EQ(out.back(), 0xEE) << where(comm, "reducescatter wrote past this member's chunk");
    out.pop_back();
    expect_same(
        out,
        std::vector<uint8_t>(all.begin() + before * esize, all.begin() + (before + mine) * esize),
        esize, where(comm, fmt::format("reducescatter {}", dtype_name(dtype))));
  }
}

uint8_t byte_of(int member, size_t i) {
  return static_cast<uint8_t>(member * 31 + i);
}

void allgatherv_uneven_and_empty(Communicator& comm, const Association&) {
  const int n = comm.size(), me = comm.rank();
  for (size_t scale : {size_t{1}, size_t{5000}}) {
    std::vector<size_t> bytes(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) bytes[static_cast<size_t>(r)] = r == 1 ? 0 : (3 + 11 * r) * scale;
    std::vector<uint8_t> want, mine;
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < bytes[static_cast<size_t>(r)]; ++i) {
        want.push_back(byte_of(r, i));
        if (r == me) mine.push_back(byte_of(r, i));
      }
    std::vector<uint8_t> out(want.size(), 0);
    comm.allgatherv(mine.data(), out.data(), bytes);
    expect_same(out, want, 1, where(comm, "allgatherv x" + std::to_string(scale)));
  }
}

void broadcast_from_every_root(Communicator& comm, const Association&) {
  for (int root = 0; root < comm.size(); ++root)
    for (size_t count : {size_t{0}, size_t{1}, size_t{12345}}) {
      auto data = input(comm.rank(), DataType::kFloat64, count);
      comm.broadcast(data.data(), data.size(), root);
      expect_same(
          data, input(root, DataType::kFloat64, count), sizeof(double),
          where(comm, "broadcast of " + std::to_string(count) + " from " + std::to_string(root)));
    }
}

void alltoallv_uneven_splits(Communicator& comm, const Association&) {
  const int n = comm.size(), me = comm.rank();
  for (size_t scale : {size_t{1}, size_t{3000}}) {
    // Member s sends ((s + 2 d) % 4) * scale bytes to member d, each byte 16 s + d.
    auto amount = [&](int s, int d) { return static_cast<size_t>((s + 2 * d) % 4) * scale; };
    std::vector<size_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
    std::vector<uint8_t> in, want;
    for (int d = 0; d < n; ++d) {
      send[static_cast<size_t>(d)] = amount(me, d);
      in.insert(in.end(), amount(me, d), static_cast<uint8_t>(16 * me + d));
    }
    for (int s = 0; s < n; ++s) {
      recv[static_cast<size_t>(s)] = amount(s, me);
      want.insert(want.end(), amount(s, me), static_cast<uint8_t>(16 * s + me));
    }
    std::vector<uint8_t> out(want.size(), 0);
    comm.alltoallv(in.data(), send, out.data(), recv);
    expect_same(out, want, 1, where(comm, "alltoallv x" + std::to_string(scale)));
  }
}

// Around the ring both ways, then one direction only (member 0 sends, member 1 receives).
void sendrecv_around_the_ring(Communicator& comm, const Association&) {
  const int n = comm.size(), me = comm.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{1000}, size_t{100000}}) {
    std::vector<uint8_t> out(bytes, static_cast<uint8_t>(me)), in(bytes, 0xFF);
    comm.sendrecv(out.data(), bytes, next, in.data(), bytes, prev);
    expect_same(in, std::vector<uint8_t>(bytes, static_cast<uint8_t>(prev)), 1,
                where(comm, "sendrecv of " + std::to_string(bytes) + " bytes"));
    comm.sendrecv(out.data(), bytes, prev, in.data(), bytes, next);
    expect_same(in, std::vector<uint8_t>(bytes, static_cast<uint8_t>(next)), 1,
                where(comm, "sendrecv backwards of " + std::to_string(bytes) + " bytes"));
  }
  if (n >= 2 && me <= 1) {
    std::vector<uint8_t> data(777, me == 0 ? 42 : 0);
    if (me == 0)
      comm.send(data.data(), data.size(), 1);
    else
      comm.recv(data.data(), data.size(), 0);
    expect_same(data, std::vector<uint8_t>(777, 42), 1, where(comm, "send 0 -> 1"));
  }
}

// An exchange with itself is a copy. A peer outside the set, or this rank in one direction only,
// is an error naming the exchange, found before any message (each member checks its own
// arguments), so the communicator stays usable.
void sendrecv_with_itself_and_bad_peers(Communicator& comm, const Association&) {
  const int n = comm.size(), me = comm.rank();
  std::vector<uint8_t> out(100, static_cast<uint8_t>(me + 1)), in(100, 0);
  comm.sendrecv(out.data(), out.size(), me, in.data(), in.size(), me);
  expect_same(in, out, 1, where(comm, "sendrecv with itself"));
  const auto error_of = [&](int send_to, size_t recv_bytes, int recv_from) -> std::string {
    try {
      comm.sendrecv(out.data(), out.size(), send_to, in.data(), recv_bytes, recv_from);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  const std::pair<std::string, std::string> cases[] = {
      {error_of(n, 0, -1), fmt::format("send of 100 bytes to rank {} on rank {} of {}: peer "
                                       "out of range",
                                       n, me, n)},
      {error_of(-1, 100, -2), "receive of 100 bytes from rank -2"},
      {error_of(me, 100, -1), "itself only in both directions"},
      {error_of(me, 50, me), "sends 100 bytes to itself but expects 50"},
  };
  for (const auto& [message, want] : cases)
    EXPECT_NE(message.find(want), std::string::npos) << where(comm, message);
  comm.sendrecv(out.data(), out.size(), me, in.data(), in.size(), me);
  expect_same(in, out, 1, where(comm, "sendrecv with itself after the errors"));
}

// Collectives of different kinds back to back, each member's calls in the same order, with
// barriers between: nothing of one call is taken for the next.
void mixed_sequence_stays_paired(Communicator& comm, const Association& association) {
  for (int round = 0; round < 3; ++round) {
    check_allreduce(comm, association, DataType::kFloat64, ReduceOp::kSum, 17 + round);
    comm.barrier();
    int32_t root_value = comm.rank() == round % comm.size() ? 1000 + round : -1;
    comm.broadcast(&root_value, sizeof(root_value), round % comm.size());
    EXPECT_EQ(root_value, 1000 + round) << where(comm, "broadcast after allreduce");
    comm.barrier();
  }
}

}  // namespace

Association rank_order(int size) {
  std::vector<int> all(static_cast<size_t>(size));
  std::iota(all.begin(), all.end(), 0);
  return {{all}};
}

Association tcp_tree(int size) {
  Association tree{{}, Fold::kTcpTree, Fold::kTcpTree};
  for (int m = 0; m < size; ++m) tree.groups.push_back({m});
  return tree;
}

std::vector<uint8_t> input(int member, DataType dtype, size_t count) {
  std::vector<uint8_t> out(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    const uint32_t h =
        static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(member + 1) * 40503u;
    const bool is_unsigned = dtype == DataType::kUInt8 || dtype == DataType::kUInt16 ||
                             dtype == DataType::kUInt32 || dtype == DataType::kUInt64;
    const int small = static_cast<int>(h % 7) - 3 + (is_unsigned ? 3 : 0);
    const double wide = std::ldexp(1.0 + (h % 1000003u) / 1000003.0, static_cast<int>(h % 9) - 4);
    void* p = out.data() + i * dtype_size(dtype);
    auto put = [&](auto v) { std::memcpy(p, &v, sizeof(v)); };
    switch (dtype) {
      case DataType::kUInt8:
        put(static_cast<uint8_t>(small));
        break;
      case DataType::kInt8:
        put(static_cast<int8_t>(small));
        break;
      case DataType::kInt16:
        put(static_cast<int16_t>(small));
        break;
      case DataType::kInt32:
        put(static_cast<int32_t>(small));
        break;
      case DataType::kInt64:
        put(static_cast<int64_t>(small));
        break;
      case DataType::kUInt16:
        put(static_cast<uint16_t>(small));
        break;
      case DataType::kUInt32:
        put(static_cast<uint32_t>(small));
        break;
      case DataType::kUInt64:
        put(static_cast<uint64_t>(small));
        break;
      case DataType::kFloat16:
        put(reduce::float_to_half(static_cast<float>(small) / 4));
        break;
      case DataType::kBFloat16:
        put(reduce::float_to_bfloat16(static_cast<float>(small) / 4));
        break;
      case DataType::kFloat32:
        put(static_cast<float>(wide));
        break;
      case DataType::kFloat64:
        put(wide);
        break;
      case DataType::kBool:
        put(static_cast<uint8_t>(h % 3 == 0));
        break;
    }
  }
  return out;
}

std::vector<uint8_t> reference(DataType dtype, ReduceOp op, size_t count,
                               const Association& association) {
  return fold(association, dtype, op, count, [&](int m) { return input(m, dtype, count); });
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"AllreduceEveryDtypeOpAndCount", allreduce_every_dtype_op_and_count},
      {"AllreduceIsLayoutIndependent", allreduce_is_layout_independent},
      {"AllreducePartsEqualOneFusedBuffer", allreduce_parts_equal_one_fused_buffer},
      {"ReducescatterUnevenCounts", reducescatter_uneven_counts},
      {"AllgathervUnevenAndEmpty", allgatherv_uneven_and_empty},
      {"BroadcastFromEveryRoot", broadcast_from_every_root},
      {"AlltoallvUnevenSplits", alltoallv_uneven_splits},
      {"SendrecvAroundTheRing", sendrecv_around_the_ring},
      {"SendrecvWithItselfAndBadPeers", sendrecv_with_itself_and_bad_peers},
      {"MixedSequenceStaysPaired", mixed_sequence_stays_paired},
  };
  return all;
}

}  // namespace krug::collectives::conformance
