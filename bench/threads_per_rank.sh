#!/usr/bin/env bash
# Training images/s of 2 ranks on one host with krugrun's share of the cores (OMP_NUM_THREADS
# unset), with torch's own default (one thread per core in each rank), and DDP with one thread
# per rank (as torchrun starts it); the three interleaved round by round, idle and with a busy
# process per core. See docs/benchmarks.md, "krugrun shares a host's cores among its ranks".
#
#   bench/threads_per_rank.sh [rounds]      (default 3)
# Environment: KRUG_BUILD_DIR (default build/), KRUG_PYTHON (the interpreter krug.torch was built
# for; default /opt/krug/venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KRUG_BUILD_DIR:-build}
py=${KRUG_PYTHON:-/opt/krug/venv/bin/python}
rounds=${1:-3}
cores=$(nproc)
model=(--model resnet18 --batch-size 16 --image-size 64 --num-warmup-batches 1
       --num-batches-per-iter 2 --num-iters 2)
unset OMP_NUM_THREADS
load_pids=()
stop_load() { [ ${#load_pids[@]} -eq 0 ] || kill "${load_pids[@]}" 2>/dev/null || true; load_pids=(); }
trap stop_load EXIT

images_per_second() {
  local out
  out=$("$@" 2>&1) || { echo "failed: $*" >&2; echo "$out" | tail -5 >&2; echo "-"; return; }
  echo "$out" | grep -o 'Total img/sec on 2 rank(s): [0-9.]*' | awk '{print $NF}'
}

echo "# state round krugrun-share torch-default($cores-threads) ddp-1-thread (images/s, 2 ranks)"
for state in idle loaded; do
  for r in $(seq "$rounds"); do
    if [ "$state" = loaded ]; then
      for _ in $(seq "$cores"); do (while :; do :; done) & load_pids+=($!); done
    fi
    share=$(images_per_second "$build/krugrun" -np 2 --no-prefix "$py" \
      examples/torch_synthetic_benchmark.py "${model[@]}" --threads 0)
    default=$(images_per_second "$build/krugrun" -np 2 -x "OMP_NUM_THREADS=$cores" --no-prefix \
      "$py" examples/torch_synthetic_benchmark.py "${model[@]}" --threads 0)
    ddp=$(images_per_second "$py" bench/peers/ddp_synthetic.py --np 2 "${model[@]}" --threads 1)
    stop_load
    echo "$state $r $share $default $ddp"
  done
done
