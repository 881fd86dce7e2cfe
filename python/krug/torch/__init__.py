"""krug.torch: Horovod's ``horovod.torch`` API on krug.

    import krug.torch as hvd
    hvd.init()
    x = hvd.allreduce(torch.ones(3) * hvd.rank())   # the average over all ranks

Start the script with ``krugrun -np N /usr/bin/python3 train.py``.
"""

from krug.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt, WorkerRemoved
from krug.torch.mpi_ops import (
    # lifecycle and topology
    init, shutdown, is_initialized, start_timeline, stop_timeline,
    size, rank, local_size, local_rank, cross_size, cross_rank,
    is_homogeneous, mpi_threads_supported, mpi_enabled, mpi_built, gloo_enabled, gloo_built,
    nccl_built, ddl_built, ccl_built, cuda_built, rocm_built,
    # reduction ops
    Average, Sum, Adasum, Min, Max, Product,
    handle_average_backwards_compatibility,
    # collectives
    allreduce, allreduce_, allreduce_async, allreduce_async_,
    grouped_allreduce, grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_,
    allgather, allgather_async, grouped_allgather, grouped_allgather_async,
    broadcast, broadcast_, broadcast_async, broadcast_async_,
    alltoall, alltoall_async, sparse_allreduce_async,
    reducescatter, reducescatter_async, grouped_reducescatter, grouped_reducescatter_async,
    barrier, join, poll, synchronize,
    # process sets
    ProcessSet, add_process_set, remove_process_set, global_process_set,
)

from krug.torch.compression import Compression
from krug.torch.functions import (allgather_object, broadcast_object,
                                  broadcast_optimizer_state, broadcast_parameters)
from krug.torch.optimizer import DistributedOptimizer
from krug.torch.sync_batch_norm import SyncBatchNorm

# Last: it builds on the names above (hvd.elastic.run, hvd.elastic.TorchState, ...).
from krug.torch import elastic  # noqa: E402
