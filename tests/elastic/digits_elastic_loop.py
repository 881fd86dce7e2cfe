"""What the framework workers of tests/elastic/test_elastic.py share (tf_elastic_worker.py,
jax_elastic_worker.py): the arguments, the digits split, the elastic training loop with its
ledger, commits and hold, and the result file. A worker supplies its framework's model and one
training step.

The global batch is constant (--global-batch-size, divisible by every rank count the job
takes): step k of an epoch trains on positions [k*G, (k+1)*G) of that epoch's permutation,
dealt to the ranks in equal slices, so the committed history is the same sequence of global
batches whatever the job's size and however often it is reset.

Rank 0 prints "step S trained" after every step and "step S committed" after every commit
(every --commit-every steps and at the end of each epoch): a worker killed between two commits
leaves trained steps that the survivors must roll back and train again. Its --result-file
holds ``ledger`` (one [epoch, batch] per committed step, kept in the state), ``seen`` (how often
each training sample was trained on, kept with the model), the last epoch's mean ``loss``,
``accuracy``, ``resets``, ``ranks`` and ``steps_per_epoch``.
"""
import argparse
import json
import time

import numpy as np
from sklearn.datasets import load_digits

TRAIN = 1440  # training samples: a multiple of 48, so every epoch uses each exactly once


def parse_args(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--global-batch-size", type=int, default=48)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--commit-every", type=int, default=1, help="steps between commits")
    p.add_argument("--result-file", default="")
    p.add_argument("--hold-at-step", type=int, default=0,
                   help="after this step's commit, wait (asking the driver about new hosts) "
                        "until the job has --hold-for-workers workers; 0: never")
    p.add_argument("--hold-for-workers", type=int, default=0)
    return p.parse_args()


def digits(seed):
    """(train_x, train_y, test_x, test_y): the same split on every rank."""
    data = load_digits()
    order = np.random.RandomState(seed).permutation(len(data.target))
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)
    return x[order[:TRAIN]], y[order[:TRAIN]], x[order[TRAIN:]], y[order[TRAIN:]]


def hold(hvd, state, workers, timeout=120.0):
    """Waits until the job has `workers` workers: the test adds a host meanwhile, so the newcomer
    joins at this step however fast training runs. A new host raises HostsUpdatedInterrupt here
    on every rank (elastic.run re-forms the job and carries on after this step's commit)."""
    deadline = time.monotonic() + timeout
    while hvd.size() < workers:
        if time.monotonic() > deadline:
            raise SystemExit("no %d workers after %.0f s" % (workers, timeout))
        time.sleep(0.1)
        state.check_host_updates()


def train_epochs(hvd, state, args, step):
    """The body of the worker's ``@hvd.elastic.run`` function: trains the epochs left in
    ``state`` (which holds epoch, batch, ledger and losses), calling ``step(mine, used)`` for
    each step with this rank's sample indices and the per-sample use counts of the step on this
    rank; ``step`` returns the loss averaged over the ranks."""
    size = hvd.size()
    if args.global_batch_size % size:
        raise SystemExit("--global-batch-size %d is not divisible by %d ranks"
                         % (args.global_batch_size, size))
    per_rank = args.global_batch_size // size
    steps_per_epoch = TRAIN // args.global_batch_size
    while state.epoch < args.epochs:
        perm = np.random.RandomState(args.seed + state.epoch).permutation(TRAIN)
        while state.batch < steps_per_epoch:
            start = state.batch * args.global_batch_size + hvd.rank() * per_rank
            mine = perm[start:start + per_rank]
            used = np.bincount(mine, minlength=TRAIN).astype(np.float32)
            loss = step(mine, used)
            state.ledger.append([state.epoch, state.batch])
            state.losses.append(float(loss))
            state.batch += 1
            done = len(state.ledger)
            if hvd.rank() == 0:
                print("step %d trained" % done, flush=True)
            if done % args.commit_every == 0:
                state.commit()
                if hvd.rank() == 0:
                    print("step %d committed at %.3f" % (done, time.monotonic()), flush=True)
            if done == args.hold_at_step:
                hold(hvd, state, args.hold_for_workers)
        state.epoch += 1
        state.batch = 0
        state.commit()


def report(hvd, args, state, seen, accuracy):
    """Rank 0 prints the final line and writes --result-file."""
    if hvd.rank() != 0:
        return
    steps_per_epoch = TRAIN // args.global_batch_size
    result = {"ledger": state.ledger, "seen": [float(v) for v in seen],
              "loss": float(np.mean(state.losses[-steps_per_epoch:])), "accuracy": accuracy,
              "resets": state.resets, "ranks": hvd.size(), "steps_per_epoch": steps_per_epoch}
    print("final loss %.4f, held-out accuracy %.4f, %d resets, %d ranks"
          % (result["loss"], accuracy, state.resets, hvd.size()), flush=True)
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump(result, f)
