"""Horovod's model-parallel API and local gradient aggregation, inside every rank of
`krugrun -np N python -m pytest`: the gradients of local layers and variables stay on their rank
(krug.tensorflow's tapes, the Keras DistributedOptimizers), and backward_passes_per_step sums
gradients locally and reduces them on every n-th pass, with the values Horovod's
LocalGradientAggregationHelper gives (eagerly and inside tf.function)."""

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
# tf_keras' two optimizer APIs: the new one (compute_gradients) and the legacy OptimizerV2
# (_compute_gradients, get_gradients), which Horovod's tests use.
TF_KERAS_SGD = {"new": tf_keras.optimizers.SGD, "legacy": tf_keras.optimizers.legacy.SGD}


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


@pytest.mark.parametrize("kind", TF_KERAS_SGD)
def test_partial_distributed_optimizer_compute_gradients_as_horovods_test(kind):
    # Horovod's test_partial_distributed_optimizer: the tape's gradient equals size times the
    # optimizer's for local layers, and differs from it for the others (ranks' weights differ).
    model = two_layer_model(tf_keras)
    model.set_weights([w + r() for w in model.get_weights()])
    x, y = rank_data()
    tape, loss, grads = plain_gradients(model, x, y)
    opt = hvd_tfk.PartialDistributedOptimizer(TF_KERAS_SGD[kind](0.1), sparse_as_dense=True,
                                              local_layers=model.layers[:1])
    pairs = opt._compute_gradients(loss, model.trainable_variables, tape=tape)
    assert same_objects([v for _, v in pairs], model.trainable_variables)
    everyone = every_ranks(grads)
    for k, (g, _) in enumerate(pairs):
        if k < 2:
            np.testing.assert_allclose(grads[k].numpy(), n() * g.numpy(), rtol=1e-5)
        else:
            np.testing.assert_allclose(g.numpy(), np.mean([e[k] for e in everyone], axis=0),
                                       rtol=1e-5)


def test_partial_distributed_optimizer_rejects_what_is_not_a_layer():
    with pytest.raises(ValueError, match="local layers must be Keras layers"):
        hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=[object()])
    with pytest.raises(ValueError, match="local layers must be Keras layers"):
        hvd_tf.PartialDistributedGradientTape(tf.GradientTape(), local_layers=[3])


# --- local gradient aggregation (backward_passes_per_step) -------------------------------------

PASSES = 4


def horovods_expected(pass_index, average, grad_mean, start):
    """Horovod's test_gradient_aggregation: with SGD(1.0), a variable whose gradient is always
    `grad_mean` (after averaging over the ranks) has moved by the full cycles so far, each the
    sum of PASSES gradients (their mean with average_aggregated_gradients)."""
    cycles = (pass_index + 1) // PASSES
    per_cycle = grad_mean if average else grad_mean * PASSES
    return start - cycles * per_cycle


def aggregation_loss(x, y):
    """Rank r's loss (r + 1) * (x - y[0]): dloss/dx = r + 1; dloss/dy = [-(r + 1), 0] comes as
    IndexedSlices (tf.gather)."""
    return (r() + 1.0) * (x - tf.gather(y, [0]))


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("kind", TF_KERAS_SGD)
def test_aggregation_matches_horovods_expected_values(kind, average, mode):
    opt = hvd_tfk.DistributedOptimizer(TF_KERAS_SGD[kind](1.0), backward_passes_per_step=PASSES,
                                       average_aggregated_gradients=average,
                                       sparse_as_dense=True)
    x, y = tf.Variable([0.0]), tf.Variable([1.0, 2.0])
    mean = (n() + 1) / 2.0  # the ranks' gradients of x, averaged

    def step():
        pairs = opt._compute_gradients(lambda: aggregation_loss(x, y), var_list=[x, y])
        opt.apply_gradients(pairs, experimental_aggregate_gradients=False)
        return pairs[0][0]

    run = tf.function(step) if mode == "function" else step
    for i in range(10):
        gx = run().numpy()
        within = i % PASSES + 1
        if within < PASSES:  # this rank's own sum so far, not reduced
            np.testing.assert_allclose(gx, [within * (r() + 1.0)])
        else:
            np.testing.assert_allclose(gx, [mean if average else mean * PASSES])
        np.testing.assert_allclose(x.numpy(), [horovods_expected(i, average, mean, 0.0)])
        np.testing.assert_allclose(y.numpy(), [horovods_expected(i, average, -mean, 1.0), 2.0])
        assert int(opt.iterations.numpy()) == i + 1  # every pass counts (horovod#3631)
    assert int(opt._agg_helper.counter.numpy()) == 10 % PASSES


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("kind", TF_KERAS_SGD)
def test_aggregation_recovers_from_an_infinite_gradient(kind, mode):
    # Horovod's test_grad_aggregation_with_inf_grad: the first cycle's gradient is infinite; the
    # sums must start the next cycle from zero, not from inf - inf = nan.
    opt = hvd_tfk.DistributedOptimizer(TF_KERAS_SGD[kind](0.01), backward_passes_per_step=2)
    x = tf.Variable(0.0)
    calls = tf.Variable(0)

    def loss():
        calls.assign_add(1)
        return tf.cond(calls > 1, lambda: x, lambda: x * float("inf"))

    def step():
        pairs = opt._compute_gradients(loss, var_list=[x])
        opt.apply_gradients(pairs)
        return pairs[0][0]

    run = tf.function(step) if mode == "function" else step
    grads = [float(run()) for _ in range(4)]
    assert np.isinf(grads[0]) and np.isinf(grads[1])
    assert grads[2:] == [1.0, 2.0]  # this cycle's own sums: 1, then 1 + 1 reduced


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_aggregation_keeps_local_variables_unreduced(flavour, average, mode):
    # Horovod's test_gradient_aggregation_with_local_vars: a local variable gets this rank's
    # aggregated gradient divided by the size; a shared one the ranks' average.
    kmod, api = FLAVOURS[flavour]
    opt = api.DistributedOptimizer(kmod.optimizers.SGD(1.0), backward_passes_per_step=2,
                                   average_aggregated_gradients=average)
    mine, shared = tf.Variable([0.0]), tf.Variable([0.0])
    if flavour == "keras3":
        mine, shared = keras.Variable([0.0]), keras.Variable([0.0])
    opt.register_local_var(mine)

    def step():
        with tf.GradientTape() as tape:
            loss = (r() + 1.0) * (tf.reduce_sum(mine) + tf.reduce_sum(shared))
        grads = tape.gradient(loss, [mine, shared])
        opt.apply_gradients(zip(grads, [mine, shared]))

    run = tf.function(step) if mode == "function" else step
    for _ in range(4):
        run()
    per_cycle = 1.0 if average else 2.0  # two passes' sum, or its mean
    np.testing.assert_allclose(np.asarray(mine), [-2 * per_cycle * (r() + 1.0) / n()])
    np.testing.assert_allclose(np.asarray(shared), [-2 * per_cycle * (n() + 1) / 2.0])
    assert int(np.asarray(opt.iterations)) == 4


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_fit_counts_every_pass_as_an_iteration(flavour):
    kmod, api = FLAVOURS[flavour]
    model = two_layer_model(kmod)
    opt = api.DistributedOptimizer(kmod.optimizers.SGD(0.1), backward_passes_per_step=2)
    model.compile(optimizer=opt, loss="mse")
    x, y = rank_data()
    model.fit(x, y, batch_size=1, epochs=1, shuffle=False, verbose=0)  # 4 passes, 2 applied
    assert int(np.asarray(opt.iterations)) == 4
    assert int(opt._agg_helper.counter.numpy()) == 0


# --- what Keras 3 cannot do --------------------------------------------------------------------


@pytest.mark.parametrize("method", ["compute_gradients", "_compute_gradients", "get_gradients",
                                    "minimize"])
def test_keras3_gradient_computation_names_the_alternatives(method):
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    with pytest.raises(NotImplementedError) as error:
        getattr(opt, method)(lambda: 0.0, [])
    assert "DistributedGradientTape" in str(error.value)
    assert "TF_USE_LEGACY_KERAS=1" in str(error.value)
