#!/usr/bin/python3
"""PyTorch DistributedDataParallel (Gloo), the peer of examples/torch_synthetic_benchmark.py.

    /usr/bin/python3 bench/peers/ddp_synthetic.py --np 2 --model resnet18 --batch-size 16 \
        --image-size 64
    /usr/bin/python3 bench/peers/ddp_synthetic.py --plain --model resnet18 ...   # no DDP
    /usr/bin/python3 bench/peers/ddp_synthetic.py --np 2 --lockstep ...   # a barrier, no data

The same model, fixed random batch, SGD step, warm-up and timed iterations as the krug example
(same options and defaults), with gradients averaged by DDP over Gloo instead of
hvd.DistributedOptimizer. --np ranks are started here (torch's env:// rendezvous on a free
port), --threads intra-op threads each (default 1). --plain trains in this one process with no
distribution at all: the baseline of scaling efficiency. --lockstep starts the ranks without
DDP: each trains alone and only waits for the others once per step (a Gloo barrier, no
gradients), the most any synchronous data-parallel training reaches here. Rank 0 prints the
same result lines as the example ("Img/sec per rank", "Total img/sec on N rank(s)").
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), os.path.join(HERE, "..", "..", "examples")]
import pybench  # noqa: E402
from synthetic_common import benchmark_arguments, log_totals, time_steps  # noqa: E402


def parse_args():
    p = benchmark_arguments(__doc__, "resnet50", "torchvision model name, e.g. resnet18")
    p.add_argument("--np", type=int, default=2, help="ranks to start (default 2)")
    p.add_argument("--plain", action="store_true", help="one process, no distribution")
    p.add_argument("--lockstep", action="store_true",
                   help="ranks without DDP that wait for each other once per step")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=int, default=1800, help="kill the ranks after this (s)")
    return p.parse_args()


def train(args, rank, size, wrap, label, after_step=None):
    """Times the training steps; returns this rank's mean img/sec and its 1.96-sigma spread.
    after_step, if given, runs at the end of every step."""
    import torch
    import torch.nn.functional as F
    from torchvision import models

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed + rank)
    if not hasattr(models, args.model):
        raise SystemExit("unknown torchvision model '%s'" % args.model)
    model = wrap(getattr(models, args.model)(num_classes=args.num_classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, args.num_classes, (args.batch_size,))

    def step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        if after_step:
            after_step()

    def log(message):
        if rank == 0:
            print(message, flush=True)

    log("Model: %s" % args.model)
    log("Batch size: %d, image size: %d, threads per rank: %d"
        % (args.batch_size, args.image_size, args.threads))
    log("Number of ranks: %d; gradients: %s" % (size, label))
    return time_steps(step, args, log)


def _identity(model):
    return model


def report(size, per_rank):
    """per_rank: [(mean, conf)] of every rank."""
    for r, (v, _) in enumerate(per_rank):
        print("Rank %d: %.1f img/sec" % (r, v))
    mean = sum(v for v, _ in per_rank) / size
    conf = sum(c for _, c in per_rank) / size
    log_totals(lambda message: print(message, flush=True), size, mean, conf)


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method="env://")
    rank, size = dist.get_rank(), dist.get_world_size()

    def wrap(model):
        # Same starting weights on every rank, as the krug example broadcasts from rank 0:
        # DDP's constructor broadcasts rank 0's parameters.
        return DDP(model)

    if args.lockstep:
        # Synchronous training without its data: every step ends when the slowest rank's does,
        # and the ranks' steps run side by side. What is left for gradients to cost is the gap
        # between this and a data-parallel run.
        mean, conf = train(args, rank, size, _identity, "none (a barrier per step)",
                           after_step=dist.barrier)
    else:
        mean, conf = train(args, rank, size, wrap, "DDP (gloo) average")
    gathered = [torch.zeros(2, dtype=torch.float64) for _ in range(size)]
    dist.all_gather(gathered, torch.tensor([mean, conf], dtype=torch.float64))
    if rank == 0:
        report(size, [(float(g[0]), float(g[1])) for g in gathered])
    dist.barrier()
    pybench.hard_exit(0)  # torch 1.13's gloo teardown can hang


def main():
    args = parse_args()
    if args.plain:
        report(1, [train(args, 0, 1, _identity, "none (one plain process)")])
        return 0
    if "RANK" in os.environ and "MASTER_PORT" in os.environ:
        worker(args)
    return pybench.spawn_ranks(os.path.abspath(__file__), sys.argv[1:], args.np, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
