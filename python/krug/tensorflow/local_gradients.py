"""Gradients of rank-local variables (Horovod's model-parallel API): DistributedGradientTape's
register_local_source and the Keras DistributedOptimizers' register_local_var share this."""

import tensorflow as tf

from krug.tensorflow.gradients import var_key
from krug.tensorflow.mpi_ops import size_op


class LocalSources:
    """The variables registered as local to this rank: their gradients are not reduced across
    the ranks, only divided by the set's size with ``scale_local_gradients`` (Horovod's rule, so
    that a rank's update of its own layer has the scale of an averaged one)."""

    def __init__(self, process_set, scale_local_gradients):
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._keys = set()

    def register(self, variable):
        self._keys.add(var_key(variable))

    def is_local(self, variable):
        return var_key(variable) in self._keys

    def reduce(self, reduce_fn, grads, variables):
        """`grads` with those of shared variables replaced by reduce_fn(grads, variables) and
        those of local ones kept on this rank (scaled)."""
        grads = list(grads)
        variables = list(variables)
        if not self._keys:
            return list(reduce_fn(grads, variables))
        shared = [i for i, v in enumerate(variables) if not self.is_local(v)]
        reduced = reduce_fn([grads[i] for i in shared], [variables[i] for i in shared])
        out = list(grads)
        for i, g in zip(shared, reduced):
            out[i] = g
        if self.scale_local_gradients:
            n = size_op(self.process_set.process_set_id)
            for i, v in enumerate(variables):
                if out[i] is not None and self.is_local(v):
                    out[i] = _divide(out[i], n)
        return out

    def split(self, grads, variables):
        """(local, global): lists of (variable, gradient) pairs, in the order given."""
        local, shared = [], []
        for v, g in zip(variables, grads):
            (local if self.is_local(v) else shared).append((v, g))
        return local, shared


def _divide(grad, n):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / tf.cast(n, grad.values.dtype), grad.indices,
                                grad.dense_shape)
    return grad / tf.cast(n, grad.dtype)


def local_layer_variables(local_layers):
    """The trainable weights of ``local_layers`` (None, a Keras layer, or a list of layers, of
    Keras 3 or tf_keras), for the Partial* APIs."""
    if local_layers is None:
        return []
    layers = list(local_layers) if isinstance(local_layers, (list, tuple)) else [local_layers]
    for layer in layers:
        if not hasattr(layer, "trainable_weights"):
            raise ValueError("All local layers must be Keras layers (keras.layers.Layer or "
                             "tf_keras.layers.Layer); got %r" % (layer,))
    return [v for layer in layers for v in layer.trainable_weights]
