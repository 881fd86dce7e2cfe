#!/usr/bin/python3
"""Data-parallel training of a small network on scikit-learn's bundled digits with krug.torch.

    krugrun -np 4 /usr/bin/python3 examples/torch_digits.py --epochs 30
    krugrun -np 2 python examples/torch_digits.py --cuda     # on GPUs (docs/gpu.md)

The 1797 8x8 images ship with scikit-learn (no download). They are split 80/20 once, the same
way on every rank (--seed); each epoch the training set is shuffled identically everywhere and
dealt out round-robin, padded so that every rank runs the same number of steps (as
torch.utils.data.DistributedSampler does). Gradients are averaged by hvd.DistributedOptimizer
(or combined with Adasum, --use-adasum); rank 0's initial parameters and optimizer state are
broadcast first. Rank 0 prints the mean training loss and the held-out accuracy every epoch;
each rank scores its share of the held-out set and the counts are summed with hvd.allreduce.
Exits 1 when the final accuracy is below --min-accuracy (0.95). With --cuda each rank trains on
the GPU of its local rank (several ranks may share one). Without scikit-learn the data set is
read from --digits-csv (scikit-learn's own digits.csv.gz, e.g. carried to a machine without it).
"""
import gzip
import sys

import numpy as np
import torch
import torch.nn.functional as F
from digits_common import deal, split, torch_digits_net, training_arguments, verdict

import krug.torch as hvd


def parse_args():
    p = training_arguments(__doc__, lr_help="learning rate for one rank; scaled by the number "
                                            "of ranks unless --use-adasum")
    p.add_argument("--use-adasum", action="store_true", help="combine gradients with Adasum")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--cuda", action="store_true",
                   help="train on CUDA device local_rank %% device_count")
    p.add_argument("--digits-csv", default=None,
                   help="scikit-learn's digits.csv.gz, when scikit-learn is not installed")
    return p.parse_args()


def load_digits_data(csv_path):
    """(images N x 8 x 8 in [0, 16], labels N): scikit-learn's bundled set."""
    if csv_path is None:
        from sklearn.datasets import load_digits
        digits = load_digits()
        return digits.images, digits.target
    with gzip.open(csv_path, "rt") as f:
        table = np.loadtxt(f, delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)


def epoch_shard(train_idx, epoch, seed, rank, size):
    """DistributedSampler-style: same shuffle everywhere, padded to a multiple of size."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return deal(train_idx[torch.randperm(len(train_idx), generator=g).numpy()], rank, size)


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rank, size = hvd.rank(), hvd.size()
    device = torch.device("cpu")
    if args.cuda:
        device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)

    raw_images, raw_labels = load_digits_data(args.digits_csv)
    images = torch.tensor(raw_images / 16.0, dtype=torch.float32).unsqueeze(1)  # N,1,8,8
    labels = torch.tensor(raw_labels, dtype=torch.int64)
    images, labels = images.to(device), labels.to(device)
    train_idx, test_idx = split(len(labels), args.seed)
    test_mine = test_idx[rank::size]  # each rank scores its share of the held-out set

    model = torch_digits_net().to(device)
    lr = args.lr if args.use_adasum else args.lr * size
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        op=hvd.Adasum if args.use_adasum else hvd.Average)

    accuracy = 0.0
    for epoch in range(args.epochs):
        model.train()
        shard = epoch_shard(train_idx, epoch, args.seed, rank, size)
        total_loss, steps = 0.0, 0
        for start in range(0, len(shard), args.batch_size):
            batch = torch.from_numpy(shard[start:start + args.batch_size]).to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images[batch]), labels[batch])
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            steps += 1
        mean_loss = hvd.allreduce(torch.tensor(total_loss / max(steps, 1), device=device),
                                  name="train_loss", op=hvd.Average).item()

        model.eval()
        with torch.no_grad():
            batch = torch.from_numpy(test_mine).to(device)
            correct = (model(images[batch]).argmax(1) == labels[batch]).sum().item()
        counts = hvd.allreduce(torch.tensor([float(correct), float(len(test_mine))],
                                            dtype=torch.float64, device=device),
                               name="test_counts", op=hvd.Sum)
        accuracy = (counts[0] / counts[1]).item()
        if rank == 0:
            print("epoch %3d  loss %.4f  held-out accuracy %.4f" % (epoch + 1, mean_loss, accuracy),
                  flush=True)

    code = verdict(accuracy, args.min_accuracy, rank, size, " on %s (train %d, test %d)"
                   % (device.type, len(train_idx), len(test_idx)))
    hvd.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
