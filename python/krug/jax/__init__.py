"""krug.jax: data-parallel JAX on krug, with Horovod's names.

    import jax, optax
    import krug.jax as hvd

    hvd.init()
    params = hvd.broadcast_parameters(init_params(jax.random.key(0)))   # rank 0's, everywhere
    tx = hvd.DistributedOptimizer(optax.adam(1e-3 * hvd.size()))

    @jax.jit
    def step(params, state, batch):
        grads = jax.grad(loss)(params, batch)
        updates, state = tx.update(grads, state, params)   # gradients averaged over the ranks
        return optax.apply_updates(params, updates), state

Start the script with ``krugrun -np N python train.py``. The collectives take JAX arrays on the
CPU and work eagerly and inside ``jax.jit`` (an XLA FFI custom call each); see docs/jax.md.
"""

from krug.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt, WorkerRemoved
from krug.common.lifecycle import (
    init, shutdown, is_initialized, start_timeline, stop_timeline,
    size, rank, local_size, local_rank, cross_size, cross_rank,
    is_homogeneous, mpi_threads_supported, mpi_enabled, mpi_built, gloo_enabled, gloo_built,
    nccl_built, ddl_built, ccl_built, cuda_built, rocm_built, add_process_set, remove_process_set, barrier,
)
from krug.common.process_sets import ProcessSet, global_process_set
from krug.jax.ops import (
    Average, Sum, Adasum, Min, Max, Product,
    allreduce, grouped_allreduce, allgather, broadcast, alltoall, reducescatter, join,
)
from krug.jax.compression import Compression
from krug.jax.functions import (allgather_object, allreduce_gradients, broadcast_object,
                                broadcast_parameters)
from krug.jax.optimizer import DistributedOptimizer

# Last: it builds on the names above (hvd.elastic.run, hvd.elastic.JaxState).
from krug.jax import elastic  # noqa: E402

__all__ = [
    "HorovodInternalError", "HostsUpdatedInterrupt", "WorkerRemoved",
    "init", "shutdown", "is_initialized", "start_timeline", "stop_timeline",
    "size", "rank", "local_size", "local_rank", "cross_size", "cross_rank",
    "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled",
    "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
    "add_process_set", "remove_process_set", "barrier",
    "ProcessSet", "global_process_set",
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
    "join", "Compression", "allgather_object", "allreduce_gradients", "broadcast_object",
    "broadcast_parameters", "DistributedOptimizer", "elastic",
]
