// main() of the LibTorch test workers (torch_cpp_worker.cc, torch_elastic_worker.cc): run one
// named scenario between krug::init() and krug::shutdown(), print "rank R: <scenario> OK" on
// success; exit 1 when it threw or counted failures, 2 for a usage error.
#pragma once

#include <krug/krug.h>
#include <torch/torch.h>

#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <string>

namespace krug_test {

// `rank` and `size` are filled after init() for the scenarios; `failures` is their count of
// failed checks.
inline int run_torch_worker(int argc, char** argv, const char* program,
                            const std::map<std::string, std::function<void()>>& scenarios,
                            int& rank, int& size, const int& failures) {
  if (argc != 2 || !scenarios.count(argv[1])) {
    std::cerr << "usage: " << program << " <scenario>; scenarios:";
    for (const auto& [name, fn] : scenarios) std::cerr << " " << name;
    std::cerr << std::endl;
    return 2;
  }
  torch::set_num_threads(1);
  try {
    krug::init();
    rank = krug::rank();
    size = krug::size();
    scenarios.at(argv[1])();
    krug::shutdown();
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": FAIL: " << argv[1] << ": " << e.what() << std::endl;
    return 1;
  }
  if (failures) return 1;
  std::cout << "rank " << rank << ": " << argv[1] << " OK" << std::endl;
  return 0;
}

}  // namespace krug_test
