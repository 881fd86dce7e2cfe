// krug-scale: one rank of scripts/bench-scale's simulated cluster. Everything it measures is
// this rank's own; the script gathers every rank's line and prints the table.
//
//   KRUG_SCALE_T0=<epoch seconds> KRUG_SCALE_OUT=<dir> krug-scale [--steps N] [--big-iters N]
//
// After init(), it runs --steps steps of 100 named 1 KiB float32 allreduces (allreduce_async for
// all, then wait, as a framework's gradients go), then --big-iters allreduces of 16 MiB, and
// checks every output element exactly (rank r contributes r + 1). It writes <dir>/<rank>.json:
// seconds from KRUG_SCALE_T0 to the end of init(), the median small step and big allreduce
// (this rank's view, after a barrier each), this process's CPU time per small step, TCP bytes it
// sent and received per small step (every socket: control and data plane), its sockets, its
// peak RSS, and the epoch time its last step ended.
#include <krug/krug.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

double epoch_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// This process's sockets, and the TCP bytes they carried so far (sent and acknowledged, plus
// received).
struct Sockets {
  int count = 0;
  uint64_t tcp_bytes = 0;
};
Sockets sockets() {
  Sockets s;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (ec || target.rfind("socket:", 0) != 0) continue;
    ++s.count;
    tcp_info info{};
    socklen_t len = sizeof info;
    const int fd = std::stoi(entry.path().filename().string());
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0)
      s.tcp_bytes += info.tcpi_bytes_acked + info.tcpi_bytes_received;
  }
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int64_t check(const std::vector<float>& out, float expected) {
  return std::count_if(out.begin(), out.end(), [&](float x) { return x != expected; });
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 20, big_iters = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps")
      steps = std::atoi(argv[i + 1]);
    else if (flag == "--big-iters")
      big_iters = std::atoi(argv[i + 1]);
  }
  const char* t0_text = std::getenv("KRUG_SCALE_T0");
  const char* out_dir = std::getenv("KRUG_SCALE_OUT");
  if (!t0_text || !out_dir) {
    std::fprintf(stderr,
                 "krug-scale: run by scripts/bench-scale (KRUG_SCALE_T0, KRUG_SCALE_OUT)\n");
    return 2;
  }
  krug::init();
  const double init_s = epoch_seconds() - std::atof(t0_text);
  // Past init(): the script's kill test waits for every rank's file, then kills one by its pid.
  std::ofstream(std::string(out_dir) + "/" + std::to_string(krug::rank()) + ".ready") << getpid();
  const int n = krug::size();
  const float expected = static_cast<float>(n) * static_cast<float>(n + 1) / 2;
  krug::ReduceOptions sum;
  sum.op = krug::ReduceOp::kSum;

  constexpr int kTensors = 100;
  std::vector<std::vector<float>> in(kTensors, std::vector<float>(256, krug::rank() + 1.0f));
  std::vector<std::vector<float>> out(kTensors, std::vector<float>(256));
  std::vector<krug::Handle> handles(kTensors);
  auto small_step = [&] {
    for (int t = 0; t < kTensors; ++t)
      handles[t] = krug::allreduce_async("scale/small/" + std::to_string(t), in[t].data(),
                                         out[t].data(), krug::DataType::kFloat32, {256}, sum);
    for (auto& h : handles) h.wait();
  };
  small_step();  // warm-up: negotiates every name once, then the response cache serves them
  int64_t wrong = 0;
  std::vector<double> small_ms;
  const double cpu_before = cpu_seconds();
  const auto tcp_before = sockets().tcp_bytes;
  for (int s = 0; s < steps; ++s) {
    krug::barrier();
    const auto t = std::chrono::steady_clock::now();
    small_step();
    small_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
  }
  const double cpu_per_step_ms = (cpu_seconds() - cpu_before) * 1e3 / std::max(steps, 1);
  const auto tcp_per_step =
      (sockets().tcp_bytes - tcp_before) / static_cast<uint64_t>(std::max(steps, 1));
  for (const auto& o : out) wrong += check(o, expected);

  // Only when asked for: 32 MiB a rank is 32 GiB at 1,024 ranks.
  const size_t big_count = big_iters > 0 ? size_t{4} << 20 : 0;
  std::vector<float> big_in(big_count, krug::rank() + 1.0f), big_out(big_count);
  std::vector<double> big_ms;
  for (int i = 0; i < big_iters; ++i) {
    krug::barrier();
    const auto t = std::chrono::steady_clock::now();
    krug::allreduce("scale/big", big_in.data(), big_out.data(), krug::DataType::kFloat32,
                    {static_cast<int64_t>(big_in.size())}, sum);
    big_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
  }
  if (big_iters > 0) wrong += check(big_out, expected);
  const double last_step = epoch_seconds();
  const Sockets held = sockets();
  rusage u{};
  getrusage(RUSAGE_SELF, &u);

  std::ofstream f(std::string(out_dir) + "/" + std::to_string(krug::rank()) + ".json");
  f.precision(17);
  f << "{\"rank\": " << krug::rank() << ", \"host\": " << krug::cross_rank()
    << ", \"init_s\": " << init_s << ", \"small_step_ms\": " << median(small_ms)
    << ", \"big_ms\": " << median(big_ms) << ", \"cpu_ms_per_step\": " << cpu_per_step_ms
    << ", \"tcp_bytes_per_step\": " << tcp_per_step << ", \"sockets\": " << held.count
    << ", \"rss_kb\": " << u.ru_maxrss << ", \"wrong\": " << wrong
    << ", \"last_step\": " << last_step << ", \"plane\": \"" << krug::cpu_operations() << "\"}\n";
  f.close();
  krug::shutdown();
  return wrong == 0 ? 0 : 1;
}
