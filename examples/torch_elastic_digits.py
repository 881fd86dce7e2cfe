#!/usr/bin/python3
"""Elastic data-parallel training on scikit-learn's bundled digits with krug.torch.

    krugrun -np 2 --min-np 1 --max-np 4 --host-discovery-script ./hosts.sh \\
            /usr/bin/python3 examples/torch_elastic_digits.py --epochs 10

The same model and data as torch_digits.py, written for elastic training (docs/elastic.md):
the model, the optimizer, an ElasticSampler and the epoch / step counters live in a
hvd.elastic.TorchState that is committed after every --commit-every steps; the training loop
runs inside @hvd.elastic.run, so when a worker dies the others roll back to the last commit and
go on, and workers on new hosts get the committed state before they train.

The global batch (--global-batch-size) is constant: each rank takes global / size() samples per
step, and the sampler deals every step's global batch as a contiguous block of the epoch's
order. A job therefore trains on the same global batches in the same order however many
workers it has and however often it is reset, and its accuracy matches an undisturbed run (up
to float association). The learning rate is not scaled with the number of ranks.

Rank 0 prints one line per epoch and "final accuracy: A"; the script exits 1 below
--min-accuracy. It runs without elastic mode too (krugrun -np 2 ... or plain python3).

Test hooks (tests/elastic/test_elastic.py): --log-every N prints "step S committed" every N
committed steps; --result-file PATH has rank 0 write a JSON summary, with the ledger of the
global batches in the committed history (one [epoch, samples, CRC-32 of their indices] a step,
kept in the state so a rollback rewinds it with the model); a worker whose
KRUG_HOSTNAME equals KRUG_EXAMPLE_SLEEP_HOST sleeps KRUG_EXAMPLE_SLEEP_SECONDS each step (a
straggler).
"""
import argparse
import json
import math
import os
import sys
import time
import zlib

import numpy as np
import torch
import torch.nn.functional as F
from digits_common import split, torch_digits_net
from sklearn.datasets import load_digits

import krug.torch as hvd


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.1,
                   help="initial learning rate, decayed to 0 over the epochs (cosine)")
    p.add_argument("--global-batch-size", type=int, default=48,
                   help="samples per step over all ranks; must be divisible by the number of "
                        "ranks (48 works for 1, 2, 3, 4, 6 and 8)")
    p.add_argument("--commit-every", type=int, default=1, help="steps between commits")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--min-accuracy", type=float, default=0.95)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--log-every", type=int, default=0,
                   help="print 'step S committed' every N commits (0: never)")
    p.add_argument("--result-file", default="", help="rank 0 writes a JSON summary here")
    return p.parse_args()


def ledger_entry(epoch, indices):
    """[epoch, count, CRC-32 of the sorted indices]: a global batch, whatever the rank count."""
    ordered = sorted(indices)
    return [epoch, len(ordered), zlib.crc32(np.asarray(ordered, dtype=np.int64).tobytes())]


def straggler_sleep():
    host = os.environ.get("KRUG_EXAMPLE_SLEEP_HOST")
    if host and os.environ.get("KRUG_HOSTNAME") == host:
        return float(os.environ.get("KRUG_EXAMPLE_SLEEP_SECONDS", "0"))
    return 0.0


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    digits = load_digits()
    images = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    labels = torch.tensor(digits.target, dtype=torch.int64)
    train_idx, test_idx = split(len(labels), args.seed)
    train_idx = torch.from_numpy(train_idx)

    model = torch_digits_net()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        named_parameters=model.named_parameters())
    # Positions in the training set; the sampler deals them to the ranks.
    sampler = hvd.elastic.ElasticSampler(range(len(train_idx)), shuffle=True, seed=args.seed)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, step=0, resets=0,
                                   accuracy=0.0, ledger=[])
    state.register_reset_callbacks([lambda: setattr(state, "resets", state.resets + 1)])
    pause = straggler_sleep()

    def evaluate():
        test_mine = torch.from_numpy(test_idx[hvd.rank()::hvd.size()])
        model.eval()
        with torch.no_grad():
            correct = (model(images[test_mine]).argmax(1) == labels[test_mine]).sum().item()
        model.train()
        counts = hvd.allreduce(torch.tensor([float(correct), float(len(test_mine))],
                                            dtype=torch.float64), name="test_counts", op=hvd.Sum)
        return (counts[0] / counts[1]).item()

    @hvd.elastic.run
    def train(state):
        if args.global_batch_size % hvd.size() != 0:
            raise SystemExit("--global-batch-size %d is not divisible by the %d ranks"
                             % (args.global_batch_size, hvd.size()))
        per_rank = args.global_batch_size // hvd.size()
        while state.epoch < args.epochs:
            # A function of the committed epoch only, so a rollback restores it too.
            for group in optimizer.param_groups:
                group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * state.epoch / args.epochs))
            # The rest of this epoch as dealt to the current ranks (all of it, unless a reset
            # happened mid-epoch), one local batch per step.
            steps = -(-len(sampler) // per_rank)
            for batch_idx in range(steps):
                if pause:
                    time.sleep(pause)
                batch = train_idx[sampler.get_indices(batch_idx, per_rank)]
                optimizer.zero_grad()
                F.cross_entropy(model(images[batch]), labels[batch]).backward()
                optimizer.step()
                before = set(sampler.processed_indices)
                sampler.record_batch(batch_idx, per_rank)
                state.ledger.append(ledger_entry(state.epoch, sampler.processed_indices - before))
                state.step += 1
                if state.step % args.commit_every == 0:
                    state.commit()
                    if args.log_every and state.step % args.log_every == 0 and hvd.rank() == 0:
                        print("step %d committed at %.3f" % (state.step, time.monotonic()),
                              flush=True)
            state.accuracy = evaluate()
            if hvd.rank() == 0:
                print("epoch %d: accuracy %.4f, ranks %d" % (state.epoch + 1, state.accuracy,
                                                             hvd.size()), flush=True)
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    if hvd.rank() == 0:
        print("final accuracy: %.4f (%d steps, %d resets, %d ranks at the end)"
              % (state.accuracy, state.step, state.resets, hvd.size()), flush=True)
        if args.result_file:
            with open(args.result_file, "w") as f:
                json.dump({"accuracy": state.accuracy, "epochs": state.epoch, "steps": state.step,
                           "resets": state.resets, "ranks": hvd.size(), "ledger": state.ledger}, f)
    ok = state.accuracy >= args.min_accuracy
    if not ok and hvd.rank() == 0:
        print("accuracy %.4f is below %.2f" % (state.accuracy, args.min_accuracy), file=sys.stderr)
    hvd.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
