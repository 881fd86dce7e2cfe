// Control-plane messages: what a rank asks for (Request) and what the coordinator decides
// (Response), and their wire codec.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "krug/types.h"

namespace krug::controller {

// Values are part of the wire format: append only.
enum class OpType : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  kJoin = 6,
  kAddProcessSet = 7,
  kRemoveProcessSet = 8,
};
std::string_view op_name(OpType op);

// One rank's readiness for one named operation.
// Where a request's tensors live (frontend::DeviceKind's values): every rank of a set must agree,
// and tensors on different kinds are never fused.
constexpr uint8_t kHostMemory = 0;
constexpr uint8_t kCudaMemory = 1;

struct Request {
  std::string name;
  OpType op = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  int32_t process_set = 0;
  int32_t root = 0;  // broadcast
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<int64_t> shape;
  std::vector<int64_t> splits;      // alltoall: rows sent to each rank of the set
  std::vector<int32_t> set_ranks;   // kAddProcessSet: global ranks of the new set
  int32_t target_process_set = 0;   // kRemoveProcessSet: the set to remove
  std::string group;                // grouped allreduce: group key ("" = not grouped)
  int32_t group_size = 0;           // number of tensors in the group
  uint8_t device = kHostMemory;     // kHostMemory or kCudaMemory

  int64_t num_elements() const;
  bool operator==(const Request&) const = default;
};

// Everything one rank tells the coordinator in one cycle.
struct RequestList {
  int32_t rank = 0;
  std::vector<Request> requests;
  std::vector<uint32_t> cache_hits;  // ids of cached requests this rank is now ready for
  bool shutdown = false;
  std::string fatal_error;  // a data-plane failure on this rank, forwarded to every rank
};

enum class ResponseType : uint8_t {
  kOp = 0,        // run op over `names` (several names = fused)
  kError = 1,     // fail `names` with `error`
};

// One decision of the coordinator. Every rank executes Responses in list order.
struct Response {
  ResponseType type = ResponseType::kOp;
  OpType op = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  int32_t process_set = 0;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<std::string> names;
  // Per name, its shape (joined ranks contribute zeros of this shape; they have no request).
  std::vector<std::vector<int64_t>> shapes;
  // allgather: first dimension of each rank of the set (one name per response);
  // alltoall: splits matrix, row r = rows rank r sends to each rank (size x size).
  std::vector<int64_t> rank_dims;
  // Cache ids of `names` (same order). When `from_cache` is set the wire carries only these ids
  // and every rank rebuilds names, shapes and parameters from its own (identical) cache.
  std::vector<uint32_t> cache_ids;
  bool from_cache = false;
  std::vector<int32_t> set_ranks;  // kAddProcessSet: members; process_set holds the new id
  int32_t last_joined_rank = -1;   // kJoin
  std::string error;
  uint8_t device = kHostMemory;  // where every rank's tensors of `names` live

  bool operator==(const Response&) const = default;
};

// A named operation some ranks submitted and others have not, for too long (stall inspector).
struct Stall {
  std::string name;
  OpType op = OpType::kAllreduce;
  int32_t process_set = 0;
  std::vector<int32_t> ready_ranks;
  std::vector<int32_t> missing_ranks;
  double waited_seconds = 0;

  bool operator==(const Stall&) const = default;
};
// How errors name an operation: "allreduce 'w' (process set 0)".
std::string describe_op(const Request& q);

// One line per stall: "\n  allreduce 'w' (process set 0): waiting 61 s for ranks [1]; ready on
// ranks [0, 2]".
std::string describe(const std::vector<Stall>& stalls);

struct ResponseList {
  std::vector<Response> responses;
  bool shutdown = false;
  std::string shutdown_reason;  // who shut down, or the fatal error that stopped the job
  bool fatal = false;           // true when shutdown is due to an error
  // The autotuner's choice, sent by the coordinator when it changes (0: unchanged): every rank
  // applies the same parameters from the cycle that carries them.
  int64_t tuned_fusion_threshold = 0;
  double tuned_cycle_time_ms = 0;
  // The stall inspector's latest report (coordinator): every rank logs the stalls it takes part
  // in, so a rank's own output says what it waits for and who waits for it.
  std::vector<Stall> stalls;
};

// The op response for one request: its parameters, name and shape.
Response response_for(const Request& request);
// The parameters only (op, dtype, reduction, set, root, scale factors), as every name of a
// response shares them.
void copy_terms(const Request& request, Response& response);

std::vector<uint8_t> encode(const RequestList& list);
RequestList decode_request_list(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> encode(const ResponseList& list);
ResponseList decode_response_list(const std::vector<uint8_t>& bytes);

}  // namespace krug::controller
