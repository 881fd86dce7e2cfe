"""krug.keras: Horovod's ``horovod.keras`` API for Keras 3 (the ``keras`` package, TensorFlow
backend).

    import keras
    import krug.keras as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
"""

import keras as _keras

from krug.tensorflow import (  # noqa: F401 (Horovod's hvd.* names, re-exported)
    init, shutdown, is_initialized, start_timeline, stop_timeline,
    size, rank, local_size, local_rank, cross_size, cross_rank,
    is_homogeneous, mpi_threads_supported, mpi_enabled, mpi_built, gloo_enabled, gloo_built,
    nccl_built, ddl_built, ccl_built, cuda_built, rocm_built,
    Average, Sum, Adasum, Min, Max, Product,
    grouped_allreduce, grouped_allgather, alltoall, grouped_reducescatter, join, barrier,
    allgather_object, broadcast_object, broadcast_variables,
    ProcessSet, add_process_set, remove_process_set, global_process_set,
    Compression, HorovodInternalError, HostsUpdatedInterrupt, WorkerRemoved,
)
from krug._keras.collectives import (  # noqa: F401 (Horovod's Keras signatures)
    allreduce, allgather, broadcast, reducescatter,
)
from krug.tensorflow.sync_batch_norm import make_sync_batch_norm as _make_sync_batch_norm
from krug._keras.api import make_api as _make_api

DistributedOptimizer, PartialDistributedOptimizer, load_model = _make_api(_keras)
SyncBatchNormalization = _make_sync_batch_norm(_keras.layers.BatchNormalization)

from krug.keras import callbacks, elastic  # noqa: E402
from krug.keras.callbacks import (  # noqa: E402,F401
    BroadcastGlobalVariablesCallback, MetricAverageCallback, LearningRateScheduleCallback,
    LearningRateWarmupCallback, BestModelCheckpoint)

