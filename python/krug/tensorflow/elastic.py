"""Elastic training with TensorFlow and Keras (Horovod's ``horovod.tensorflow.elastic``).

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...                 # train, state.commit() at consistent points

A failed collective raises a TensorFlow error inside the training function; ``run`` turns
the errors of krug's ops into HorovodInternalError, which the recovery loop of
krug.common.elastic handles (roll back to the last commit, re-form, sync from rank 0).
"""

import tensorflow as tf

from krug.common import elastic as common
from krug.common import lifecycle
from krug.common.exceptions import HorovodInternalError, WorkerRemoved
from krug.tensorflow.functions import broadcast_object, broadcast_variables


def _bindings():
    return lifecycle.elastic_state_bindings(broadcast_object)


def run(func):
    """Decorator: runs ``func(state, ...)`` in the elastic recovery loop (see
    krug.common.elastic.run_fn). A failed krug op (a lost peer, a stopped engine) surfaces as
    a TensorFlow error."""
    return lifecycle.elastic_run_fn(func, (tf.errors.UnknownError, tf.errors.AbortedError),
                                    convert=lambda e: HorovodInternalError(e.message))


class ObjectState(common.ObjectState):
    """Plain Python values as attributes, committed, restored and synced from rank 0."""

    def __init__(self, **kwargs):
        super().__init__(**_bindings(), **kwargs)


class TensorFlowKerasState(common.ObjectState):
    """A Keras model's (and optimizer's) variables plus plain values: commit() copies them,
    restore() puts the copy back, sync() broadcasts rank 0's."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer",
                                                                         None)
        self._saved_variables = None
        super().__init__(**_bindings(), **kwargs)

    def _variables(self):
        variables = list(self.model.variables)
        if self.optimizer is not None:
            self._build_optimizer()
            slots = self.optimizer.variables
            variables += list(slots() if callable(slots) else slots)  # a legacy optimizer's
        return variables

    def _build_optimizer(self):
        # Keras makes an optimizer's slots (momentum, ...) at its first step. A worker that joins
        # a running job has taken none: without its slots it would sync fewer variables than
        # rank 0 sends (and wait for the rest forever), and a restore before the first commit
        # would miss the slots made since. So they are made before anything is saved or synced.
        opt = self.optimizer
        # Keras 3 says `built`, tf_keras `_built`; a legacy optimizer has no build().
        if not hasattr(opt, "build") or getattr(opt, "built", False) or getattr(opt, "_built",
                                                                                 False):
            return
        opt.build(self.model.trainable_variables)

    def _snapshot(self):
        self._saved_variables = [tf.identity(tf.convert_to_tensor(v)) for v in self._variables()]

    def save(self):
        self._snapshot()
        super().save()

    def restore(self):
        if self._saved_variables is not None:
            for v, saved in zip(self._variables(), self._saved_variables):
                v.assign(saved)
        super().restore()

    def sync(self):
        broadcast_variables(self._variables(), root_rank=0)
        super().sync()
        self._snapshot()  # a failure before the next commit rolls back to the synced state


__all__ = ["run", "ObjectState", "TensorFlowKerasState", "WorkerRemoved"]
