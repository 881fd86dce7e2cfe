"""Probe for issue 20: can ranks share one GPU under NCCL, and torch.distributed's baseline.

Run under torchrun. PROBE_MODE: plain | hostid | multirank. PROBE_BENCH=1 also times
allreduce (NCCL on CUDA tensors, or Gloo on CPU tensors with PROBE_BACKEND=gloo).
"""
import os
import sys
import time

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
mode = os.environ.get("PROBE_MODE", "plain")
backend = os.environ.get("PROBE_BACKEND", "nccl")
if mode == "hostid":
    os.environ["NCCL_HOSTID"] = f"krug-probe-{rank}"
elif mode == "multirank":
    os.environ["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"

device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
if backend == "nccl":
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
else:
    dist.init_process_group("gloo", rank=rank, world_size=world)

x = torch.full((1024,), float(rank + 1), device=device)
dist.all_reduce(x)
if backend == "nccl":
    torch.cuda.synchronize()
expect = world * (world + 1) / 2
print(f"RESULT mode={mode} backend={backend} world={world} rank={rank} ok={bool((x == expect).all())}", flush=True)


def timed(nbytes, iters):
    t = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    for _ in range(3):
        dist.all_reduce(t)
    if backend == "nccl":
        torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    if backend == "nccl":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


if os.environ.get("PROBE_BENCH") == "1":
    sizes = [4 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
    if backend == "nccl":
        sizes.append(1 << 30)
    for n in sizes:
        iters = 200 if n <= (1 << 20) else (20 if n <= (64 << 20) else 5)
        sec = timed(n, iters)
        busbw = 2 * (world - 1) / world * n / sec / 1e9
        if rank == 0:
            print(f"BENCH backend={backend} mode={mode} world={world} bytes={n} time_us={sec*1e6:.1f} busbw_GBps={busbw:.2f}", flush=True)
dist.destroy_process_group()
