"""Horovod's model-parallel API, inside every rank of `krugrun -np N python -m pytest`: the
gradients of local layers and variables stay on their rank (krug.tensorflow's tapes, the Keras
DistributedOptimizers)."""

import os

import numpy as np
import pytest
import tensorflow as tf

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import tf_keras  # noqa: E402

import krug.keras as hvd  # noqa: E402
import krug.tensorflow as hvd_tf  # noqa: E402
import krug.tensorflow.keras as hvd_tfk  # noqa: E402

FLAVOURS = {"keras3": (keras, hvd), "tf_keras": (tf_keras, hvd_tfk)}


def n():
    return hvd.size()


def r():
    return hvd.rank()


def two_layer_model(kmod):
    """Dense(2) -> Dense(1) with the same weights on every rank."""
    model = kmod.Sequential([kmod.Input((3,)), kmod.layers.Dense(2), kmod.layers.Dense(1)])
    rng = np.random.RandomState(4)
    model.set_weights([rng.rand(*w.shape).astype(np.float32) for w in model.get_weights()])
    return model


def rank_data():
    """Inputs and targets that differ on every rank, so that a gradient tells whose it is."""
    rng = np.random.RandomState(10 + r())
    return (tf.constant(rng.rand(4, 3).astype(np.float32)),
            tf.constant(rng.rand(4, 1).astype(np.float32) + r()))


def plain_gradients(model, x, y):
    """(tape, loss, gradients) of this rank's loss; the tape is persistent, to be asked again."""
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    return tape, loss, tape.gradient(loss, model.trainable_variables)


def every_ranks(arrays):
    """[rank][i]: every rank's arrays."""
    return hvd.allgather_object([np.asarray(a) for a in arrays])


def same_objects(xs, ys):
    return len(xs) == len(ys) and all(a is b for a, b in zip(xs, ys))


# --- local layers and sources ------------------------------------------------------------------


def test_tape_get_local_and_global_gradients_keeps_the_local_layer_on_its_rank():
    model = two_layer_model(keras)
    x, y = rank_data()
    own = [g.numpy() for g in plain_gradients(model, x, y)[2]]
    everyone = every_ranks(own)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    tape = hvd_tf.PartialDistributedGradientTape(tape, local_layers=model.layers[0])
    local, shared = tape.get_local_and_global_gradients(loss, model.trainable_variables)
    first, second = model.layers[0].trainable_weights, model.layers[1].trainable_weights
    assert same_objects([v for v, _ in local], first)
    assert same_objects([v for v, _ in shared], second)
    for (_, g), mine in zip(local, own[:2]):
        np.testing.assert_allclose(g.numpy(), mine / n(), rtol=1e-5)  # this rank's, scaled
    for (_, g), k in zip(shared, [2, 3]):
        np.testing.assert_allclose(g.numpy(), np.mean([e[k] for e in everyone], axis=0),
                                   rtol=1e-5)


def test_tape_registered_source_unscaled_inside_tf_function():
    w = tf.Variable([1.0, 2.0])
    mine = tf.Variable([3.0])

    sources = []

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * (r() + 1.0)) + tf.reduce_sum(mine * (r() + 1.0))
        tape = hvd_tf.DistributedGradientTape(tape, scale_local_gradients=False)
        tape.register_local_source(mine)
        (local,), (shared,) = tape.get_local_and_global_gradients(loss, [w, mine])
        sources.extend([local[0], shared[0]])  # Python objects, seen while tracing
        return local[1], shared[1]

    local, shared = step()
    assert same_objects(sources, [mine, w])
    np.testing.assert_allclose(local.numpy(), [r() + 1.0])
    np.testing.assert_allclose(shared.numpy(), [(n() + 1) / 2.0] * 2)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_partial_distributed_optimizer_applies_the_local_layer_unreduced(flavour):
    kmod, api = FLAVOURS[flavour]
    model = two_layer_model(kmod)
    start = model.get_weights()
    x, y = rank_data()
    _, _, grads = plain_gradients(model, x, y)
    own = [g.numpy() for g in grads]
    everyone = every_ranks(own)
    mean = [np.mean([e[k] for e in everyone], axis=0) for k in range(4)]
    lr = 0.5
    opt = api.PartialDistributedOptimizer(kmod.optimizers.SGD(lr),
                                          local_layers=[model.layers[0]])
    opt.apply_gradients(zip(grads, model.trainable_variables))
    got = model.get_weights()
    for k in (0, 1):  # the local layer: this rank's own gradient, divided by the size
        np.testing.assert_allclose(got[k], start[k] - lr * own[k] / n(), rtol=1e-5)
    for k in (2, 3):  # the others: averaged over the ranks
        np.testing.assert_allclose(got[k], start[k] - lr * mean[k], rtol=1e-5)
    if n() > 1:
        kernels = every_ranks([got[0]])
        assert not np.allclose(kernels[0][0], kernels[1][0])


def test_partial_distributed_optimizer_rejects_what_is_not_a_layer():
    with pytest.raises(ValueError, match="local layers must be Keras layers"):
        hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=[object()])
    with pytest.raises(ValueError, match="local layers must be Keras layers"):
        hvd_tf.PartialDistributedGradientTape(tf.GradientTape(), local_layers=[3])
