"""DistributedOptimizer for Keras optimizers: a subclass of the wrapped optimizer's class whose
gradient application first averages the gradients over the ranks (Horovod's).

Keras 3 optimizers apply gradients in ``apply(grads, variables)`` (``apply_gradients`` and
``model.fit`` call it); tf_keras optimizers, new and legacy, in ``apply_gradients``. With
``backward_passes_per_step`` = n > 1, gradients are summed locally in accumulator variables and
reduced and applied on every n-th call only (divided by n with
``average_aggregated_gradients``).
"""

import tensorflow as tf

from krug.tensorflow.compression import Compression
from krug.tensorflow.gradients import check_groups, make_allreduce_grads_fn
from krug.tensorflow.local_gradients import LocalSources
from krug.tensorflow.mpi_ops import Adasum, Average, global_process_set


class _Params:
    def __init__(self, name, compression, sparse_as_dense, gradient_predivide_factor, op,
                 backward_passes_per_step, average_aggregated_gradients, groups, process_set,
                 scale_local_gradients):
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        if op == Adasum:
            raise ValueError("op == Adasum is not supported yet with Keras")
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be > 0")
        self.name = name
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.average_aggregated_gradients = average_aggregated_gradients
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self.reduce = make_allreduce_grads_fn(name or "DistributedOptimizer", compression,
                                              sparse_as_dense, op, gradient_predivide_factor,
                                              groups, process_set)


def _dense(g):
    return tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g


class _DistributedMixin:
    """Reduces gradients before the wrapped class applies them. `_krug` is set per class."""

    _krug = None

    def _krug_local_sources(self):
        if "_krug_local" not in self.__dict__:
            self.__dict__["_krug_local"] = LocalSources(self._krug.process_set,
                                                        self._krug.scale_local_gradients)
        return self.__dict__["_krug_local"]

    def register_local_var(self, var):
        """Keeps `var`'s gradient local to this rank (scaled by 1/size when
        scale_local_gradients), as Horovod's."""
        self._krug_local_sources().register(var)

    def _krug_reduce(self, grads, variables):
        return self._krug_local_sources().reduce(self._krug.reduce, grads, variables)

    def _krug_accumulators(self, variables):
        accumulators = getattr(self, "_krug_acc", None)
        if accumulators is None:
            # Created once, at the first step (Keras traces its train step once, where
            # creating variables is allowed).
            with tf.init_scope():
                accumulators = [tf.Variable(tf.zeros_like(tf.convert_to_tensor(v)),
                                            trainable=False) for v in variables]
                self._krug_counter = tf.Variable(0, dtype=tf.int64, trainable=False)
            self._krug_acc = accumulators
        return accumulators

    def _krug_apply(self, grads, variables, apply_fn):
        grads = list(grads)
        variables = list(variables)
        n = self._krug.backward_passes_per_step
        if n == 1:
            return apply_fn(self._krug_reduce(grads, variables), variables)
        accumulators = self._krug_accumulators(variables)
        for acc, g in zip(accumulators, grads):
            if g is not None:
                acc.assign_add(_dense(g))
        count = self._krug_counter.assign_add(1)

        def reduce_and_apply():
            aggregated = [tf.convert_to_tensor(a) for a in accumulators]
            if self._krug.average_aggregated_gradients:
                aggregated = [a / n for a in aggregated]
            aggregated = [a if g is not None else None for a, g in zip(aggregated, grads)]
            apply_fn(self._krug_reduce(aggregated, variables), variables)
            for acc in accumulators:
                acc.assign(tf.zeros_like(acc))
            return tf.constant(True)

        if tf.executing_eagerly():
            if int(count) % n == 0:
                reduce_and_apply()
            return None
        return tf.cond(tf.equal(count % n, 0), reduce_and_apply, lambda: tf.constant(False))


class _Keras3Mixin(_DistributedMixin):
    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:
            trainable_variables = self._trainable_variables
        if not self.built:
            with tf.init_scope():
                self.build(list(trainable_variables))
        base = super(_Keras3Mixin, self)
        return self._krug_apply(grads, trainable_variables,
                                lambda g, v: base.apply(g, v))


class _TfKerasMixin(_DistributedMixin):
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        base = super(_TfKerasMixin, self)
        return self._krug_apply(grads, variables, lambda g, v: base.apply_gradients(
            [(a, b) for a, b in zip(g, v) if a is not None], *args, **kwargs))


def _is_keras3(keras):
    return int(keras.__version__.split(".")[0]) >= 3


def distributed_class(keras, cls, params):
    """The subclass of optimizer class `cls` that reduces gradients with `params`."""
    mixin = _Keras3Mixin if _is_keras3(keras) else _TfKerasMixin
    return type(cls.__name__, (mixin, cls), {"_krug": params})


def create_distributed_optimizer(keras, optimizer, name=None, device_dense="", device_sparse="",
                                 compression=Compression.none, sparse_as_dense=False,
                                 gradient_predivide_factor=1.0, op=Average,
                                 backward_passes_per_step=1, average_aggregated_gradients=False,
                                 num_groups=0, groups=None, process_set=global_process_set,
                                 scale_local_gradients=True):
    """A new optimizer of `optimizer`'s class and configuration that averages gradients over
    the ranks of `process_set` before applying them."""
    groups = check_groups(groups, num_groups)
    params = _Params(name, compression, sparse_as_dense, gradient_predivide_factor, op,
                     backward_passes_per_step, average_aggregated_gradients, groups, process_set,
                     scale_local_gradients)
    cls = distributed_class(keras, optimizer.__class__, params)
    return cls.from_config(optimizer.get_config())
