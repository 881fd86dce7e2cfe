#!/usr/bin/python3
"""Training throughput of a torchvision model on synthetic data with krug.torch.

    krugrun -np 2 /usr/bin/python3 examples/torch_synthetic_benchmark.py --model resnet18 \
        --batch-size 8 --num-iters 5

Every rank trains the model on one fixed random batch (no data loading), with gradients
averaged by hvd.DistributedOptimizer (optionally compressed to float16 on the wire, or
combined with Adasum). After --num-warmup-batches steps, --num-iters timed iterations of
--num-batches-per-iter steps each give img/sec samples; rank 0 prints the mean per rank with a
95% interval (1.96 standard deviations) and the total over all ranks.
"""
import sys

import torch
import torch.nn.functional as F
from torchvision import models

from synthetic_common import benchmark_arguments, log_totals, time_steps

import krug.torch as hvd


def parse_args():
    p = benchmark_arguments(__doc__, "resnet50", "torchvision model name, e.g. resnet18")
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="compress gradients to float16 for the allreduce")
    p.add_argument("--use-adasum", action="store_true", help="combine gradients with Adasum")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads per rank; 0 keeps torch's own choice "
                        "(OMP_NUM_THREADS, which krugrun sets to each rank's share of the cores)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def log(message):
    if hvd.rank() == 0:
        print(message, flush=True)


def main():
    args = parse_args()
    hvd.init()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed + hvd.rank())  # different data per rank; weights from rank 0

    if not hasattr(models, args.model):
        raise SystemExit("unknown torchvision model '%s'" % args.model)
    model = getattr(models, args.model)(num_classes=args.num_classes)

    # Adasum does not need the learning rate scaled with the number of ranks.
    lr_scaler = 1 if args.use_adasum else hvd.size()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * lr_scaler)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression,
        op=hvd.Adasum if args.use_adasum else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, args.num_classes, (args.batch_size,))

    def step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    log("Model: %s" % args.model)
    log("Batch size: %d, image size: %d, threads per rank: %d"
        % (args.batch_size, args.image_size, torch.get_num_threads()))
    log("Number of ranks: %d; gradients: %s%s"
        % (hvd.size(), "Adasum" if args.use_adasum else "average",
           ", float16 on the wire" if args.fp16_allreduce else ""))

    mean, conf = time_steps(step, args, log)
    # Every rank's own rate, gathered so rank 0 can show them all.
    per_rank = hvd.allgather(torch.tensor([mean], dtype=torch.float64), name="img_sec")
    for r, v in enumerate(per_rank.tolist()):
        log("Rank %d: %.1f img/sec" % (r, v))
    log_totals(log, hvd.size(), mean, conf)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
