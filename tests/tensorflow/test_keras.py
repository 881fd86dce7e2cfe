"""krug.keras (Keras 3) and krug.tensorflow.keras (tf_keras): DistributedOptimizer against
single-process training on the concatenated batch, the callbacks, SyncBatchNormalization,
load_model and elastic state, inside every rank of `krugrun -np N python -m pytest`."""

import os

import numpy as np
import pytest
import tensorflow as tf

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import tf_keras  # noqa: E402

import krug.keras as hvd  # noqa: E402
import krug.tensorflow.keras as hvd_tfk  # noqa: E402

FLAVOURS = {"keras3": (keras, hvd), "tf_keras": (tf_keras, hvd_tfk)}


def n():
    return hvd.size()


def r():
    return hvd.rank()


def data_of(rank, rows=4, seed=0):
    rng = np.random.RandomState(seed + rank)
    x = rng.rand(rows, 3).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.1 * rank).astype(np.float32)
    return x, y


def linear(kmod, seed):
    model = kmod.Sequential([kmod.Input((3,)), kmod.layers.Dense(1)])
    rng = np.random.RandomState(seed)
    model.set_weights([rng.rand(3, 1).astype(np.float32), rng.rand(1).astype(np.float32)])
    return model


def reference_weights(kmod, steps, passes=1, lr=0.1):
    """Plain SGD on every rank's data concatenated (what the distributed run must equal)."""
    model = linear(kmod, seed=7)
    opt = kmod.optimizers.SGD(lr)
    for step in range(steps):
        xs, ys = zip(*[data_of(k, seed=step * passes + p) for p in range(passes)
                       for k in range(n())])
        x, y = tf.constant(np.concatenate(xs)), tf.constant(np.concatenate(ys))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
    return [w for w in model.get_weights()]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_distributed_optimizer_equals_training_on_the_concatenated_batch(flavour):
    kmod, api = FLAVOURS[flavour]
    model = linear(kmod, seed=7)
    opt = api.DistributedOptimizer(kmod.optimizers.SGD(0.1))
    for step in range(3):
        x, y = data_of(r(), seed=step)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(tf.constant(x)) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
    for got, want in zip(model.get_weights(), reference_weights(kmod, 3)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_fit_with_backward_passes_per_step(flavour):
    kmod, api = FLAVOURS[flavour]
    model = linear(kmod, seed=7)
    opt = api.DistributedOptimizer(kmod.optimizers.SGD(0.1), backward_passes_per_step=2,
                                   average_aggregated_gradients=True)
    model.compile(optimizer=opt, loss="mse")
    # Two local batches per applied step; 2 applied steps.
    xs, ys = zip(*[data_of(r(), seed=s) for s in range(4)])
    model.fit(np.concatenate(xs), np.concatenate(ys), batch_size=4, epochs=1, shuffle=False,
              verbose=0)
    for got, want in zip(model.get_weights(), reference_weights(kmod, 2, passes=2)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def all_equal_across_ranks(arrays):
    gathered = hvd.allgather_object([np.asarray(a) for a in arrays])
    for other in gathered[1:]:
        for a, b in zip(gathered[0], other):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_callbacks_leave_equal_weights_and_averaged_metrics(flavour):
    kmod, api = FLAVOURS[flavour]
    model = linear(kmod, seed=100 + r())  # different on every rank until the broadcast
    lr = 0.05 * n()
    model.compile(optimizer=api.DistributedOptimizer(kmod.optimizers.SGD(lr, momentum=0.5)),
                  loss="mse")
    x, y = data_of(r(), rows=8)
    history = model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[
        api.callbacks.BroadcastGlobalVariablesCallback(0),
        api.callbacks.MetricAverageCallback(),
        api.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=2)])
    all_equal_across_ranks(model.get_weights())
    losses = hvd.allgather_object(history.history["loss"])
    for other in losses[1:]:
        np.testing.assert_allclose(other, losses[0], rtol=1e-6)
    # The warm-up ramps from lr/size (epoch 0) to lr (epoch 2 and after).
    np.testing.assert_allclose(history.history["lr"][-1], lr, rtol=1e-6)
    np.testing.assert_allclose(float(np.asarray(model.optimizer.learning_rate)), lr, rtol=1e-6)


def test_learning_rate_schedule_callback():
    model = linear(keras, seed=1)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(1.0)), loss="mse")
    x, y = data_of(r(), rows=4)
    history = model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=1.0, multiplier=lambda e: 0.1 ** e,
                                                   start_epoch=1)])
    np.testing.assert_allclose(history.history["lr"], [1.0, 0.1, 0.01], rtol=1e-6)


def test_learning_rate_schedule_with_a_constant_multiplier_decays():
    # Horovod's rule: a constant multiplier m gives initial_lr * m ** (epoch - start_epoch).
    model = linear(keras, seed=1)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(1.0)), loss="mse")
    x, y = data_of(r(), rows=4)
    history = model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=1.0, multiplier=0.5)])
    np.testing.assert_allclose(history.history["lr"], [1.0, 0.5, 0.25], rtol=1e-6)


def test_sync_batch_normalization_equals_batch_norm_on_the_concatenated_batch():
    rows = [k + 2 for k in range(n())]  # uneven batches
    rng = np.random.RandomState(3)
    full = rng.rand(sum(rows), 4).astype(np.float32) * 5
    start = sum(rows[:r()])
    mine = full[start:start + rows[r()]]
    sync = hvd.SyncBatchNormalization(momentum=0.5)
    plain = keras.layers.BatchNormalization(momentum=0.5)
    with tf.GradientTape(persistent=True) as tape:
        x_mine = tf.constant(mine)
        x_full = tf.constant(full)
        tape.watch([x_mine, x_full])
        out_mine = sync(x_mine, training=True)
        out_full = plain(x_full, training=True)
        loss_mine = tf.reduce_sum(out_mine * tf.range(1.0, 5.0))
        loss_full = tf.reduce_sum(out_full * tf.range(1.0, 5.0))
    np.testing.assert_allclose(out_mine.numpy(), out_full.numpy()[start:start + rows[r()]],
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sync.moving_mean.numpy(), plain.moving_mean.numpy(), rtol=1e-5)
    g_mine = tape.gradient(loss_mine, x_mine).numpy()
    g_full = tape.gradient(loss_full, x_full).numpy()
    np.testing.assert_allclose(g_mine, g_full[start:start + rows[r()]], rtol=1e-3, atol=1e-4)


def test_load_model_restores_a_distributed_optimizer(tmp_path):
    path = str(tmp_path / ("model%d.keras" % r()))
    model = linear(keras, seed=5)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    x, y = data_of(r())
    model.fit(x, y, epochs=1, verbose=0)
    model.save(path)
    loaded = hvd.load_model(path)
    assert type(loaded.optimizer).__name__ == "Adam"
    assert hasattr(loaded.optimizer, "_krug_reduce")
    np.testing.assert_allclose(int(loaded.optimizer.iterations), 1)
    loaded.fit(x, y, epochs=1, verbose=0, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    all_equal_across_ranks(loaded.get_weights())


def test_best_model_checkpoint(tmp_path):
    path = str(tmp_path / ("best%d.keras" % r()))
    model = linear(keras, seed=5)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    x, y = data_of(r())
    checkpoint = hvd.callbacks.BestModelCheckpoint(monitor="loss")
    checkpoint.filepath = path
    model.fit(x, y, epochs=2, verbose=0, callbacks=[checkpoint])
    assert os.path.exists(path)


def test_elastic_keras_state_commit_and_restore():
    model = linear(keras, seed=9)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    x, y = data_of(r())
    # Horovod's order: update the counters, then commit them.
    model.fit(x, y, epochs=1, verbose=0, callbacks=[
        hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.CommitStateCallback(state)])
    assert state.epoch == 1 and state.batch == 0
    # After a reset Horovod's scripts fit the epochs left (Keras counts from 0 again): the state
    # keeps counting from where it was. initial_epoch= counts the same.
    state.epoch = 3
    model.fit(x, y, epochs=1, verbose=0, callbacks=[hvd.elastic.UpdateEpochStateCallback(state)])
    assert state.epoch == 4
    model.fit(x, y, initial_epoch=4, epochs=5, verbose=0,
              callbacks=[hvd.elastic.UpdateEpochStateCallback(state)])
    assert state.epoch == 5
    # The commit count restarts with every fit, so that ranks that joined at a reset commit on
    # the same batches as the others.
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(1).repeat()
    commit = hvd.elastic.CommitStateCallback(state, batches_per_commit=2)
    commit.batches_remaining = 0  # as left by an interrupt inside a commit
    commits, real_commit = [], state.commit
    state.commit = lambda: (commits.append(state.batch), real_commit())
    model.fit(batches, steps_per_epoch=4, epochs=1, verbose=0, callbacks=[
        hvd.elastic.UpdateBatchStateCallback(state), commit])
    assert commits == [2, 4, 0]  # every second batch, and at the epoch's end
    state.commit = real_commit
    state.epoch, state.batch = 1, 0
    state.commit()
    committed = model.get_weights()
    model.set_weights([w + 1 for w in committed])
    state.epoch = 5
    state.restore()
    assert state.epoch == 1
    for got, want in zip(model.get_weights(), committed):
        np.testing.assert_array_equal(got, want)


def test_horovods_callback_and_tape_arguments(tmp_path):
    model = linear(keras, seed=r())  # different on every rank
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    bias = model.layers[0].bias
    x, y = data_of(r())
    checkpoint = hvd.callbacks.BestModelCheckpoint(monitor="loss", save_weights_only=True)
    checkpoint.filepath = str(tmp_path / "best.weights.h5")
    model.fit(x, y, epochs=1, verbose=0, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[bias]), checkpoint])
    assert os.path.exists(checkpoint.filepath)
    kernels = hvd.allgather_object(model.layers[0].kernel.numpy())
    biases = hvd.allgather_object(bias.numpy())
    for k in kernels[1:]:
        np.testing.assert_array_equal(k, kernels[0])  # broadcast from rank 0
    if n() > 1:  # the local variable kept each rank's own value
        assert not np.array_equal(biases[0], biases[1])
    import krug.tensorflow as hvd_tf

    v = tf.Variable([2.0])
    with tf.GradientTape() as tape:
        loss = v * 3.0
    (g,) = hvd_tf.DistributedGradientTape(tape).gradient(loss, [v], use_generic_names=True)
    np.testing.assert_allclose(g.numpy(), [3.0])


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_keras_frontends_export_krug_tensorflows_calls(flavour):
    import krug.tensorflow as hvd_tf

    frontend = FLAVOURS[flavour][1]
    for name in ("init", "rank", "nccl_built", "cuda_built", "mpi_threads_supported",
                 "Compression", "broadcast_variables", "global_process_set"):
        assert getattr(frontend, name) is getattr(hvd_tf, name), name
    assert frontend.BroadcastGlobalVariablesCallback is frontend.callbacks.\
        BroadcastGlobalVariablesCallback
    assert frontend.elastic.KerasState.__module__ == "krug._keras.elastic"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_tensorflow_wraps_keras_optimizers_as_the_keras_frontend(flavour):
    # krug.tensorflow.DistributedOptimizer takes Keras optimizers, as Horovod's does: the
    # result is what krug.keras / krug.tensorflow.keras would make.
    import krug.tensorflow as hvd_tf

    kmod, frontend = FLAVOURS[flavour]
    opt = hvd_tf.DistributedOptimizer(kmod.optimizers.SGD(0.1))
    assert type(opt).__bases__ == type(frontend.DistributedOptimizer(
        kmod.optimizers.SGD(0.1))).__bases__
    assert isinstance(opt, kmod.optimizers.SGD)


def test_keras_collectives_take_horovods_keras_signatures():
    # horovod.keras.allreduce(value, name=None, ...): the second positional argument is the
    # name, not TensorFlow's `average`.
    mine = np.array([float(r() + 1)])
    want = np.mean([k + 1.0 for k in range(n())])
    np.testing.assert_allclose(np.asarray(hvd.allreduce(mine, "keras.metric")), [want])
    np.testing.assert_allclose(np.asarray(hvd.allreduce(mine, "keras.sum", op=hvd.Sum)),
                               [want * n()])
    np.testing.assert_array_equal(np.asarray(hvd.allgather(mine, "keras.gather")),
                                  [k + 1.0 for k in range(n())])
    np.testing.assert_array_equal(np.asarray(hvd.broadcast(mine, 0, "keras.bcast")), [1.0])


# ---- TF1 graphs: Horovod's Keras calls run in Keras' session ----

def test_tf_keras_broadcast_global_variables_runs_in_keras_session():
    root = n() - 1
    with tf.Graph().as_default():
        layer = tf_keras.layers.Dense(2, kernel_initializer=tf_keras.initializers.Constant(r()),
                                      bias_initializer=tf_keras.initializers.Constant(-r()))
        layer.build((None, 3))
        hvd_tfk.broadcast_global_variables(root)
        kernel, bias = tf_keras.backend.batch_get_value([layer.kernel, layer.bias])
        np.testing.assert_array_equal(kernel, np.full((3, 2), root, np.float32))
        np.testing.assert_array_equal(bias, [-root, -root])


def test_tf_keras_collectives_return_values_in_a_graph():
    # Horovod's Keras collectives evaluate in K.get_session(): a ported metric average gets a
    # number, not a symbolic tensor.
    with tf.Graph().as_default():
        got = hvd_tfk.allreduce(np.array([float(r() + 1)]), "graph.metric")
        assert isinstance(got, np.ndarray)
        np.testing.assert_allclose(got, [np.mean([k + 1.0 for k in range(n())])])
        gathered = hvd_tfk.allgather(np.array([r()]), "graph.gather")
        np.testing.assert_array_equal(gathered, list(range(n())))


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_keras_broadcast_global_variables_refuses_eager_mode(flavour):
    with pytest.raises(RuntimeError, match="does not support eager execution"):
        FLAVOURS[flavour][1].broadcast_global_variables(0)


def test_keras3_in_a_graph_names_the_frontend_with_a_session():
    with tf.Graph().as_default():
        with pytest.raises(RuntimeError, match="krug.tensorflow.keras with tf_keras"):
            hvd.allreduce(np.array([1.0]), "graph.keras3")
