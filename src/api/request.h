// The engine's request for one tensor of a frontend operation: validated and filled in one
// place for every API (the C++ API, the frontend seam and through it every binding).
#pragma once

#include <string>

#include "controller/message.h"
#include "krug/frontend.h"

namespace krug::api {

// Throws frontend::InvalidArgument when `name` is empty ("allreduce: the tensor name must not
// be empty").
void check_name(const std::string& name, controller::OpType op);

// Throws frontend::InvalidArgument unless `name` is set and `tensor` is on a device this build
// drives (the CPU).
void check_tensor(const std::string& name, controller::OpType op,
                  const frontend::TensorView& tensor);

// A request for `name` on `tensor` with every field of `op` the engine reads.
controller::Request make_request(const std::string& name, const frontend::Op& op,
                                 const frontend::TensorView& tensor);

// A request without a tensor (barrier, join, process-set changes).
controller::Request control_request(const std::string& name, controller::OpType op,
                                    int32_t process_set);

}  // namespace krug::api
