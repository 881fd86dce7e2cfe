#!/usr/bin/python3
"""krug-bench's allreduce sweep through krug's Python API (krug.torch): the peer of a Horovod
sweep that runs this same script (bench/peers/as_horovod.py puts horovod.torch in its place).

    krugrun -np 2 /usr/bin/python3 bench/krug_torch_sweep.py [--min-bytes 4] [--max-bytes 256M]
        [--factor 2] [--iters N] [--target-seconds 0.2]
    horovodrun -np 2 --gloo /opt/krug/horovod-venv/bin/python bench/peers/as_horovod.py \
        bench/krug_torch_sweep.py ...

Every size: hvd.allreduce_async_ and hvd.synchronize (in place, op Sum, float32, one name per
size that stays the same from call to call, as a gradient's does), timed as krug-bench times
(bench/pybench.py: warm-up, estimate, ~target seconds of operations, slowest rank); one more
operation checks the result. Rank 0 prints krug-bench's columns.
"""
import argparse
import os
import sys

import torch

import krug.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pybench  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--min-bytes", default="4")
    p.add_argument("--max-bytes", default="256M")
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--target-seconds", type=float, default=0.2)
    return p.parse_args()


def slowest(v):
    t = hvd.allreduce(torch.tensor([v], dtype=torch.float64), op=hvd.Max, name="sweep.max")
    return float(t[0])


def total(v):
    return int(hvd.allreduce(torch.tensor([v], dtype=torch.float64), op=hvd.Sum,
                             name="sweep.wrong")[0])


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)
    n = hvd.size()
    if hvd.rank() == 0:
        pybench.print_sweep_header("krug_torch_sweep", "allreduce", n, ", %s, torch %s"
                                   % (hvd.__name__, torch.__version__))
    wrong_total = 0
    for nbytes in pybench.sizes(pybench.parse_size(args.min_bytes),
                                pybench.parse_size(args.max_bytes), args.factor):
        elems = max(1, nbytes // 4)
        # Zeros while timing: in-place sums of zeros stay zero.
        x = torch.zeros(elems)
        name = "sweep.allreduce.%d" % elems

        def once():
            hvd.synchronize(hvd.allreduce_async_(x, name=name, op=hvd.Sum))

        iters, secs = pybench.time_operation(once, slowest, hvd.barrier, iters=args.iters,
                                             target_seconds=args.target_seconds)
        x.fill_(hvd.rank() + 1.0)
        once()
        wrong = total(int((x != n * (n + 1) / 2).sum()))
        wrong_total += wrong
        if hvd.rank() == 0:
            pybench.print_sweep_row("allreduce", n, elems * 4, iters, secs, wrong)
        del x
    if hvd.rank() == 0:
        print("# Out of bounds values : %d %s\n#" % (wrong_total, "OK" if wrong_total == 0
                                                     else "FAILED"), flush=True)
    hvd.shutdown()
    return 0 if wrong_total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
