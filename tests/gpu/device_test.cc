// The device layer, host staging and the NCCL plane on a real GPU, in one process: the scale
// kernel against the CPU's (bit for bit, every dtype), and each collective of the two device
// planes over one rank. Every test skips, saying why, on a machine without a usable GPU; the
// multi-rank behaviour is tests/gpu/test_gpu_ops.py's (scripts/gpu-check).
#include "device/device.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "collectives/nccl/nccl_plane.h"
#include "engine/host_staging.h"
#include "reduce/reduce.h"

namespace krug {
namespace {

#define KRUG_REQUIRE_GPU()                                                  \
  do {                                                                      \
    std::string why;                                                        \
    if (device::device_count(&why) == 0) GTEST_SKIP() << "no GPU: " << why; \
  } while (0)

auto soon() {
  return std::chrono::steady_clock::now() + std::chrono::seconds(30);
}

// One rank: every collective is a copy (or nothing).
class OneRank final : public collectives::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce(void*, size_t, DataType, ReduceOp) override {}
  void reducescatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp) override {
    std::memcpy(out, in, counts[0] * dtype_size(dtype));
  }
  void allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    std::memcpy(out, in, bytes[0]);
  }
  void broadcast(void*, size_t, int) override {}
  void alltoallv(const void* in, const std::vector<size_t>& send, void* out,
                 const std::vector<size_t>&) override {
    std::memcpy(out, in, send[0]);
  }
  void barrier() override {}
  void sendrecv(const void*, size_t, int, void*, size_t, int) override {}
  const char* backend_name() const override { return "one rank"; }
};

std::vector<uint8_t> random_bytes(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(byte(gen));
  return v;
}

TEST(DeviceScale, MatchesTheCpuKernelBitForBitInEveryDtype) {
  KRUG_REQUIRE_GPU();
  device::Stream stream(0);
  device::DeviceBuffer buffer(0);
  const size_t count = 1000;
  for (DataType dtype :
       {DataType::kUInt8, DataType::kInt8, DataType::kInt16, DataType::kInt32, DataType::kInt64,
        DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64}) {
    for (double factor : {0.37, 3.0, -1.5, 0.1, 1.0 / 3}) {
      const size_t bytes = count * dtype_size(dtype);
      std::vector<uint8_t> host = random_bytes(bytes, static_cast<unsigned>(dtype) + 7);
      if (dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 ||
          dtype == DataType::kFloat32 || dtype == DataType::kFloat64) {
        // Finite values only: NaN payloads need not survive bit for bit.
        std::vector<double> values(count);
        std::mt19937 gen(3);
        std::uniform_real_distribution<double> d(-100, 100);
        for (auto& x : values) x = d(gen);
        for (size_t i = 0; i < count; ++i) {
          if (dtype == DataType::kFloat64) std::memcpy(&host[i * 8], &values[i], 8);
          if (dtype == DataType::kFloat32) {
            float f = static_cast<float>(values[i]);
            std::memcpy(&host[i * 4], &f, 4);
          }
        }
        if (dtype == DataType::kFloat16 || dtype == DataType::kBFloat16)
          for (size_t i = 0; i < count; ++i) host[2 * i + 1] &= 0x3f;  // small exponents
      }
      std::vector<uint8_t> want = host;
      reduce::scale(dtype, want.data(), count, factor);
      uint8_t* dev = buffer.reserve(bytes);
      device::copy_async(dev, host.data(), bytes, stream);
      device::scale_async(dtype, dev, count, factor, stream);
      std::vector<uint8_t> got(bytes);
      device::copy_async(got.data(), dev, bytes, stream);
      stream.synchronize(soon(), "scale test");
      EXPECT_EQ(got, want) << "dtype " << dtype_name(dtype) << " factor " << factor;
    }
  }
}

// Runs every collective of `comm` (device memory, one rank) and checks the copies.
void one_rank_collectives(collectives::Communicator& comm, const device::Stream& stream) {
  device::DeviceBuffer a(stream.device()), b(stream.device());
  const size_t n = 4096;
  std::vector<float> host(n);
  std::iota(host.begin(), host.end(), 1.0f);
  float* in = reinterpret_cast<float*>(a.reserve(n * 4));
  float* out = reinterpret_cast<float*>(b.reserve(n * 4));
  auto load = [&] {
    device::copy_async(in, host.data(), n * 4, stream);
    device::zero_async(out, n * 4, stream);
    stream.synchronize(soon(), "load");
  };
  auto read = [&](const float* p) {
    std::vector<float> v(n);
    device::copy_async(v.data(), p, n * 4, stream);
    stream.synchronize(soon(), "read");
    return v;
  };
  load();
  comm.allreduce(in, n, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(read(in), host) << comm.backend_name() << " allreduce";
  load();
  comm.allgatherv(in, out, {n * 4});
  EXPECT_EQ(read(out), host) << comm.backend_name() << " allgather";
  load();
  comm.broadcast(in, n * 4, 0);
  EXPECT_EQ(read(in), host) << comm.backend_name() << " broadcast";
  load();
  comm.reducescatter(in, out, {n}, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(read(out), host) << comm.backend_name() << " reducescatter";
  load();
  comm.alltoallv(in, {n * 4}, out, {n * 4});
  EXPECT_EQ(read(out), host) << comm.backend_name() << " alltoall";
  comm.barrier();
}

TEST(HostStaging, EveryCollectiveOverOneRank) {
  KRUG_REQUIRE_GPU();
  auto stream = std::make_shared<device::Stream>(0);
  OneRank cpu;
  engine::HostStaging staging(cpu, stream, 30.0);
  one_rank_collectives(staging, *stream);
}

TEST(NcclPlane, EveryCollectiveOverOneRank) {
  KRUG_REQUIRE_GPU();
  if (!collectives::nccl::built()) GTEST_SKIP() << "krug was built without NCCL";
  auto stream = std::make_shared<device::Stream>(0);
  OneRank bootstrap;
  auto nccl = collectives::nccl::make_communicator(bootstrap, stream, {.timeout_seconds = 30, .host_id = ""});
  EXPECT_STREQ(nccl->backend_name(), "nccl");
  one_rank_collectives(*nccl, *stream);
  std::printf("NCCL built %s, loaded %s\n", collectives::nccl::build_version().c_str(),
              collectives::nccl::runtime_version().c_str());
}

}  // namespace
}  // namespace krug
