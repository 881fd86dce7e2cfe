#include "controller/message.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <utility>

#include "net/socket.h"

namespace krug::controller {
namespace {

// Bumped whenever the layout below changes, so ranks built from different versions fail loudly.
constexpr uint32_t kRequestMagic = 0x4b520002;   // "KR" v2
constexpr uint32_t kResponseMagic = 0x4b530003;  // "KS" v3

// A list on the wire: its length, then each element as `put` writes it.
template <typename T, typename Put>
void put_list(net::Writer& w, const std::vector<T>& items, Put put) {
  w.u32(static_cast<uint32_t>(items.size()));
  for (const T& item : items) put(w, item);
}

// The fewest bytes each kind of element takes on the wire (empty strings and lists): a list's
// length is checked against them before its elements are allocated. A bound below the true
// size is safe, only looser.
constexpr size_t kMinInt = 8;
constexpr size_t kMinIdRun = 8;
// Most cache ids one list may carry: far above any cache's capacity (its ids are its indexes).
constexpr size_t kMaxIds = size_t{1} << 24;
constexpr size_t kMinList = 4;  // a string, or a list of lists: just its length
constexpr size_t kMinTerms = 3 + 4 * 8;
constexpr size_t kMinRequest = kMinList + kMinTerms + 3 * kMinList + 8 + kMinList + 8 + 1;
constexpr size_t kMinResponse = 1 + kMinList;  // a cached one: its flag and ids
constexpr size_t kMinStall = kMinList + 1 + 8 + 2 * kMinList + 8;

template <typename T, typename Get>
std::vector<T> get_list(net::Reader& r, Get get, size_t min_bytes_each) {
  std::vector<T> items(r.count(min_bytes_each));
  for (T& item : items) item = get(r);
  return items;
}

template <typename T>
void put_ints(net::Writer& w, const std::vector<T>& v) {
  put_list(w, v, [](net::Writer& w, T x) { w.i64(static_cast<int64_t>(x)); });
}

template <typename T>
std::vector<T> get_ints(net::Reader& r) {
  return get_list<T>(
      r, [](net::Reader& r) { return static_cast<T>(r.i64()); }, kMinInt);
}

// Cache ids: a steady-state list is little else. They go as runs of consecutive ids (first,
// length), in the list's order, so a step's tensors, cached one after another, cost eight bytes
// however many they are: the coordinator's traffic per step stays flat as models grow.
void put_ids(net::Writer& w, const std::vector<uint32_t>& ids) {
  std::vector<std::pair<uint32_t, uint32_t>> runs;
  for (uint32_t id : ids) {
    if (!runs.empty() && runs.back().first + runs.back().second == id)
      ++runs.back().second;
    else
      runs.emplace_back(id, 1);
  }
  put_list(w, runs, [](net::Writer& w, const std::pair<uint32_t, uint32_t>& run) {
    w.u32(run.first);
    w.u32(run.second);
  });
}

std::vector<uint32_t> get_ids(net::Reader& r) {
  const size_t runs = r.count(kMinIdRun);
  std::vector<uint32_t> ids;
  ids.reserve(runs);
  for (size_t i = 0; i < runs; ++i) {
    const uint32_t first = r.u32();
    const uint32_t length = r.u32();
    // A run's length is not bounded by the message's size: bound it by what a cache can hold.
    if (length > kMaxIds - ids.size() || first > UINT32_MAX - length)
      throw net::NetError("malformed message: a run of cache ids is too long");
    for (uint32_t k = 0; k < length; ++k) ids.push_back(first + k);
  }
  return ids;
}

// The parameters a request and its response share (copy_terms), in one order on the wire.
template <typename Message>
void put_terms(net::Writer& w, const Message& m) {
  w.u8(static_cast<uint8_t>(m.op));
  w.u8(static_cast<uint8_t>(m.dtype));
  w.u8(static_cast<uint8_t>(m.reduce_op));
  w.i64(m.process_set);
  w.i64(m.root);
  w.f64(m.prescale);
  w.f64(m.postscale);
}

template <typename Message>
void get_terms(net::Reader& r, Message& m) {
  m.op = static_cast<OpType>(r.u8());
  m.dtype = static_cast<DataType>(r.u8());
  m.reduce_op = static_cast<ReduceOp>(r.u8());
  m.process_set = static_cast<int32_t>(r.i64());
  m.root = static_cast<int32_t>(r.i64());
  m.prescale = r.f64();
  m.postscale = r.f64();
}

void put_request(net::Writer& w, const Request& q) {
  w.str(q.name);
  put_terms(w, q);
  put_ints(w, q.shape);
  put_ints(w, q.splits);
  put_ints(w, q.set_ranks);
  w.i64(q.target_process_set);
  w.str(q.group);
  w.i64(q.group_size);
  w.u8(q.device);
}

Request get_request(net::Reader& r) {
  Request q;
  q.name = r.str();
  get_terms(r, q);
  q.shape = get_ints<int64_t>(r);
  q.splits = get_ints<int64_t>(r);
  q.set_ranks = get_ints<int32_t>(r);
  q.target_process_set = static_cast<int32_t>(r.i64());
  q.group = r.str();
  q.group_size = static_cast<int32_t>(r.i64());
  q.device = r.u8();
  return q;
}

void put_response(net::Writer& w, const Response& p) {
  w.u8(p.from_cache ? 1 : 0);
  put_ids(w, p.cache_ids);
  if (p.from_cache) return;  // the receiver's cache holds everything else
  w.u8(static_cast<uint8_t>(p.type));
  put_terms(w, p);
  put_list(w, p.names, [](net::Writer& w, const std::string& n) { w.str(n); });
  put_list(w, p.shapes, put_ints<int64_t>);
  put_ints(w, p.rank_dims);
  put_ints(w, p.set_ranks);
  w.i64(p.last_joined_rank);
  w.str(p.error);
  w.u8(p.device);
}

Response get_response(net::Reader& r) {
  Response p;
  p.from_cache = r.u8() != 0;
  p.cache_ids = get_ids(r);
  if (p.from_cache) return p;
  p.type = static_cast<ResponseType>(r.u8());
  get_terms(r, p);
  p.names = get_list<std::string>(
      r, [](net::Reader& r) { return r.str(); }, kMinList);
  p.shapes = get_list<std::vector<int64_t>>(r, get_ints<int64_t>, kMinList);
  p.rank_dims = get_ints<int64_t>(r);
  p.set_ranks = get_ints<int32_t>(r);
  p.last_joined_rank = static_cast<int32_t>(r.i64());
  p.error = r.str();
  p.device = r.u8();
  return p;
}

void expect_magic(net::Reader& r, uint32_t magic, const char* what) {
  uint32_t got = r.u32();
  if (got != magic)
    throw Error(std::string("malformed ") + what +
                " (bad magic): are all ranks running the same krug version?");
}

void put_stalls(net::Writer& w, const std::vector<Stall>& stalls) {
  w.u32(static_cast<uint32_t>(stalls.size()));
  for (const auto& s : stalls) {
    w.str(s.name);
    w.u8(static_cast<uint8_t>(s.op));
    w.i64(s.process_set);
    put_ints(w, s.ready_ranks);
    put_ints(w, s.missing_ranks);
    w.f64(s.waited_seconds);
  }
}

std::vector<Stall> get_stalls(net::Reader& r) {
  std::vector<Stall> stalls(r.count(kMinStall));
  for (auto& s : stalls) {
    s.name = r.str();
    s.op = static_cast<OpType>(r.u8());
    s.process_set = static_cast<int32_t>(r.i64());
    s.ready_ranks = get_ints<int32_t>(r);
    s.missing_ranks = get_ints<int32_t>(r);
    s.waited_seconds = r.f64();
  }
  return stalls;
}

}  // namespace

std::string_view op_name(OpType op) {
  switch (op) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kAllgather: return "allgather";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kAlltoall: return "alltoall";
    case OpType::kReducescatter: return "reducescatter";
    case OpType::kBarrier: return "barrier";
    case OpType::kJoin: return "join";
    case OpType::kAddProcessSet: return "add_process_set";
    case OpType::kRemoveProcessSet: return "remove_process_set";
  }
  return "unknown";
}

void copy_terms(const Request& q, Response& r) {
  r.op = q.op;
  r.dtype = q.dtype;
  r.reduce_op = q.reduce_op;
  r.process_set = q.process_set;
  r.root = q.root;
  r.prescale = q.prescale;
  r.postscale = q.postscale;
  r.device = q.device;
}

Response response_for(const Request& q) {
  Response r;
  copy_terms(q, r);
  r.names = {q.name};
  r.shapes = {q.shape};
  return r;
}

std::string describe_op(const Request& q) {
  return fmt::format("{} '{}' (process set {})", op_name(q.op), q.name, q.process_set);
}

std::string describe(const std::vector<Stall>& stalls) {
  std::string out;
  for (const auto& s : stalls) {
    out += fmt::format(
        "\n  {} '{}' (process set {}): waiting {:.0f} s for ranks [{}]; ready on ranks [{}]",
        op_name(s.op), s.name, s.process_set, s.waited_seconds, fmt::join(s.missing_ranks, ", "),
        fmt::join(s.ready_ranks, ", "));
  }
  return out;
}

int64_t Request::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<uint8_t> encode(const RequestList& list) {
  net::Writer w;
  w.data().reserve(64 + 4 * list.cache_hits.size() + 96 * list.requests.size());
  w.u32(kRequestMagic);
  w.i64(list.rank);
  put_list(w, list.requests, put_request);
  put_ids(w, list.cache_hits);
  w.u8(list.shutdown ? 1 : 0);
  w.str(list.fatal_error);
  return w.take();
}

RequestList decode_request_list(const std::vector<uint8_t>& bytes) {
  net::Reader r(bytes);
  expect_magic(r, kRequestMagic, "request list");
  RequestList list;
  list.rank = static_cast<int32_t>(r.i64());
  list.requests = get_list<Request>(r, get_request, kMinRequest);
  list.cache_hits = get_ids(r);
  list.shutdown = r.u8() != 0;
  list.fatal_error = r.str();
  return list;
}

std::vector<uint8_t> encode(const ResponseList& list) {
  net::Writer w;
  size_t ids = 0;
  for (const auto& p : list.responses) ids += p.cache_ids.size();
  w.data().reserve(64 + 4 * ids + 64 * list.responses.size());
  w.u32(kResponseMagic);
  put_list(w, list.responses, put_response);
  w.u8(list.shutdown ? 1 : 0);
  w.str(list.shutdown_reason);
  w.u8(list.fatal ? 1 : 0);
  w.i64(list.tuned_fusion_threshold);
  w.f64(list.tuned_cycle_time_ms);
  put_stalls(w, list.stalls);
  return w.take();
}

ResponseList decode_response_list(const std::vector<uint8_t>& bytes) {
  net::Reader r(bytes);
  expect_magic(r, kResponseMagic, "response list");
  ResponseList list;
  list.responses = get_list<Response>(r, get_response, kMinResponse);
  list.shutdown = r.u8() != 0;
  list.shutdown_reason = r.str();
  list.fatal = r.u8() != 0;
  list.tuned_fusion_threshold = r.i64();
  list.tuned_cycle_time_ms = r.f64();
  list.stalls = get_stalls(r);
  return list;
}

}  // namespace krug::controller
