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
        """Commits the state every ``batches_per_commit`` batches and at each epoch's end."""

        def __init__(self, state, batches_per_commit=1):
            super().__init__()
            self.state = state
            self.batches_per_commit = batches_per_commit
            self.batches_remaining = batches_per_commit

        def on_batch_end(self, batch, logs=None):
            self.batches_remaining -= 1
            if self.batches_remaining == 0:
                self.state.commit()
                self.batches_remaining = self.batches_per_commit

        def on_epoch_end(self, epoch, logs=None):
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    class UpdateBatchStateCallback(keras.callbacks.Callback):
        """Keeps ``state.batch`` at the next batch to train (0 at each epoch's start)."""

        def __init__(self, state):
            super().__init__()
            self.state = state

        def on_batch_end(self, batch, logs=None):
            self.state.batch = batch + 1

        def on_epoch_end(self, epoch, logs=None):
            self.state.batch = 0

    class UpdateEpochStateCallback(keras.callbacks.Callback):
        """Keeps ``state.epoch`` at the next epoch to train."""

        def __init__(self, state):
            super().__init__()
            self.state = state

        def on_epoch_end(self, epoch, logs=None):
            self.state.epoch = epoch + 1

    return types.SimpleNamespace(
        run=tf_elastic.run, ObjectState=tf_elastic.ObjectState, KerasState=KerasState,
        CommitStateCallback=CommitStateCallback,
        UpdateBatchStateCallback=UpdateBatchStateCallback,
        UpdateEpochStateCallback=UpdateEpochStateCallback)
