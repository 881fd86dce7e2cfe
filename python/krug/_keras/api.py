"""The public API of krug.keras and krug.tensorflow.keras, built for one Keras module."""

from krug.tensorflow.compression import Compression
from krug.tensorflow.mpi_ops import Average, global_process_set
from krug._keras import optimizer as _optimizer
from krug.tensorflow.local_gradients import local_layer_variables


def make_api(keras):
    """DistributedOptimizer, PartialDistributedOptimizer and load_model for `keras`."""

    def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                             compression=Compression.none, sparse_as_dense=False,
                             gradient_predivide_factor=1.0, op=Average,
                             backward_passes_per_step=1, average_aggregated_gradients=False,
                             num_groups=0, groups=None, process_set=global_process_set,
                             scale_local_gradients=True):
        """An optimizer of `optimizer`'s class and configuration whose gradients are averaged
        (``op``) over the ranks of ``process_set`` before they are applied. Arguments as
        Horovod's."""
        return _optimizer.create_distributed_optimizer(
            keras, optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
            gradient_predivide_factor, op, backward_passes_per_step,
            average_aggregated_gradients, num_groups, groups, process_set,
            scale_local_gradients)

    def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                    compression=Compression.none, sparse_as_dense=False,
                                    gradient_predivide_factor=1.0, op=Average,
                                    backward_passes_per_step=1,
                                    average_aggregated_gradients=False, num_groups=0,
                                    groups=None, process_set=global_process_set,
                                    local_layers=None, scale_local_gradients=True):
        """DistributedOptimizer for model-parallel training: the trainable weights of
        ``local_layers`` (a layer or a list of layers) keep their gradients on this rank
        (divided by the size with ``scale_local_gradients``); the others are reduced. Horovod's
        API; the arguments are DistributedOptimizer's."""
        local_vars = local_layer_variables(local_layers)
        opt = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression,
                                   sparse_as_dense, gradient_predivide_factor, op,
                                   backward_passes_per_step, average_aggregated_gradients,
                                   num_groups, groups, process_set, scale_local_gradients)
        for var in local_vars:
            opt.register_local_var(var)
        return opt

    def load_model(filepath, custom_optimizers=None, custom_objects=None,
                   compression=Compression.none):
        """keras.models.load_model, with the saved optimizer (any of Keras' own, or of
        ``custom_optimizers``) restored, state included, as a DistributedOptimizer."""
        objects = {c.__name__: c for c in custom_optimizers or []}
        objects.update(custom_objects or {})
        model = keras.models.load_model(filepath, custom_objects=objects)
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and not isinstance(optimizer, _optimizer._DistributedMixin):
            # The restored optimizer becomes distributed in place: its variables (the state
            # just loaded) stay as they are.
            params = _optimizer._Params(None, compression, False, 1.0, Average, 1, False, None,
                                        global_process_set, True)
            optimizer.__class__ = _optimizer.distributed_class(keras, optimizer.__class__,
                                                               params)
        return model

    return DistributedOptimizer, PartialDistributedOptimizer, load_model
