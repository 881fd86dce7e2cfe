"""DistributedGradientTape and PartialDistributedGradientTape (Horovod's)."""

import tensorflow as tf

from krug.tensorflow.compression import Compression
from krug.tensorflow.gradients import check_groups, make_allreduce_grads_fn
from krug.tensorflow.local_gradients import LocalSources, local_layer_variables
from krug.tensorflow.mpi_ops import Average, global_process_set


class _DistributedTapeMixin:
    """What a distributed tape adds to the tape class it wraps: gradient() averages the
    gradients of every source not registered as local."""

    def _krug_setup(self, allreduce_grads, process_set, scale_local_gradients):
        self._krug_allreduce_grads = allreduce_grads
        self._krug_local_sources = LocalSources(process_set, scale_local_gradients)

    def register_local_source(self, source):
        """Marks a variable as local to this rank: its gradient is not reduced (only scaled by
        1/size when scale_local_gradients)."""
        self._krug_local_sources.register(source)

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False,
                 **kwargs):
        # use_generic_names: Horovod's choice of allreduce names; krug names them after the
        # gradients either way.
        del use_generic_names
        grads = super().gradient(target, sources, output_gradients, **kwargs)
        out = self._krug_local_sources.reduce(self._krug_allreduce_grads,
                                              tf.nest.flatten(grads, expand_composites=False),
                                              tf.nest.flatten(sources))
        return tf.nest.pack_sequence_as(sources, out)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       use_generic_names=False):
        """gradient(), split for model-parallel code that treats the two kinds apart (a
        gradient norm, say): ``(local, global)``, lists of ``(source, gradient)`` pairs in the
        order of ``sources``: the registered local sources' gradients (this rank's own) and the
        others' (the same on every rank)."""
        grads = self.gradient(target, sources, output_gradients, use_generic_names)
        return self._krug_local_sources.split(tf.nest.flatten(grads, expand_composites=False),
                                              tf.nest.flatten(sources))


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
    for var in local_layer_variables(local_layers):
        tape.register_local_source(var)
    return tape
