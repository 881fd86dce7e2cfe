"""The call that crashed on the GPU machine (docs/gpu.md): an Adasum allreduce of a CPU tensor,
the first use of Gloo in a one-host job, reduced to a script, with or without a CUDA context made
first. scripts/gpu-check runs both, so the difference between them points at the cause.

Usage: krugrun -np 2 python bench/gpu/adasum_probe.py [--cuda-context]
"""
import argparse
import sys

import torch

import krug.torch as hvd


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda-context", action="store_true",
                        help="make a CUDA context on this rank's device before the call")
    args = parser.parse_args()
    hvd.init()
    if args.cuda_context:
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        torch.zeros(1, device="cuda")
    x = torch.arange(50, dtype=torch.float32) + hvd.rank() + 0.5
    print("rank %d: calling Adasum allreduce (cuda context: %s)" % (hvd.rank(), args.cuda_context),
          flush=True)
    out = hvd.allreduce(x, name="probe.adasum", op=hvd.Adasum)
    # Two ranks' inputs differ by 1 in every element; Adasum of near-parallel vectors is close to
    # their mean, so a sane result lies between the smallest and largest input.
    lowest, highest = x - hvd.rank(), x - hvd.rank() + hvd.size() - 1
    ok = bool(((out >= lowest - 1e-3) & (out <= highest + 1e-3)).all())
    print("rank %d: Adasum result %s ... %s" % (hvd.rank(), out[:3].tolist(),
                                                "in range" if ok else "OUT OF RANGE"), flush=True)
    hvd.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
