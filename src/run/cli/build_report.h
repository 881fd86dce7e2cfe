// krugrun --check-build and --version: what this krug was built with, in horovodrun
// --check-build's layout (frameworks, controllers, tensor operations, each [X] or [ ]).
#pragma once

#include <string>

namespace krug::run {

struct BuildFeatures {
  std::string version;             // krug's, e.g. "0.1.0"
  std::string torch_version;       // the torch the binding was built against; empty: not built
  std::string torch_problem;       // why the binding was not built
  bool mpi = false;                // the MPI backend
  std::string tensorflow_version;  // the TensorFlow the binding was built against
  std::string tensorflow_problem;  // why the TensorFlow binding was not built
  std::string jax_version;         // the JAX the binding was built against
  std::string jax_problem;         // why the JAX binding was not built
  std::string cuda_version;        // the CUDA runtime krug was built against; empty: no CUDA
  std::string cuda_problem;        // why CUDA was not built
  std::string nccl_version;        // the NCCL plane's (built against, loaded); empty: no NCCL
  std::string nccl_problem;        // why NCCL was not built
};

// This build: the generated build configuration and libkrug's own answers for MPI, CUDA and
// NCCL.
BuildFeatures this_build();

// The report krugrun --check-build prints.
std::string build_report(const BuildFeatures& features);

// The line krugrun --version prints.
std::string version_line(const BuildFeatures& features);

}  // namespace krug::run
