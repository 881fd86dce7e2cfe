"""An elastic krug.jax worker for tests/elastic/test_elastic.py: a small network trained on
scikit-learn's digits with a jitted optax step inside ``@hvd.elastic.run``, its parameters,
optimizer state and counters in a ``hvd.elastic.JaxState``.

    krugrun --host-discovery-script ./discover.sh --min-np 2 \\
            python tests/elastic/jax_elastic_worker.py --result-file result.json

As tf_elastic_worker.py (same data, global batches and checks): step k of an epoch trains on
positions [k*G, (k+1)*G) of that epoch's permutation, dealt to the ranks in equal slices, so the
committed history is the same sequence of global batches whatever the job's size.

What the test checks, from rank 0's --result-file:
- ``ledger``: one [epoch, batch] per committed step, kept in the state: every step once.
- ``seen``: an array in the state to which every jitted step adds how often it used each
  training sample (an allreduce): after E epochs every sample counts E exactly, so a step lost
  or applied twice to the arrays would show there.
- ``loss`` and ``accuracy`` of the trained model.
Rank 0 prints "step S trained" after every step and "step S committed" after every commit.
"""
import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import krug.jax as hvd

TRAIN = 1440  # training samples: a multiple of 48, so every epoch uses each exactly once


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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


def hold(state, workers, timeout=120.0):
    """Waits until the job has `workers` workers (a new host raises HostsUpdatedInterrupt here
    on every rank; elastic.run re-forms the job and carries on after this step's commit)."""
    deadline = time.monotonic() + timeout
    while hvd.size() < workers:
        if time.monotonic() > deadline:
            raise SystemExit("no %d workers after %.0f s" % (workers, timeout))
        time.sleep(0.1)
        state.check_host_updates()


def init_params(key):
    k1, k2 = jax.random.split(key)
    return {"hidden": {"w": jax.random.normal(k1, (64, 32)) * 0.17, "b": jnp.zeros(32)},
            "out": {"w": jax.random.normal(k2, (32, 10)) * 0.25, "b": jnp.zeros(10)}}


def logits(params, x):
    h = jax.nn.relu(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return h @ params["out"]["w"] + params["out"]["b"]


def main():
    args = parse_args()
    hvd.init()
    digits = load_digits()
    order = np.random.RandomState(args.seed).permutation(len(digits.target))
    x = (digits.data / 16.0).astype(np.float32)
    train_x, train_y = x[order[:TRAIN]], digits.target[order[:TRAIN]].astype(np.int32)
    test_x, test_y = x[order[TRAIN:]], digits.target[order[TRAIN:]]
    steps_per_epoch = TRAIN // args.global_batch_size

    tx = hvd.DistributedOptimizer(optax.sgd(args.lr, momentum=0.9))
    params = init_params(jax.random.key(args.seed + hvd.rank()))  # rank 0's win at the sync
    state = hvd.elastic.JaxState(params=params, opt_state=tx.init(params),
                                 seen=jnp.zeros(TRAIN), epoch=0, batch=0, ledger=[], losses=[],
                                 resets=0)
    state.register_reset_callbacks([lambda: setattr(state, "resets", state.resets + 1)])

    def loss_fn(params, xb, yb):
        return optax.softmax_cross_entropy_with_integer_labels(logits(params, xb), yb).mean()

    @jax.jit
    def train_step(params, opt_state, seen, xb, yb, used):
        loss, grads = jax.value_and_grad(loss_fn)(params, xb, yb)
        updates, opt_state = tx.update(grads, opt_state, params)
        seen = seen + hvd.allreduce(used, op=hvd.Sum, name="seen")
        return optax.apply_updates(params, updates), opt_state, seen, hvd.allreduce(loss)

    @hvd.elastic.run
    def train(state):
        size = hvd.size()
        if args.global_batch_size % size:
            raise SystemExit("--global-batch-size %d is not divisible by %d ranks"
                             % (args.global_batch_size, size))
        per_rank = args.global_batch_size // size
        while state.epoch < args.epochs:
            perm = np.random.RandomState(args.seed + state.epoch).permutation(TRAIN)
            while state.batch < steps_per_epoch:
                start = state.batch * args.global_batch_size + hvd.rank() * per_rank
                mine = perm[start:start + per_rank]
                used = np.bincount(mine, minlength=TRAIN).astype(np.float32)
                state.params, state.opt_state, state.seen, loss = train_step(
                    state.params, state.opt_state, state.seen, train_x[mine], train_y[mine],
                    used)
                state.ledger.append([state.epoch, state.batch])
                state.losses.append(float(loss))
                state.batch += 1
                step = len(state.ledger)
                if hvd.rank() == 0:
                    print("step %d trained" % step, flush=True)
                if step % args.commit_every == 0:
                    state.commit()
                    if hvd.rank() == 0:
                        print("step %d committed at %.3f" % (step, time.monotonic()), flush=True)
                if step == args.hold_at_step:
                    hold(state, args.hold_for_workers)
            state.epoch += 1
            state.batch = 0
            state.commit()

    train(state)
    accuracy = float(np.mean(np.argmax(np.asarray(logits(state.params, test_x)), axis=1) ==
                             test_y))
    if hvd.rank() == 0:
        result = {"ledger": state.ledger, "seen": np.asarray(state.seen).tolist(),
                  "loss": float(np.mean(state.losses[-steps_per_epoch:])),
                  "accuracy": accuracy, "resets": state.resets, "ranks": hvd.size(),
                  "steps_per_epoch": steps_per_epoch}
        print("final loss %.4f, held-out accuracy %.4f, %d resets, %d ranks"
              % (result["loss"], accuracy, state.resets, hvd.size()), flush=True)
        if args.result_file:
            with open(args.result_file, "w") as f:
                json.dump(result, f)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
