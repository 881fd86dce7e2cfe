"""An elastic krug.jax worker for tests/elastic/test_elastic.py: a small network trained on
scikit-learn's digits with a jitted optax step inside ``@hvd.elastic.run``, its parameters,
optimizer state and counters in a ``hvd.elastic.JaxState``.

    krugrun --host-discovery-script ./discover.sh --min-np 2 \\
            python tests/elastic/jax_elastic_worker.py --result-file result.json

The loop, its output and the result file are digits_elastic_loop.py's. ``seen`` is an array in
the state to which every jitted step adds how often it used each training sample (an
allreduce): after E epochs every sample counts E exactly, so a step lost or applied twice to
the arrays would show there.
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

import krug.jax as hvd
from digits_elastic_loop import TRAIN, digits, parse_args, report, train_epochs


def init_params(key):
    k1, k2 = jax.random.split(key)
    return {"hidden": {"w": jax.random.normal(k1, (64, 32)) * 0.17, "b": jnp.zeros(32)},
            "out": {"w": jax.random.normal(k2, (32, 10)) * 0.25, "b": jnp.zeros(10)}}


def logits(params, x):
    h = jax.nn.relu(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return h @ params["out"]["w"] + params["out"]["b"]


def main():
    args = parse_args(__doc__.split("\n")[0])
    hvd.init()
    train_x, train_y, test_x, test_y = digits(args.seed)

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

    def step(mine, used):
        state.params, state.opt_state, state.seen, loss = train_step(
            state.params, state.opt_state, state.seen, train_x[mine], train_y[mine], used)
        return loss

    @hvd.elastic.run
    def train(state):
        train_epochs(hvd, state, args, step)

    train(state)
    accuracy = float(np.mean(np.argmax(np.asarray(logits(state.params, test_x)), axis=1) ==
                             test_y))
    report(hvd, args, state, np.asarray(state.seen), accuracy)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
