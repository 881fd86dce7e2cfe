"""Horovod's Keras callbacks, over a given Keras module (Keras 3 or tf_keras)."""

import numpy as np
import tensorflow as tf

from krug.tensorflow import mpi_ops
from krug.tensorflow.functions import broadcast_variables
from krug.tensorflow.gradients import allreduce


def _variables(optimizer):
    v = getattr(optimizer, "variables", None)
    return list(v() if callable(v) else (v or []))


def _get_lr(optimizer):
    lr = optimizer.learning_rate
    return float(tf.convert_to_tensor(lr.value if hasattr(lr, "value") and not callable(lr.value)
                                      else lr))


def _set_value(variable_or_attr_owner, attr, value):
    current = getattr(variable_or_attr_owner, attr)
    if hasattr(current, "assign"):
        current.assign(value)
    else:
        setattr(variable_or_attr_owner, attr, value)


def make_callbacks(keras):
    """The callback classes, subclasses of `keras`.callbacks.Callback."""

    class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
        """Broadcasts the model's and the optimizer's variables from ``root_rank`` at the end
        of the first batch, so that every rank trains the same model from then on (the
        optimizer's variables exist by then). ``local_variables``: variables each rank keeps
        its own of (Horovod's argument)."""

        def __init__(self, root_rank, device="", local_variables=None,
                     process_set=mpi_ops.global_process_set):
            super().__init__()
            self.root_rank = root_rank
            self.process_set = process_set
            self.local_variables = list(local_variables or [])
            self.broadcast_done = False

        def _broadcast(self):
            variables = list(self.model.variables)
            if self.model.optimizer is not None:
                variables += _variables(self.model.optimizer)
            local = {id(v) for v in self.local_variables}
            variables = [v for v in variables if id(v) not in local]
            broadcast_variables(variables, self.root_rank, process_set=self.process_set)
            self.broadcast_done = True

        def on_batch_end(self, batch, logs=None):
            if not self.broadcast_done:
                self._broadcast()

        def on_train_end(self, logs=None):
            if not self.broadcast_done:  # fit() without a batch still leaves equal models
                self._broadcast()

    class MetricAverageCallback(keras.callbacks.Callback):
        """Replaces each epoch's metrics by their average over the ranks (place it before
        callbacks that read metrics, such as checkpoints and LR schedules)."""

        def __init__(self, device="", process_set=mpi_ops.global_process_set):
            super().__init__()
            self.process_set = process_set

        def on_epoch_end(self, epoch, logs=None):
            if not logs:
                return
            names = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
            values = tf.constant([float(logs[k]) for k in names], dtype=tf.float64)
            averaged = allreduce(values, op=mpi_ops.Average, name="krug.metric_average",
                                 process_set=self.process_set).numpy()
            for k, v in zip(names, averaged):
                logs[k] = float(v)

    class LearningRateScheduleCallback(keras.callbacks.Callback):
        """Sets the learning rate to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` to
        ``end_epoch`` (exclusive); a constant ``multiplier`` means ``multiplier ** (epoch -
        start_epoch)``, an exponential decay, as in Horovod. ``staircase=False``
        adjusts it every batch with a fractional epoch (needs ``steps_per_epoch`` or the
        ``steps`` of fit). ``momentum_correction`` scales the momentum by new/old learning rate
        for the batch where it changes (Goyal et al.)."""

        def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None,
                     staircase=True, momentum_correction=True, steps_per_epoch=None,
                     verbose=0):
            super().__init__()
            self.initial_lr = initial_lr
            self.start_epoch = start_epoch
            self.end_epoch = end_epoch
            self.staircase = staircase
            self.momentum_correction = momentum_correction
            self.steps_per_epoch = steps_per_epoch
            self.verbose = verbose
            self.current_epoch = None
            self.restore_momentum = None
            # A constant multiplier decays the rate exponentially from start_epoch (Horovod's
            # rule); a function of the epoch gives the factor itself.
            self.multiplier = multiplier if callable(multiplier) else (
                lambda epoch: multiplier ** (epoch - start_epoch))

        def _in_range(self, epoch):
            return epoch >= self.start_epoch and (self.end_epoch is None
                                                  or epoch < self.end_epoch)

        def _adjust(self, epoch):
            optimizer = self.model.optimizer
            old = _get_lr(optimizer)
            new = self.initial_lr * self.multiplier(epoch)
            _set_value(optimizer, "learning_rate", new)
            if (self.momentum_correction and old > 0 and hasattr(optimizer, "momentum")
                    and not isinstance(getattr(optimizer, "momentum"), bool)):
                momentum = optimizer.momentum
                value = float(tf.convert_to_tensor(momentum))
                self.restore_momentum = value
                _set_value(optimizer, "momentum", value * new / old)

        def _restore_momentum(self):
            if self.restore_momentum is not None:
                _set_value(self.model.optimizer, "momentum", self.restore_momentum)
                self.restore_momentum = None

        def on_train_begin(self, logs=None):
            if self.steps_per_epoch is None and not self.staircase:
                self.steps_per_epoch = self.params.get("steps")
                if self.steps_per_epoch is None:
                    raise ValueError("LearningRateScheduleCallback with staircase=False needs "
                                     "steps_per_epoch")

        def on_epoch_begin(self, epoch, logs=None):
            self.current_epoch = epoch

        def on_batch_begin(self, batch, logs=None):
            if not self._in_range(self.current_epoch):
                return
            if self.staircase and batch == 0:
                self._adjust(self.current_epoch)
            elif not self.staircase:
                self._adjust(self.current_epoch + float(batch) / self.steps_per_epoch)

        def on_batch_end(self, batch, logs=None):
            self._restore_momentum()

        def on_epoch_end(self, epoch, logs=None):
            if logs is not None:
                logs["lr"] = _get_lr(self.model.optimizer)

    class LearningRateWarmupCallback(LearningRateScheduleCallback):
        """Ramps the learning rate from ``initial_lr / size`` to ``initial_lr`` over
        ``warmup_epochs`` (Goyal et al.); ``initial_lr`` is the already-scaled rate."""

        def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                     steps_per_epoch=None, verbose=0):
            def multiplier(epoch):
                size = mpi_ops.size()
                return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)
            super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                             staircase=False, momentum_correction=momentum_correction,
                             steps_per_epoch=steps_per_epoch, verbose=verbose)

        def on_epoch_begin(self, epoch, logs=None):
            super().on_epoch_begin(epoch, logs)
            if epoch == self.end_epoch:
                # The ramp ends at the full rate (its last batch was a fraction below it).
                _set_value(self.model.optimizer, "learning_rate", self.initial_lr)

        def on_epoch_end(self, epoch, logs=None):
            super().on_epoch_end(epoch, logs)
            if epoch == self.end_epoch - 1 and self.verbose > 0:
                print("\nEpoch %d: finished gradual learning rate warmup to %g."
                      % (epoch + 1, _get_lr(self.model.optimizer)))

    class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
        """Keeps the best model by ``monitor`` (save_best_only). ``filepath`` may be given
        later (callback.filepath = ...), before training starts."""

        def __init__(self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto",
                     save_freq="epoch", filepath=None):
            # Keras checks the path's form at construction; the real one is checked below.
            placeholder = "model.weights.h5" if save_weights_only else "model.keras"
            super().__init__(filepath=filepath or placeholder, monitor=monitor,
                             verbose=verbose, save_best_only=True,
                             save_weights_only=save_weights_only, mode=mode,
                             save_freq=save_freq)
            self.filepath = filepath

        def on_train_begin(self, logs=None):
            if self.filepath is None:
                raise ValueError("BestModelCheckpoint: set callback.filepath before training")
            super().on_train_begin(logs)

    return dict(BroadcastGlobalVariablesCallback=BroadcastGlobalVariablesCallback,
                MetricAverageCallback=MetricAverageCallback,
                LearningRateScheduleCallback=LearningRateScheduleCallback,
                LearningRateWarmupCallback=LearningRateWarmupCallback,
                BestModelCheckpoint=BestModelCheckpoint)
