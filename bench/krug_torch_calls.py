#!/usr/bin/python3
"""The time of krug.torch's synchronous calls on small tensors, one kind after the other: the
Python API's own cost on top of the direct lane (docs/benchmarks.md, "2026-12-03, morning").

    krugrun -np 2 /opt/krug/venv/bin/python bench/krug_torch_calls.py [--calls 20000]

Each kind runs --calls times after 300 untimed calls; a row gives the average of the slowest
rank in microseconds ("kind|us"). Compare two builds by running it under each one's krugrun in
turn, round by round.
"""
import argparse
import sys
import time

import torch

import krug.torch as hvd


def kinds(t, m):
    s = hvd.Sum
    return [
        ("allreduce_(t, name=)", lambda: hvd.allreduce_(t, name="calls.ar_", op=s)),
        ("allreduce_(t) unnamed", lambda: hvd.allreduce_(t, op=s)),
        ("allreduce(t, name=)", lambda: hvd.allreduce(t, name="calls.ar", op=s)),
        ("allreduce(t) unnamed", lambda: hvd.allreduce(t, op=s)),
        ("broadcast_(t, 0, name=)", lambda: hvd.broadcast_(t, 0, name="calls.bc_")),
        ("broadcast(t, 0, name=)", lambda: hvd.broadcast(t, 0, name="calls.bc")),
        ("allgather(m, name=)", lambda: hvd.allgather(m, name="calls.ag")),
    ]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=20000, help="timed calls per kind")
    args = p.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    t, m = torch.zeros(1), torch.zeros(4)  # one float32, and four
    if hvd.rank() == 0:
        print("# krug_torch_calls: %d ranks, %d calls per kind; kind|average us (slowest rank)"
              % (hvd.size(), args.calls), flush=True)
    for label, call in kinds(t, m):
        hvd.barrier()
        for _ in range(300):
            call()
        hvd.barrier()
        start = time.perf_counter()
        for _ in range(args.calls):
            call()
        us = (time.perf_counter() - start) / args.calls * 1e6
        us = hvd.allreduce(torch.tensor([us], dtype=torch.float64), op=hvd.Max,
                           name="calls.slowest").item()
        if hvd.rank() == 0:
            print("%s|%.3f" % (label, us), flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
