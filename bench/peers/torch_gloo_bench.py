#!/usr/bin/python3
"""torch.distributed's Gloo backend, the peer of krug-bench and krug-step.

    /usr/bin/python3 bench/peers/torch_gloo_bench.py --np 2 allreduce|allgather|broadcast \
        [--min-bytes 4] [--max-bytes 256M] [--factor 2] [--iters N] [--target-seconds 0.2]
    /usr/bin/python3 bench/peers/torch_gloo_bench.py --np 2 step \
        [--tensors 100 --tensor-bytes 1K | --shapes bench/resnet50_gradients.txt |
         --steps 1x4K,100x1K,bench/resnet50_gradients.txt] [--sync]

Starts --np ranks itself (torch's env:// rendezvous on a free local port), one thread each.
Sweep: float32 dist.all_reduce (sum, in place: Gloo has no out-of-place allreduce),
dist.all_gather (size = the whole gathered result), dist.broadcast (root 0), with
krug-bench's timing and columns. Step: dist.all_reduce(async_op=True) for every tensor, then
wait for all (--sync: one blocking call after the other); --steps measures several steps in
turn in one process, a row each. One more operation checks results.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import pybench  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["allreduce", "allgather", "broadcast", "step"])
    p.add_argument("--np", type=int, default=2, help="ranks to start (default 2)")
    p.add_argument("--min-bytes", default="4")
    p.add_argument("--max-bytes", default="256M")
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--target-seconds", type=float, default=None,
                   help="timed seconds per size or step (default 0.2 sweep, 0.5 step)")
    p.add_argument("--tensors", type=int, default=100)
    p.add_argument("--tensor-bytes", default="1K")
    p.add_argument("--shapes", default=None, help="a gradient list (bench/resnet50_gradients.txt)")
    p.add_argument("--steps", default=None,
                   help="step: several steps in turn, a row each (NxSIZE or a gradient list, "
                        "comma-separated)")
    p.add_argument("--sync", action="store_true", help="step: blocking calls one after the other")
    p.add_argument("--timeout", type=int, default=900, help="kill the ranks after this (s)")
    args = p.parse_args()
    if args.target_seconds is None:
        args.target_seconds = 0.5 if args.mode == "step" else 0.2
    return args


class Ranks:
    """This rank's view of the process group, with the helpers the timing loop needs."""

    def __init__(self, dist, torch):
        self.dist, self.torch = dist, torch
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def slowest(self, v):
        t = self.torch.tensor([v], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t[0])

    def total(self, v):
        t = self.torch.tensor([v], dtype=self.torch.float64)
        self.dist.all_reduce(t)
        return int(t[0])

    def barrier(self):
        self.dist.barrier()


def sweep(args, r):
    torch, dist = r.torch, r.dist
    n = r.size
    pybench.print_sweep_header("torch_gloo_bench", args.mode, n,
                               ", torch %s" % torch.__version__) if r.rank == 0 else None
    last, wrong_total = None, 0
    for nbytes in pybench.sizes(pybench.parse_size(args.min_bytes),
                                pybench.parse_size(args.max_bytes), args.factor):
        elems = max(1, nbytes // 4)
        if args.mode == "allgather":
            elems = max(1, elems // n)
        if elems == last:  # sizes below one element per rank collapse into one row
            continue
        last = elems
        x = torch.zeros(elems)
        outs = [torch.zeros(elems) for _ in range(n)]
        ops = {
            "allreduce": lambda: dist.all_reduce(x),
            "allgather": lambda: dist.all_gather(outs, x),
            "broadcast": lambda: dist.broadcast(x, 0),
        }
        once = ops[args.mode]
        iters, secs = pybench.time_operation(once, r.slowest, r.barrier, iters=args.iters,
                                             target_seconds=args.target_seconds)
        # Check: rank k contributes k + 1; outputs poisoned with 0.
        x.fill_(0.0 if args.mode == "broadcast" and r.rank != 0 else r.rank + 1.0)
        for o in outs:
            o.zero_()
        once()
        if args.mode == "allreduce":
            wrong = int((x != n * (n + 1) / 2).sum())
        elif args.mode == "allgather":
            wrong = sum(int((o != k + 1).sum()) for k, o in enumerate(outs))
        else:
            wrong = int((x != 1.0).sum())
        wrong = r.total(wrong)
        wrong_total += wrong
        total_elems = elems * n if args.mode == "allgather" else elems
        if r.rank == 0:
            pybench.print_sweep_row(args.mode, n, total_elems * 4, iters, secs, wrong)
    if r.rank == 0:
        print("# Out of bounds values : %d %s\n#" % (wrong_total, "OK" if wrong_total == 0
                                                     else "FAILED"), flush=True)
    return 0 if wrong_total == 0 else 1


def steps(args, r):
    wrong = 0
    for i, one in enumerate(pybench.step_list(args)):
        wrong += step(one, r, header=i == 0,
                      what=args.steps and "each in turn, a row each: " + args.steps)
    return 0 if wrong == 0 else 1


def step(args, r, header=True, what=None):
    """Times one step and prints its row; returns the number of wrong elements over all ranks."""
    torch, dist = r.torch, r.dist
    spec, step_what = pybench.step_tensors(args)
    # Zeros while timing: in-place sums of zeros stay zero (no overflow over many steps).
    tensors = [torch.zeros(shape) for _, shape in spec]

    def once():
        if args.sync:
            for t in tensors:
                dist.all_reduce(t)
        else:
            for w in [dist.all_reduce(t, async_op=True) for t in tensors]:
                w.wait()

    if header and r.rank == 0:
        pybench.print_step_header(
            "torch_gloo_bench", what or step_what, r.size,
            "blocking dist.all_reduce one after the other" if args.sync
            else "dist.all_reduce(async_op=True) for every tensor, then wait for all")
    iters, secs = pybench.time_operation(once, r.slowest, r.barrier, iters=args.iters,
                                         target_seconds=args.target_seconds)
    for t in tensors:
        t.fill_(r.rank + 1.0)
    once()
    n = r.size
    wrong = r.total(sum(int((t != n * (n + 1) / 2).sum()) for t in tensors))
    if r.rank == 0:
        pybench.print_step_row(len(tensors), 4 * sum(t.numel() for t in tensors), iters, secs,
                               wrong)
    return wrong


def worker(args):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    r = Ranks(dist, torch)
    rc = steps(args, r) if args.mode == "step" else sweep(args, r)
    dist.barrier()
    # torch 1.13's gloo teardown can hang: leave without it, after every rank is done.
    pybench.hard_exit(rc)


def main():
    args = parse_args()
    if "RANK" in os.environ and "MASTER_PORT" in os.environ:
        worker(args)
    return pybench.spawn_ranks(os.path.abspath(__file__), sys.argv[1:], args.np, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
