"""krug.tensorflow: Horovod's ``horovod.tensorflow`` API on krug.

    import tensorflow as tf
    import krug.tensorflow as hvd

    hvd.init()
    with tf.GradientTape() as tape:
        loss = ...
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)   # averaged over the ranks

Start the script with ``krugrun -np N python train.py``. The collectives are TensorFlow ops
(CPU), usable eagerly, inside ``tf.function`` and in ``tf.compat.v1`` graphs run by a session,
with registered gradients.
"""

from krug.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt, WorkerRemoved
from krug.tensorflow.mpi_ops import (
    # lifecycle and topology
    init, shutdown, is_initialized, start_timeline, stop_timeline,
    size, rank, local_size, local_rank, cross_size, cross_rank,
    is_homogeneous, mpi_threads_supported, mpi_enabled, mpi_built, gloo_enabled, gloo_built,
    nccl_built, ddl_built, ccl_built, cuda_built, rocm_built,
    size_op, rank_op, local_size_op, local_rank_op, process_set_included_op,
    # reduction ops
    Average, Sum, Adasum, Min, Max, Product, handle_average_backwards_compatibility,
    check_num_rank_power_of_2,
    # collectives
    allgather, grouped_allgather, broadcast, alltoall, join, barrier,
    # process sets
    ProcessSet, add_process_set, remove_process_set, global_process_set,
)
from krug.tensorflow.compression import Compression
from krug.tensorflow.gradients import (allreduce, grouped_allreduce, grouped_reducescatter,
                                       reducescatter)
from krug.tensorflow.functions import (allgather_object, broadcast_object, broadcast_object_fn,
                                       broadcast_variables, broadcast_global_variables,
                                       BroadcastGlobalVariablesHook)
from krug.tensorflow.util import (_executing_eagerly, _make_subgraph, _cache, vars_to_refs,
                                  refs_to_vars)
from krug.tensorflow.gradient_tape import (DistributedGradientTape,
                                           PartialDistributedGradientTape)
from krug.tensorflow.optimizer import DistributedOptimizer
from krug.tensorflow.sync_batch_norm import SyncBatchNormalization

# Last: it builds on the names above (hvd.elastic.run, hvd.elastic.TensorFlowKerasState).
from krug.tensorflow import elastic  # noqa: E402
