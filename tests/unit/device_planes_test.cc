// The GPU-side choices that need no GPU: which plane KRUG_GPU_OPERATIONS (or Horovod's names)
// picks, the per-rank NCCL_HOSTID of the shared-device test mode, the device field of requests
// on the wire and in negotiation, and the errors a build without CUDA gives.
#include "engine/device_planes.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "collectives/nccl/nccl_plane.h"
#include "common/config.h"
#include "controller/message.h"
#include "device/device.h"
#include "engine/executor.h"

namespace krug::engine {
namespace {

TEST(GpuOperations, DefaultsToNcclWhenBuiltWithIt) {
  EXPECT_EQ(gpu_operations("", true), GpuOperations::kNccl);
  EXPECT_EQ(gpu_operations("", false), GpuOperations::kHost);
}

TEST(GpuOperations, TheKnobsChoice) {
  EXPECT_EQ(gpu_operations("host", true), GpuOperations::kHost);
  EXPECT_EQ(gpu_operations("nccl", true), GpuOperations::kNccl);
  EXPECT_EQ(gpu_operations("host", false), GpuOperations::kHost);
}

TEST(GpuOperations, NcclWithoutNcclIsAnError) {
  try {
    gpu_operations("nccl", false);
    FAIL() << "no error for nccl without NCCL";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("built without NCCL"), std::string::npos) << e.what();
  }
}

// Spellings and Horovod's names are the knob table's (config_test.cc); this is what the engine
// makes of the value it reads.
TEST(GpuOperations, ReadThroughTheKnobTable) {
  const auto configured = [](std::map<std::string, std::string> vars) {
    return load_config([&](const char* name) -> const char* {
             auto it = vars.find(name);
             return it == vars.end() ? nullptr : it->second.c_str();
           })
        .gpu_operations;
  };
  EXPECT_EQ(gpu_operations(configured({{"KRUG_GPU_OPERATIONS", "Host"}}), true),
            GpuOperations::kHost);
  EXPECT_EQ(gpu_operations(configured({{"HOROVOD_GPU_OPERATIONS", "MPI"}}), true),
            GpuOperations::kHost);
  EXPECT_EQ(gpu_operations(configured({{"HOROVOD_GPU_ALLREDUCE", "NCCL"}}), true),
            GpuOperations::kNccl);
}

TEST(NcclHostId, OnePerRankOnlyInSharedDeviceMode) {
  EXPECT_EQ(nccl_host_id(false, "gpu1", 3), "");
  EXPECT_EQ(nccl_host_id(true, "gpu1", 3), "gpu1-krug-rank-3");
  EXPECT_NE(nccl_host_id(true, "gpu1", 0), nccl_host_id(true, "gpu1", 1));
}

TEST(NcclPlane, ReducesWhatNcclHas) {
  if (!collectives::nccl::built()) {
    EXPECT_FALSE(collectives::nccl::reduces(DataType::kFloat32, ReduceOp::kSum));
    return;
  }
  EXPECT_TRUE(collectives::nccl::reduces(DataType::kFloat32, ReduceOp::kSum));
  EXPECT_TRUE(collectives::nccl::reduces(DataType::kBFloat16, ReduceOp::kAverage));
  EXPECT_TRUE(collectives::nccl::reduces(DataType::kInt64, ReduceOp::kProduct));
  // No int16 or bool in NCCL, and Adasum is krug's own: these are staged through the CPU.
  EXPECT_FALSE(collectives::nccl::reduces(DataType::kInt16, ReduceOp::kSum));
  EXPECT_FALSE(collectives::nccl::reduces(DataType::kBool, ReduceOp::kMax));
  EXPECT_FALSE(collectives::nccl::reduces(DataType::kFloat32, ReduceOp::kAdasum));
  EXPECT_FALSE(collectives::nccl::build_version().empty());
}

TEST(DeviceField, TravelsOnTheWireInRequestsAndResponses) {
  controller::RequestList list;
  controller::Request q;
  q.name = "grad";
  q.shape = {4};
  q.device = controller::kCudaMemory;
  list.requests.push_back(q);
  auto back = controller::decode_request_list(controller::encode(list));
  ASSERT_EQ(back.requests.size(), 1u);
  EXPECT_EQ(back.requests[0].device, controller::kCudaMemory);
  EXPECT_EQ(back.requests[0], q);
}

TEST(DeviceLayer, WithoutAGpuNothingClaimsOne) {
  std::string why;
  const int n = device::device_count(&why);
  if (n == 0) {
    EXPECT_FALSE(why.empty());
  }
  if (!device::cuda_built()) {
    EXPECT_EQ(n, 0);
    EXPECT_THROW(device::Stream(0), Error);
  }
}

}  // namespace
}  // namespace krug::engine
