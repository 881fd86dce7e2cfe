"""A deterministic training job for the attack test (test_attack.py): a small MLP on seeded
synthetic data, with krug.torch's DistributedOptimizer, one rank per host.

Every rank prints one line at the end,

    RESULT rank=R sha256=HEX maxrss_kib=N train_s=T

with the SHA-256 of its final parameters' bytes (in state_dict order), its peak resident set
size (getrusage) and the seconds from init() to the end, so that a run under attack can be
compared bitwise with an undisturbed one.

--hold-workers S makes every rank but 0 wait S seconds before init(): rank 0's control plane
listens only until every rank has connected to it, and the hold keeps that window open long
enough for the attacker to reach it (ranks of a real job start seconds apart too).
--release-file PATH makes them wait instead until PATH exists (at most 120 s), so that the
harness decides when they join.
"""
import argparse
import hashlib
import os
import resource
import time

import torch

import krug.torch as hvd


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--samples", type=int, default=4096, help="synthetic samples per rank")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--hold-workers", type=float, default=0.0)
    p.add_argument("--release-file", default=None)
    return p.parse_args()


def synthetic_data(seed, rank, samples, features=64, classes=10):
    """Each rank its own slice: inputs from a normal distribution, labels from a fixed random
    linear map of them (learnable, so the loss and the parameters keep moving)."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(features, classes, generator=g)
    g_rank = torch.Generator().manual_seed(seed * 1000 + rank + 1)
    x = torch.randn(samples, features, generator=g_rank)
    y = (x @ teacher).argmax(dim=1)
    return x, y


def main():
    args = parse_args()
    torch.set_num_threads(1)
    # KRUG_RANK is known before init(); only the hold uses it.
    if int(os.environ.get("KRUG_RANK", "0")) != 0:
        time.sleep(args.hold_workers)
        if args.release_file:
            print("waiting for release", flush=True)
        deadline = time.monotonic() + 120
        while args.release_file and not os.path.exists(args.release_file):
            if time.monotonic() > deadline:
                raise SystemExit(f"{args.release_file} did not appear in 120 s")
            time.sleep(0.05)
    hvd.init()
    started = time.monotonic()
    rank = hvd.rank()

    torch.manual_seed(args.seed)  # the same initial parameters on every rank; broadcast anyway
    model = torch.nn.Sequential(
        torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    x, y = synthetic_data(args.seed, rank, args.samples)
    batches = args.samples // args.batch
    loss = None
    for step in range(args.steps):
        i = step % batches
        xb, yb = x[i * args.batch:(i + 1) * args.batch], y[i * args.batch:(i + 1) * args.batch]
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 1000 == 0:
            print(f"step {step} loss {loss.item():.6f} t={time.monotonic() - started:.2f}",
                  flush=True)

    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    maxrss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(f"RESULT rank={rank} sha256={digest.hexdigest()} maxrss_kib={maxrss_kib} "
          f"train_s={time.monotonic() - started:.2f} loss={loss.item():.6f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
