"""The training function every rank of a KerasEstimator.fit runs (inside krug.spark.run)."""

import io
import json
import posixpath


def make_trainer(spec):
    def train():
        import krug.keras as hvd

        hvd.init()
        try:
            return _train(hvd, spec)
        finally:
            hvd.shutdown()

    return train


def _rebuild(keras, spec):
    model = keras.models.model_from_json(spec["model_json"],
                                         custom_objects=spec["custom_objects"])
    model.set_weights(spec["weights"])
    optimizer = keras.optimizers.deserialize(spec["optimizer"],
                                             custom_objects=spec["custom_objects"])
    return model, optimizer


def _inputs(columns, names, shapes):
    import numpy as np

    out = []
    for i, name in enumerate(names):
        x = np.asarray(columns[name], dtype=np.float32)
        if shapes and i < len(shapes) and shapes[i] is not None:
            x = x.reshape([-1] + list(shapes[i]))
        out.append(x)
    return out[0] if len(out) == 1 else out


def _pin_gpu(hvd):
    """One GPU per rank, as Horovod's estimator pins it: the one Spark assigned to the task,
    else the local rank's; without this every rank of a node would take them all."""
    import tensorflow as tf

    from krug.spark.task import device_index

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        gpu = gpus[device_index(hvd.local_rank()) % len(gpus)]
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices([gpu], "GPU")


def _train(hvd, spec):
    import keras
    import numpy as np

    from krug.spark.common.data import read_columns, shard_indices

    if spec.get("use_gpu", True):
        _pin_gpu(hvd)
    store, run_id = spec["store"], spec["run_id"]
    if spec["random_seed"] is not None:
        keras.utils.set_random_seed(spec["random_seed"])
    model, optimizer = _rebuild(keras, spec)
    # Horovod's estimators scale the learning rate with the number of ranks (the batch is that
    # many times larger). A schedule is used as given (Keras keeps it in _learning_rate; the
    # learning_rate property evaluates it).
    schedule = keras.optimizers.schedules.LearningRateSchedule
    if not isinstance(getattr(optimizer, "_learning_rate", None), schedule):
        optimizer.learning_rate = float(optimizer.learning_rate) * hvd.size()
    optimizer = hvd.DistributedOptimizer(
        optimizer, **({"compression": spec["gradient_compression"]}
                      if spec["gradient_compression"] is not None else {}))
    model.compile(optimizer=optimizer, loss=spec["loss"], metrics=spec["metrics"],
                  loss_weights=spec["loss_weights"])

    features, labels = spec["feature_cols"], spec["label_cols"]
    idx = spec["dataset_idx"]

    def rank_rows(path):
        columns = read_columns(store, path, features + labels)
        take = shard_indices(len(columns[features[0]]), hvd.rank(), hvd.size(), None)
        part = {c: v[take] for c, v in columns.items()}
        ys = [np.asarray(part[c]) for c in labels]
        return _inputs(part, features, spec["input_shapes"]), ys[0] if len(ys) == 1 else ys

    x, y = rank_rows(store.get_train_data_path(idx))
    validation = rank_rows(store.get_val_data_path(idx)) if spec["has_val"] else None
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback()] + list(spec["callbacks"] or [])
    history = model.fit(x, y, batch_size=spec["batch_size"], epochs=spec["epochs"],
                        validation_data=validation,
                        validation_batch_size=spec["val_batch_size"] or spec["batch_size"],
                        steps_per_epoch=spec["train_steps_per_epoch"],
                        validation_steps=spec["validation_steps_per_epoch"],
                        shuffle=spec["shuffle"], callbacks=callbacks,
                        verbose=spec["verbose"] if hvd.rank() == 0 else 0)
    if hvd.rank() != 0:
        return None
    logs = {k: [float(v) for v in vs] for k, vs in history.history.items()}
    checkpoint = store.get_checkpoint_path(run_id)
    if checkpoint:
        buf = io.BytesIO()
        np.savez(buf, *model.get_weights())
        store.write(checkpoint, buf.getvalue())
        store.write(posixpath.join(store.get_logs_path(run_id), "history.json"),
                    json.dumps(logs).encode())
    return logs, model.get_weights()
