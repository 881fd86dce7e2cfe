#!/usr/bin/python3
"""Small allreduces through krug's Python API (krug.torch), the Python side of krug-step.

    krugrun -np 2 /usr/bin/python3 bench/krug_small_ops.py --tensors 1 --tensor-bytes 4K
    krugrun -np 2 /usr/bin/python3 bench/krug_small_ops.py --tensors 100 --tensor-bytes 1K
    krugrun -np 2 /usr/bin/python3 bench/krug_small_ops.py --shapes bench/resnet50_gradients.txt
    krugrun -np 2 /usr/bin/python3 bench/krug_small_ops.py \
        --steps 1x4K,100x1K,bench/resnet50_gradients.txt     # each in turn, a row each

A step calls hvd.allreduce_async_ (in place, op Sum, float32, one name per tensor that stays
the same from step to step, as DistributedOptimizer's gradients do) for every tensor and then
hvd.synchronize on every handle; --sync makes it one hvd.allreduce_ after the other. With one
tensor it is the time of one allreduce through the Python API. Timing and the output line are
krug-step's (bench/pybench.py); one more step checks the results.
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
    pybench.add_step_arguments(p, tensors=100, tensor_bytes="1K")
    p.add_argument("--sync", action="store_true", help="one hvd.allreduce_ after the other")
    return p.parse_args()


def slowest(v):
    t = hvd.allreduce(torch.tensor([v], dtype=torch.float64), op=hvd.Max, name="small_ops.max")
    return float(t[0])


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)
    wrong = 0
    for i, step in enumerate(pybench.step_list(args)):
        # Names of their own for every step of --steps: the same name keeps its shape.
        wrong += measure(step, "small_ops.%s" % ("m%d." % i if args.steps else ""),
                         header=i == 0, what=args.steps and "each in turn, a row each: " +
                         args.steps)
    hvd.shutdown()
    return 0 if wrong == 0 else 1


def measure(args, prefix, header, what=None):
    """Times one step (args.tensors x args.tensor_bytes, or args.shapes) and prints its row
    (after the header, if header; `what` overrides the step's description there); returns the
    number of wrong elements over all ranks."""
    spec, step_what = pybench.step_tensors(args)
    # Zeros while timing: in-place sums of zeros stay zero (no overflow over many steps).
    tensors = [torch.zeros(shape) for _, shape in spec]
    names = [prefix + name for name, _ in spec]

    def once():
        if args.sync:
            for t, name in zip(tensors, names):
                hvd.allreduce_(t, name=name, op=hvd.Sum)
        else:
            handles = [hvd.allreduce_async_(t, name=name, op=hvd.Sum)
                       for t, name in zip(tensors, names)]
            for h in handles:
                hvd.synchronize(h)

    if header and hvd.rank() == 0:
        pybench.print_step_header(
            "krug_small_ops", what or step_what, hvd.size(),
            "hvd.allreduce_ one after the other" if args.sync
            else "hvd.allreduce_async_ for every tensor, then hvd.synchronize on every handle")
    iters, secs = pybench.time_operation(once, slowest, hvd.barrier, iters=args.iters,
                                         target_seconds=args.target_seconds)
    for t in tensors:
        t.fill_(hvd.rank() + 1.0)
    once()
    n = hvd.size()
    wrong = sum(int((t != n * (n + 1) / 2).sum()) for t in tensors)
    wrong = int(hvd.allreduce(torch.tensor([wrong], dtype=torch.float64), op=hvd.Sum,
                              name="small_ops.wrong")[0])
    if hvd.rank() == 0:
        pybench.print_step_row(len(tensors), 4 * sum(t.numel() for t in tensors), iters, secs,
                               wrong)
    return wrong


if __name__ == "__main__":
    sys.exit(main())
