"""Elastic training with krug.torch, Horovod's ``horovod.torch.elastic`` API (docs/elastic.md).

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...  # state.commit() at consistent points

    train(state)

Started by ``krugrun --host-discovery-script ...``; without it, ``run`` calls the function once
after syncing the state from rank 0.
"""
from krug.common.elastic import State, run_fn
from krug.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt, WorkerRemoved
from krug.torch import _torch_core as _core
from krug.torch.elastic.sampler import ElasticSampler
from krug.torch.elastic.state import TorchState
from krug.torch.functions import broadcast_object
from krug.torch.mpi_ops import init, rank, shutdown, size
from krug.common.elastic import ObjectState as _ObjectState


def _reset():
    shutdown()
    init()


def _round_info():
    return _core.elastic_round()


def run(func):
    """Decorator: ``func(state, ...)`` runs until it returns, surviving failures and host
    changes as docs/elastic.md describes. A worker the driver removes exits with status 0."""
    return run_fn(func, _reset, rank, size, _round_info)


def ObjectState(**kwargs):  # noqa: N802 -- Horovod's name for a class
    """Plain values, synced from rank 0 with broadcast_object: ``ObjectState(epoch=0)``."""
    return _ObjectState(lambda obj, root: broadcast_object(obj, root, name="elastic.state"), rank,
                        _core.elastic_host_update, **kwargs)


__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HorovodInternalError", "HostsUpdatedInterrupt", "WorkerRemoved"]
