#!/usr/bin/python3
"""Data-parallel training of a small network on scikit-learn's bundled digits with krug.jax and
optax, the whole step inside jax.jit.

    krugrun -np 2 /opt/krug/venv/bin/python examples/jax_digits.py --epochs 30

The 1797 8x8 images ship with scikit-learn (no download). They are split 80/20 once, the same
way on every rank (--seed); each epoch the training set is shuffled identically everywhere and
dealt out round-robin, padded so that every rank runs the same number of steps. Rank 0's initial
parameters are broadcast with hvd.broadcast_parameters; hvd.DistributedOptimizer averages the
gradients inside the jitted step. Each rank scores its share of the held-out set and the counts
are summed with hvd.allreduce. Exits 1 when the final accuracy is below --min-accuracy (0.95).
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits
from digits_common import epoch_shard, split, training_arguments, verdict

import krug.jax as hvd


def parse_args():
    p = training_arguments(__doc__)
    return p.parse_args()


def init_params(key, sizes=(64, 64, 10)):
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        params.append({"w": jax.random.normal(sub, (fan_in, fan_out)) * jnp.sqrt(2.0 / fan_in),
                       "b": jnp.zeros(fan_out)})
    return params


def logits(params, x):
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss(params, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits(params, x), y).mean()


def main():
    args = parse_args()
    hvd.init()
    digits = load_digits()
    x_all = (digits.data / 16.0).astype(np.float32)
    y_all = digits.target.astype(np.int32)
    train_idx, test_idx = split(len(x_all), args.seed)

    # Each rank starts from its own random parameters; rank 0's win.
    params = hvd.broadcast_parameters(init_params(jax.random.key(args.seed + hvd.rank())),
                                      root_rank=0)
    tx = hvd.DistributedOptimizer(optax.sgd(args.lr * hvd.size(), momentum=0.9))
    state = tx.init(params)

    @jax.jit
    def step(params, state, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    for epoch in range(args.epochs):
        mine = epoch_shard(train_idx, epoch, args.seed, hvd.rank(), hvd.size())
        total = 0.0
        for start in range(0, len(mine), args.batch_size):
            batch = mine[start:start + args.batch_size]
            params, state, value = step(params, state, x_all[batch], y_all[batch])
            total += float(value)
        if hvd.rank() == 0 and (epoch + 1) % 5 == 0:
            print("epoch %d: mean loss %.4f" % (epoch + 1, total / max(1, -(-len(mine) //
                                                                          args.batch_size))))

    shard = test_idx[hvd.rank()::hvd.size()]
    correct = jnp.sum(jnp.argmax(logits(params, x_all[shard]), axis=1) == y_all[shard])
    counts = hvd.allreduce(jnp.asarray([correct, len(shard)], jnp.int32), op=hvd.Sum,
                           name="accuracy")
    accuracy = float(counts[0]) / float(counts[1])
    code = verdict(accuracy, args.min_accuracy, hvd.rank(), hvd.size(),
                   " (%d of %d)" % (int(counts[0]), int(counts[1])))
    hvd.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
