"""The names of krug.keras (Keras 3) and krug.tensorflow.keras (tf_keras), made once for the
Keras module each is for (Horovod's ``horovod.keras`` and ``horovod.tensorflow.keras`` list
them twice)."""

import functools

import krug.tensorflow as _tensorflow
from krug._keras import collectives as _collectives
from krug._keras.api import make_api
from krug._keras.session import evaluate, keras_session
from krug.tensorflow.sync_batch_norm import make_sync_batch_norm

# krug.tensorflow's calls that the Keras frontends export as they are (Horovod's hvd.* names).
_FROM_TENSORFLOW = (
    "init", "shutdown", "is_initialized", "start_timeline", "stop_timeline",
    "size", "rank", "local_size", "local_rank", "cross_size", "cross_rank",
    "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled",
    "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "grouped_allreduce", "grouped_allgather", "alltoall", "grouped_reducescatter", "join",
    "barrier", "allgather_object", "broadcast_object", "broadcast_variables",
    "ProcessSet", "add_process_set", "remove_process_set", "global_process_set",
    "Compression", "HorovodInternalError", "HostsUpdatedInterrupt", "WorkerRemoved",
)
# The collectives with Horovod's Keras signatures (values in, values out).
_KERAS_COLLECTIVES = ("allreduce", "allgather", "broadcast", "reducescatter")


def frontend_names(keras):
    """{name: object} of the Keras frontend for ``keras`` (its callbacks and elastic
    submodules aside)."""
    names = {name: getattr(_tensorflow, name) for name in _FROM_TENSORFLOW}
    names.update((name, _evaluated(keras, getattr(_collectives, name)))
                 for name in _KERAS_COLLECTIVES)
    names["broadcast_global_variables"] = _broadcast_global_variables(keras)
    (names["DistributedOptimizer"], names["PartialDistributedOptimizer"],
     names["load_model"]) = make_api(keras)
    names["SyncBatchNormalization"] = make_sync_batch_norm(keras.layers.BatchNormalization)
    return names


def _evaluated(keras, collective):
    """``collective`` returning its result as Horovod's Keras one does (a value in a graph)."""
    @functools.wraps(collective)
    def call(*args, **kwargs):
        return evaluate(keras, collective(*args, **kwargs))
    return call


def _broadcast_global_variables(keras):
    def broadcast_global_variables(root_rank):
        """Assigns ``root_rank``'s value to every global variable of Keras' TF1 graph on every
        rank, in Keras' session (Horovod's ``hvd.broadcast_global_variables`` of the Keras
        modules). Eagerly it raises RuntimeError, as Horovod's: use
        BroadcastGlobalVariablesCallback or broadcast_variables."""
        op = _tensorflow.broadcast_global_variables(root_rank)
        return keras_session(keras).run(op)
    return broadcast_global_variables
