#!/usr/bin/env python3
"""Data-parallel training on scikit-learn's digits with krug.torch in Ray actors, started by
krug.ray.RayExecutor.

    python3 examples/ray_torch_digits.py --num-workers 2            # a local Ray instance
    python3 examples/ray_torch_digits.py --address auto --num-workers 4

Every actor runs train_digits(): the same 80/20 split and per-epoch shuffle as
examples/torch_digits.py, hvd.DistributedOptimizer averaging the gradients. Exits 1 when the
held-out accuracy is below --min-accuracy (0.95). tests/ray runs train_digits on the tests'
cluster.
"""
import argparse
import sys


def train_digits(epochs=30, seed=42, batch_size=32, lr=0.025):
    """One rank's training; returns the held-out accuracy (the same on every rank)."""
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    import krug.torch as hvd

    hvd.init()
    try:
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        rank, size = hvd.rank(), hvd.size()
        digits = load_digits()
        images = torch.tensor(digits.images.reshape(-1, 64) / 16.0, dtype=torch.float32)
        labels = torch.tensor(digits.target, dtype=torch.int64)
        order = np.random.RandomState(seed).permutation(len(labels))
        cut = int(round(0.8 * len(order)))
        train_idx, test_idx = order[:cut], order[cut:]
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=lr * size, momentum=0.9)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        for epoch in range(epochs):
            shuffled = np.random.RandomState(seed + epoch).permutation(train_idx)
            per_rank = -(-len(shuffled) // size)
            mine = np.resize(shuffled, per_rank * size)[rank::size]
            for start in range(0, len(mine), batch_size):
                batch = torch.from_numpy(mine[start:start + batch_size])
                optimizer.zero_grad()
                F.cross_entropy(model(images[batch]), labels[batch]).backward()
                optimizer.step()
        with torch.no_grad():
            mine = torch.from_numpy(test_idx[rank::size])
            correct = (model(images[mine]).argmax(1) == labels[mine]).sum().item()
        counts = hvd.allreduce(torch.tensor([float(correct), float(len(mine))],
                                            dtype=torch.float64), op=hvd.Sum, name="test_counts")
        return float(counts[0] / counts[1])
    finally:
        hvd.shutdown()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--address", default=None, help="Ray cluster address (default: start one)")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--min-accuracy", type=float, default=0.95)
    args = p.parse_args()

    import os

    import ray

    from krug.ray import RayExecutor

    env = {"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}}
    if args.address:
        ray.init(address=args.address, runtime_env=env)
    else:
        ray.init(num_cpus=args.num_workers, include_dashboard=False, runtime_env=env)
    try:
        executor = RayExecutor(RayExecutor.create_settings(timeout_s=60),
                               num_workers=args.num_workers, cpus_per_worker=1)
        executor.start()
        try:
            accuracy = executor.run(train_digits, kwargs={"epochs": args.epochs})[0]
        finally:
            executor.shutdown()
    finally:
        ray.shutdown()
    print("final held-out accuracy %.4f with %d ranks" % (accuracy, args.num_workers), flush=True)
    return 0 if accuracy >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
