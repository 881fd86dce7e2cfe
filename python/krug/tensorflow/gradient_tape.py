"""DistributedGradientTape and PartialDistributedGradientTape (Horovod's)."""

import tensorflow as tf

from krug.tensorflow.compression import Compression
from krug.tensorflow.gradients import check_groups, make_allreduce_grads_fn, var_key
from krug.tensorflow.mpi_ops import Average, global_process_set, size_op


class _DistributedTapeMixin:
    """What a distributed tape adds to the tape class it wraps: gradient() averages the
    gradients of every source not registered as local."""

    def _krug_setup(self, allreduce_grads, process_set, scale_local_gradients):
        self._krug_allreduce_grads = allreduce_grads
        self._krug_process_set = process_set
        self._krug_scale_local = scale_local_gradients
        self._krug_local_sources = set()

    def register_local_source(self, source):
        """Marks a variable as local to this rank: its gradient is not reduced (only scaled by
        1/size when scale_local_gradients)."""
        self._krug_local_sources.add(var_key(source))

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False,
                 **kwargs):
        # use_generic_names: Horovod's choice of allreduce names; krug names them after the
        # gradients either way.
        del use_generic_names
        grads = super().gradient(target, sources, output_gradients, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        local = [var_key(s) in self._krug_local_sources for s in flat_sources]
        shared = [i for i, is_local in enumerate(local) if not is_local]
        reduced = self._krug_allreduce_grads([flat_grads[i] for i in shared],
                                             [flat_sources[i] for i in shared])
        out = list(flat_grads)
        for i, g in zip(shared, reduced):
            out[i] = g
        if self._krug_scale_local and any(local):
            n = tf.cast(size_op(self._krug_process_set.process_set_id), tf.float32)
            for i, is_local in enumerate(local):
                g = out[i]
                if not is_local or g is None:
                    continue
                if isinstance(g, tf.IndexedSlices):
                    out[i] = tf.IndexedSlices(g.values / tf.cast(n, g.dtype), g.indices,
                                              g.dense_shape)
                else:
                    out[i] = g / tf.cast(n, g.dtype)
        return tf.nest.pack_sequence_as(sources, out)


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=global_process_set, scale_local_gradients=True):
    """Wraps a recorded tf.GradientTape: its gradient() returns gradients averaged (``op``)
    over the ranks of ``process_set``. Arguments as Horovod's."""
    groups = check_groups(groups, num_groups)
    cls = type(gradtape.__class__.__name__, (_DistributedTapeMixin, gradtape.__class__), {})
    tape = cls.__new__(cls)
    # The recorded tape stays the same object: the wrapper shares its state.
    tape.__dict__.update(gradtape.__dict__)
    tape._krug_setup(make_allreduce_grads_fn("DistributedGradientTape", compression,
                                             sparse_as_dense, op, gradient_predivide_factor,
                                             groups, process_set),
                     process_set, scale_local_gradients)
    return tape


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="",
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set,
                                   local_layers=None, scale_local_gradients=True):
    """DistributedGradientTape whose ``local_layers`` (a Keras layer or a list of them) keep
    their gradients local to each rank."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
