#!/bin/bash
# One run on the GPU machine (docs/gpu.md): what it has for building krug, which NCCL setting
# lets several ranks share one GPU, torch.distributed's NCCL baseline, and krug's CPU data plane
# on all cores beside torch's Gloo. Run from the folder bench/gpu/pack-cpu-build made.
cd "$(dirname "$0")"
exec > >(tee "${OUT:-.}/probe.log") 2>&1
echo "== machine"; date -u; nproc; free -g | head -2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch,sys; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
python3 -m pip show nvidia-nccl-cu13 2>/dev/null | head -2
find / -xdev \( -name 'libnccl.so*' -o -name nccl.h \) 2>/dev/null | head
for t in cmake ninja nvcc g++ mpirun ssh; do printf '%s: ' $t; command -v $t || echo missing; done
cmake --version | head -1; nvcc --version | tail -1; g++ --version | head -1; ldd --version | head -1; grep PRETTY /etc/os-release
for h in gloo/config.h yaml-cpp/yaml.h nlohmann/json.hpp CLI/CLI.hpp fmt/core.h openssl/hmac.h gtest/gtest.h mpi.h; do
  found=$(ls /usr/include/$h /usr/local/include/$h 2>/dev/null | head -1)
  echo "${found:-missing header $h}"; done
python3 -c "import pybind11; print('pybind11', pybind11.__version__)"
echo "== NCCL, ranks sharing one GPU"
for np in 2 4; do for mode in plain hostid multirank; do
  PROBE_MODE=$mode NCCL_DEBUG=WARN timeout 120 torchrun --standalone --nproc_per_node=$np dist_probe.py 2>&1 | grep -E 'RESULT|NCCL WARN|Error|error' | sort | uniq | head -8
  echo "-- np=$np mode=$mode exit=${PIPESTATUS[0]}"
done; done
echo "== torch.distributed NCCL bandwidth, 2 ranks on one GPU"
for mode in hostid multirank; do
  PROBE_MODE=$mode PROBE_BENCH=1 timeout 150 torchrun --standalone --nproc_per_node=2 dist_probe.py 2>&1 | grep BENCH
done
echo "== CPU: krug (prebuilt on Debian 12) against torch Gloo, 16 cores"
export LD_LIBRARY_PATH=$PWD/lib
for np in 2 4 8; do
  timeout 120 bin/krugrun -np $np bin/krug-bench allreduce --min-bytes 4K --max-bytes 64M --factor 16 2>&1 | tail -10
  PROBE_BACKEND=gloo PROBE_BENCH=1 timeout 120 torchrun --standalone --nproc_per_node=$np dist_probe.py 2>&1 | grep BENCH
done
echo "== done"; date -u
