"""Elastic training with Keras' fit (Horovod's ``horovod.keras.elastic``)."""

import types

from krug.tensorflow import elastic as tf_elastic


def make_elastic(keras):
    """A module-like namespace: run, KerasState, ObjectState and the state callbacks."""

    class KerasState(tf_elastic.TensorFlowKerasState):
        """A Keras model and its optimizer, plus plain values (epoch, batch, ...)."""

        def __init__(self, model, optimizer=None, backend=None, **kwargs):
            super().__init__(model, optimizer, backend, **kwargs)

    class CommitStateCallback(keras.callbacks.Callback):
        """Commits the state every ``batches_per_commit`` batches and at each epoch's end. The
        count starts again with every fit, so ranks that joined at a reset commit in step with
        the others."""

        def __init__(self, state, batches_per_commit=1):
            super().__init__()
            self.state = state
            self.batches_per_commit = batches_per_commit
            self.batches_remaining = batches_per_commit

        def on_train_begin(self, logs=None):
            self.batches_remaining = self.batches_per_commit

        def on_batch_end(self, batch, logs=None):
            self.batches_remaining -= 1
            if self.batches_remaining <= 0:
                self.state.commit()
                self.batches_remaining = self.batches_per_commit

        def on_epoch_end(self, epoch, logs=None):
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    class UpdateBatchStateCallback(keras.callbacks.Callback):
        """Keeps ``state.batch`` at the next batch of this epoch to train (0 at each epoch's
        start). Keras 3 runs an epoch's steps whatever a callback says, so a fit after a reset
        trains the interrupted epoch from its first batch."""

        def __init__(self, state):
            super().__init__()
            self.state = state

        def on_batch_end(self, batch, logs=None):
            self.state.batch = batch + 1

        def on_epoch_end(self, epoch, logs=None):
            self.state.batch = 0

    class UpdateEpochStateCallback(keras.callbacks.Callback):
        """Keeps ``state.epoch`` at the next epoch to train, across resets: with Horovod's
        ``fit(epochs=total - state.epoch)`` (Keras counts from 0 again) as with
        ``fit(initial_epoch=state.epoch, epochs=total)``."""

        def __init__(self, state):
            super().__init__()
            self.state = state
            self.offset = None

        def on_train_begin(self, logs=None):
            self.offset = None

        def on_epoch_begin(self, epoch, logs=None):
            if self.offset is None:  # the first epoch of this fit is the state's epoch
                self.offset = self.state.epoch - epoch

        def on_epoch_end(self, epoch, logs=None):
            self.state.epoch = epoch + (self.offset or 0) + 1

    return types.SimpleNamespace(
        run=tf_elastic.run, ObjectState=tf_elastic.ObjectState, KerasState=KerasState,
        CommitStateCallback=CommitStateCallback,
        UpdateBatchStateCallback=UpdateBatchStateCallback,
        UpdateEpochStateCallback=UpdateEpochStateCallback)
