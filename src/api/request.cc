#include "api/request.h"

#include <fmt/format.h>

namespace krug::api {

using controller::OpType;

void check_name(const std::string& name, OpType op) {
  if (name.empty())
    throw frontend::InvalidArgument(
        fmt::format("{}: the tensor name must not be empty", controller::op_name(op)));
}

void check_tensor(const std::string& name, OpType op, const frontend::TensorView& tensor) {
  check_name(name, op);
  if (tensor.device.kind != frontend::DeviceKind::kCPU)
    throw frontend::InvalidArgument(fmt::format(
        "{} '{}': tensors on device kind {} (id {}) are not supported by this build; "
        "only CPU tensors are",
        controller::op_name(op), name, static_cast<int>(tensor.device.kind), tensor.device.id));
}

controller::Request make_request(const std::string& name, const frontend::Op& op,
                                 const frontend::TensorView& tensor) {
  const auto type = static_cast<OpType>(op.type);
  check_tensor(name, type, tensor);
  controller::Request q;
  q.name = name;
  q.op = type;
  q.dtype = tensor.dtype;
  q.shape.assign(tensor.shape.begin(), tensor.shape.end());
  q.process_set = op.process_set.id;
  if (type == OpType::kAllreduce || type == OpType::kReducescatter) {
    q.reduce_op = op.reduce_op;
    q.prescale = op.prescale;
    q.postscale = op.postscale;
  }
  if (type == OpType::kBroadcast) q.root = op.root;
  if (type == OpType::kAlltoall) q.splits.assign(op.splits.begin(), op.splits.end());
  return q;
}

controller::Request control_request(const std::string& name, OpType op, int32_t process_set) {
  check_name(name, op);
  controller::Request q;
  q.name = name;
  q.op = op;
  q.dtype = DataType::kUInt8;
  q.process_set = process_set;
  return q;
}

}  // namespace krug::api
