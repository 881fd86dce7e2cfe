#!/usr/bin/env bash
# Each framework binding configures alone, every other one off, as `scripts/build --only
# tensorflow` (or pip install with KRUG_WITHOUT_PYTORCH=1) asks: nothing one binding's CMake
# needs may come from another's.
# Usage: binding_alone_test.sh SOURCE_DIR PYTHON WORK_DIR BINDING...   (TORCH, TENSORFLOW, JAX)
set -euo pipefail
src=$1 python=$2 work=$3
shift 3
rm -rf "$work"
for binding in "$@"; do
  flags=(-DKRUG_BUILD_TESTS=OFF -DKRUG_BUILD_BENCH=OFF -DKRUG_BUILD_EXAMPLES=OFF
    -DKRUG_WITH_MPI=OFF -DKRUG_WITH_CUDA=OFF)
  for other in TORCH TENSORFLOW JAX; do
    if [ "$other" = "$binding" ]; then flags+=("-DKRUG_BUILD_$other=ON"); else flags+=("-DKRUG_BUILD_$other=OFF"); fi
  done
  echo "== $binding alone: ${flags[*]}"
  if ! cmake -S "$src" -B "$work/$binding" -G Ninja -DPython_EXECUTABLE="$python" "${flags[@]}" \
    >"$work-$binding.log" 2>&1; then
    echo "FAIL: the $binding binding alone does not configure:"
    cat "$work-$binding.log"
    exit 1
  fi
done
rm -rf "$work" "$work"-*.log
echo "every binding configures alone: $*"
