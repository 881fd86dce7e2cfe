"""krug.tensorflow.keras: Horovod's ``horovod.tensorflow.keras`` API for tf_keras (Keras 2 on
TensorFlow 2.16 and newer; ``TF_USE_LEGACY_KERAS=1`` makes ``tf.keras`` that too).

    import tf_keras as keras
    import krug.tensorflow.keras as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
"""

import tf_keras as _keras

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

from krug.tensorflow.keras import callbacks, elastic  # noqa: E402
from krug.tensorflow.keras.callbacks import (  # noqa: E402,F401
    BroadcastGlobalVariablesCallback, MetricAverageCallback, LearningRateScheduleCallback,
    LearningRateWarmupCallback, BestModelCheckpoint)

