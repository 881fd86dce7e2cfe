"""Allreduce of CUDA tensors: bus bandwidth from 1 MiB to 1 GiB and the latency of 4 KiB, through
krug.torch (its NCCL plane or host staging, as KRUG_GPU_OPERATIONS says) or through
torch.distributed's NCCL backend, run in every rank of a krugrun job:

    krugrun -np 2 python bench/gpu/allreduce_bench.py --backend krug --plane nccl --out a.jsonl
    krugrun -np 2 python bench/gpu/allreduce_bench.py --backend torch --out b.jsonl
    krugrun -np 2 python bench/gpu/allreduce_bench.py --backend krug --device cpu --out c.jsonl
    python bench/gpu/allreduce_bench.py --table a.jsonl b.jsonl c.jsonl

--device cpu measures krug's CPU data plane on CPU tensors, the floor of host staging, and with
it what host staging adds: a copy of the data from the GPU into pinned memory and back. The table
then gives host staging's time against that sum (the issue's target: at least 0.8).

Every call is timed to completion on the device (krug's allreduce returns then; torch's is
followed by torch.cuda.synchronize()), float32 sums in place, the slowest rank's time. Bus
bandwidth is Horovod's and nccl-tests' measure: 2 (n - 1) / n * bytes / time. With
KRUG_GPU_SHARE_DEVICE=1 (several ranks on one GPU) each rank sets its own NCCL_HOSTID, the
torch backend too, so both go through NCCL's socket transport alike (docs/gpu.md).
Rank 0 appends one JSON line per size to --out; --table prints the files side by side.
"""
import argparse
import json
import os
import sys
import time

MIB = 1 << 20


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["krug", "torch"])
    p.add_argument("--plane", default="", help="label of the run (krug: nccl or host)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: krug's CPU data plane on CPU tensors, and the staging copies' cost")
    p.add_argument("--out", help="JSON lines file rank 0 appends to")
    p.add_argument("--sizes-mib", default="1,4,16,64,256,1024")
    p.add_argument("--latency-bytes", type=int, default=4096)
    p.add_argument("--latency-iters", type=int, default=200)
    p.add_argument("--port", type=int, default=29531, help="torch's TCP store on 127.0.0.1")
    p.add_argument("--table", nargs="+", help="print these JSON lines files as one table")
    return p.parse_args()


def iterations(nbytes):
    if nbytes >= 256 * MIB:
        return 3
    if nbytes >= 64 * MIB:
        return 5
    if nbytes >= 16 * MIB:
        return 10
    return 20


class Krug:
    def __init__(self):
        import krug.torch as hvd
        self.hvd = hvd
        hvd.init()
        self.rank, self.size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()

    def allreduce(self, x, name):
        self.hvd.allreduce_(x, name=name, op=self.hvd.Sum)

    def slowest(self, seconds):
        import torch
        return self.hvd.allreduce(torch.tensor([seconds], dtype=torch.float64), name="bench.t",
                                  op=self.hvd.Max).item()

    def close(self):
        self.hvd.shutdown()


class TorchNccl:
    def __init__(self, port):
        import torch
        import torch.distributed as dist
        self.dist = dist
        self.rank = int(os.environ["KRUG_RANK"])
        self.size = int(os.environ["KRUG_SIZE"])
        self.local_rank = int(os.environ.get("KRUG_LOCAL_RANK", self.rank))
        if os.environ.get("KRUG_GPU_SHARE_DEVICE") == "1":
            os.environ["NCCL_HOSTID"] = "%s-torch-rank-%d" % (os.uname().nodename, self.rank)
        torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port,
                                rank=self.rank, world_size=self.size)

    def allreduce(self, x, name):
        import torch
        self.dist.all_reduce(x)
        torch.cuda.synchronize()

    def slowest(self, seconds):
        import torch
        t = torch.tensor([seconds], dtype=torch.float64, device="cuda")
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.item()

    def close(self):
        self.dist.destroy_process_group()


def seconds_per_call(call, iters):
    """Mean seconds of `call`, run `iters` times, until the GPU has finished its work too."""
    import torch
    start = time.perf_counter()
    for _ in range(iters):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def measure(comm, nbytes, iters, label, device):
    import torch
    x = torch.ones(max(nbytes // 4, 1), dtype=torch.float32, device=device)
    name = "bench.%d" % nbytes
    for _ in range(2):
        comm.allreduce(x, name)
    torch.cuda.synchronize()
    comm.slowest(0.0)  # line the ranks up
    seconds = comm.slowest(seconds_per_call(lambda: comm.allreduce(x, name), iters))
    n = comm.size
    busbw = (2.0 * (n - 1) / n * nbytes / seconds / 1e9) if n > 1 else 0.0
    row = {"plane": label, "bytes": nbytes, "ranks": n, "iters": iters,
           "time_us": seconds * 1e6, "busbw_gbs": busbw}
    if device == "cpu":
        row["copy_us"] = comm.slowest(staging_copy_seconds(nbytes, iters)) * 1e6
    return row


def staging_copy_seconds(nbytes, iters):
    """What host staging adds to the CPU plane's work: the data from the GPU into pinned host
    memory and back, every rank at once as in a staged collective."""
    import torch
    gpu = torch.ones(max(nbytes // 4, 1), dtype=torch.float32, device="cuda")
    host = torch.empty(gpu.shape, dtype=gpu.dtype, pin_memory=True)

    def round_trip():
        host.copy_(gpu)
        gpu.copy_(host)

    round_trip()
    torch.cuda.synchronize()
    return seconds_per_call(round_trip, iters)


def run(args):
    import torch
    if args.backend == "krug":
        comm = Krug()
        torch.cuda.set_device(comm.local_rank % torch.cuda.device_count())
        label = "krug " + (args.plane or os.environ.get("KRUG_GPU_OPERATIONS", "nccl"))
        if args.device == "cpu":
            label = "krug cpu"
    else:
        comm = TorchNccl(args.port)
        label = "torch.distributed nccl"
    cases = [(args.latency_bytes, args.latency_iters)]
    cases += [(int(s) * MIB, iterations(int(s) * MIB)) for s in args.sizes_mib.split(",") if s]
    def emit(row):  # rank 0, as it comes: a later failure keeps the earlier sizes
        if comm.rank != 0:
            return
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")

    for nbytes, iters in cases:
        try:
            emit(measure(comm, nbytes, iters, label, args.device))
        except Exception as e:  # one failed size (say, out of memory) must not hide the rest
            emit({"plane": label, "bytes": nbytes, "ranks": comm.size,
                  "error": "%s: %s" % (type(e).__name__, e)})
            if args.backend == "krug":
                raise  # krug's engine does not go on after a failed collective
    comm.close()


def size_text(nbytes):
    return "%d KiB" % (nbytes // 1024) if nbytes < MIB else "%d MiB" % (nbytes // MIB)


def table(paths):
    rows = []
    for path in paths:
        if os.path.exists(path):
            with open(path) as f:
                rows += [json.loads(line) for line in f if line.strip()]
    planes = []
    for r in rows:
        if r["plane"] not in planes:
            planes.append(r["plane"])
    sizes = sorted({r["bytes"] for r in rows})
    by = {(r["plane"], r["bytes"]): r for r in rows}
    ref = "torch.distributed nccl"
    head = "| size | " + " | ".join("%s time | busbw" % p for p in planes)
    if ref in planes:
        head += " | " + " | ".join("%s / torch" % p for p in planes if p != ref)
    print(head + " |")
    print("|" + " --- |" * (1 + 2 * len(planes) + (len(planes) - 1 if ref in planes else 0)))
    for size in sizes:
        cells = [size_text(size)]
        for p in planes:
            r = by.get((p, size))
            if r is None or "error" in r:
                cells += ["failed" if r else "-", r["error"][:60] if r else "-"]
            else:
                cells += ["%.0f us" % r["time_us"], "%.2f GB/s" % r["busbw_gbs"]]
        if ref in planes:
            t = by.get((ref, size))
            for p in planes:
                if p == ref:
                    continue
                r = by.get((p, size))
                ok = r and t and "error" not in r and "error" not in t
                if not ok:
                    cells.append("-")
                elif size <= 64 * 1024:  # latency: time ratio (lower is better)
                    cells.append("time x%.2f" % (r["time_us"] / t["time_us"]))
                else:
                    cells.append("busbw x%.2f" % (r["busbw_gbs"] / max(t["busbw_gbs"], 1e-12)))
        print("| " + " | ".join(cells) + " |")
    if "krug cpu" in planes and "krug host" in planes:
        staging_table(sizes, by)


def staging_table(sizes, by):
    """Host staging against its floor: the CPU plane's time plus the copies it adds."""
    print()
    print("| size | krug cpu plane | copies GPU to host and back | sum | krug host staging "
          "| sum / host staging |")
    print("|" + " --- |" * 6)
    for size in sizes:
        cpu, host = by.get(("krug cpu", size)), by.get(("krug host", size))
        if not cpu or not host or "error" in cpu or "error" in host:
            continue
        floor = cpu["time_us"] + cpu["copy_us"]
        print("| %s | %.0f us | %.0f us | %.0f us | %.0f us | x%.2f |"
              % (size_text(size), cpu["time_us"], cpu["copy_us"], floor, host["time_us"],
                 floor / host["time_us"]))


def main():
    args = parse_args()
    if args.table:
        table(args.table)
        return 0
    if not args.backend:
        sys.exit("allreduce_bench: --backend krug|torch or --table FILES")
    if args.device == "cpu" and args.backend != "krug":
        sys.exit("allreduce_bench: --device cpu measures krug's CPU plane: use --backend krug")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
