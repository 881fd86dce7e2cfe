"""DistributedOptimizer for TensorFlow's own (v1) optimizers, and the dispatch of Keras
optimizers to krug._keras (Horovod's ``hvd.DistributedOptimizer``)."""

import importlib

import tensorflow as tf

from krug.tensorflow.compression import Compression
from krug.tensorflow.gradients import check_groups, make_allreduce_grads_fn
from krug.tensorflow.mpi_ops import Adasum, Average, global_process_set

_LegacyOptimizer = tf.compat.v1.train.Optimizer


class _DistributedOptimizer(_LegacyOptimizer):
    """Wraps a tf.compat.v1.train.Optimizer: compute_gradients() returns gradients averaged
    over the ranks; everything else is the wrapped optimizer's."""

    def __init__(self, optimizer, name, use_locking, allreduce_grads):
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._allreduce_grads = allreduce_grads

    def compute_gradients(self, *args, **kwargs):
        grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = zip(*grads_and_vars) if grads_and_vars else ((), ())
        reduced = self._allreduce_grads(list(grads), list(variables))
        return list(zip(reduced, variables))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="",
                         device_sparse="", compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Wraps an optimizer so that gradients are averaged (``op``) over the ranks of
    ``process_set`` before they are applied. A tf.compat.v1.train.Optimizer is wrapped here; a
    Keras 3 or tf_keras optimizer is wrapped as krug.keras.DistributedOptimizer or
    krug.tensorflow.keras.DistributedOptimizer would (with every argument)."""
    groups = check_groups(groups, num_groups)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Adasum and average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients == True")
    if isinstance(optimizer, _LegacyOptimizer):
        if backward_passes_per_step != 1:
            raise ValueError("backward_passes_per_step > 1 needs a Keras optimizer (krug.keras "
                             "or krug.tensorflow.keras); tf.compat.v1 optimizers reduce every "
                             "step")
        name = name or "Distributed{}".format(type(optimizer).__name__)
        return _DistributedOptimizer(optimizer, name, use_locking, make_allreduce_grads_fn(
            name, compression, sparse_as_dense, op, gradient_predivide_factor, groups,
            process_set))
    kwargs = dict(name=name, compression=compression, sparse_as_dense=sparse_as_dense,
                  backward_passes_per_step=backward_passes_per_step, op=op,
                  gradient_predivide_factor=gradient_predivide_factor,
                  average_aggregated_gradients=average_aggregated_gradients, groups=groups,
                  process_set=process_set, scale_local_gradients=scale_local_gradients)
    keras = _keras_of(optimizer)
    if keras is None:
        raise ValueError("Provided optimizer doesn't inherit from either legacy TensorFlow or "
                         "Keras optimizer: %s" % optimizer)
    # krug._keras, which krug.keras and krug.tensorflow.keras are made of: krug.tensorflow
    # never imports those frontends (they import krug.tensorflow).
    from krug._keras.optimizer import create_distributed_optimizer
    return create_distributed_optimizer(keras, optimizer, **kwargs)


def _keras_of(optimizer):
    """The Keras package (Keras 3's ``keras`` or ``tf_keras``) whose optimizer class
    ``optimizer``'s class is or derives from, or None. The package is imported already: it
    made the object."""
    for cls in type(optimizer).__mro__:
        package = cls.__module__.split(".")[0]
        if package in ("keras", "tf_keras"):
            return importlib.import_module(package)
    return None
