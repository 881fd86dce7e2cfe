#include "api/request.h"

#include <fmt/format.h>

#include "device/device.h"

namespace krug::api {

using controller::OpType;

void check_name(const std::string& name, OpType op) {
  if (name.empty())
    throw frontend::InvalidArgument(
        fmt::format("{}: the tensor name must not be empty", controller::op_name(op)));
}

void check_tensor(const std::string& name, OpType op, const frontend::TensorView& tensor) {
  check_name(name, op);
  switch (tensor.device.kind) {
    case frontend::DeviceKind::kCPU:
      return;
    case frontend::DeviceKind::kCUDA:
      if (!device::cuda_built())
        throw frontend::InvalidArgument(fmt::format(
            "{} '{}': a CUDA tensor (device {}), but this krug was built without CUDA; rebuild "
            "it with the CUDA toolkit installed (docs/gpu.md) or move the tensor to the CPU",
            controller::op_name(op), name, tensor.device.id));
      if (std::string why;
          tensor.device.id < 0 || tensor.device.id >= device::device_count(&why))
        throw frontend::InvalidArgument(fmt::format(
            "{} '{}': the tensor is on CUDA device {}, which this process does not see ({} "
            "visible{})",
            controller::op_name(op), name, tensor.device.id, device::device_count(),
            why.empty() ? "" : ": " + why));
      return;
  }
  throw frontend::InvalidArgument(fmt::format("{} '{}': unknown device kind {}",
                                              controller::op_name(op), name,
                                              static_cast<int>(tensor.device.kind)));
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
  q.device = tensor.device.kind == frontend::DeviceKind::kCUDA ? controller::kCudaMemory
                                                               : controller::kHostMemory;
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
