"""Elastic training with PyTorch (Horovod's ``horovod.torch.elastic``).

    import krug.torch as hvd

    hvd.init()
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=42)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        while state.epoch < epochs:
            ...                 # train a step on sampler.get_indices(...)
            state.commit()      # every rank, same step
        ...

    train(state)

Start it with ``krugrun --host-discovery-script ... python3 train.py``: when a worker fails
the others roll back to the last commit; when hosts join or leave everyone stops at a
commit; then krug re-forms with the new workers, rank 0's state is copied to every rank,
and ``train(state)`` is called again. Under a fixed job (plain ``krugrun -np N``) the
function just runs once and errors propagate.
"""

from krug.common.elastic import run_fn
from krug.common.exceptions import WorkerRemoved
from krug.torch import mpi_ops
from krug.torch.elastic import _core_bridge
from krug.torch.elastic.sampler import ElasticSampler
from krug.torch.elastic.state import ObjectState, TorchState


def _reset():
    # init() blocks until the driver gives this worker a place in the next round.
    mpi_ops.shutdown()
    mpi_ops.init()


def _round():
    return _core_bridge.elastic_round()


def _topology():
    return mpi_ops.rank(), mpi_ops.size()


def _enabled():
    return _core_bridge.elastic_enabled()


def run(func):
    """Decorator: runs ``func(state, ...)`` in the elastic recovery loop (see
    :func:`krug.common.elastic.run_fn`). The state is synced from rank 0 first; on a failed
    collective it is restored to the last commit, on changed hosts it is kept, and after
    krug re-forms ``func`` is called again. A worker the driver removed exits with status 0.
    """
    return run_fn(func, _reset, elastic_round=_round, topology=_topology,
                  elastic_enabled=_enabled)


__all__ = ["run", "TorchState", "ObjectState", "ElasticSampler", "WorkerRemoved"]
