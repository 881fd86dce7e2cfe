"""TorchState and ObjectState: elastic state bound to krug.torch's collectives."""

import copy

from krug.common import elastic as common
from krug.torch import mpi_ops
from krug.torch.elastic import _core_bridge
from krug.torch.elastic.sampler import ElasticSampler
from krug.torch.functions import (allgather_object, broadcast_object,
                                  broadcast_optimizer_state, broadcast_parameters)


def _bcast_object(obj):
    return broadcast_object(obj, root_rank=0, name="krug.elastic.state")


# Looked up at call time, so tests can replace the bridge's functions.
def _host_update():
    return _core_bridge.elastic_host_update()


def _elastic_enabled():
    return _core_bridge.elastic_enabled()


_BINDINGS = dict(bcast_object=_bcast_object, get_rank=mpi_ops.rank,
                 host_update=_host_update, elastic_enabled=_elastic_enabled)


class ObjectState(common.ObjectState):
    """Plain Python values as attributes, committed, restored and synced from rank 0:

        state = hvd.elastic.ObjectState(epoch=0, best_loss=None)
    """

    def __init__(self, **kwargs):
        super().__init__(**_BINDINGS, **kwargs)


class _StateDictHandler:
    """Saves a tracked object's ``state_dict()`` on commit and loads it back on restore; a
    subclass says how the object is synced from rank 0."""

    def __init__(self, obj):
        self.obj = obj
        self.save()

    def save(self):
        self.saved = copy.deepcopy(self.obj.state_dict())

    def restore(self):
        # A copy: some torch versions keep the loaded tensors, which the next step would
        # update in place, changing the saved state.
        self.obj.load_state_dict(copy.deepcopy(self.saved))

    def on_reset(self):
        pass


class _ModelHandler(_StateDictHandler):
    def restore(self):
        self.obj.load_state_dict(self.saved)  # copies into the parameters

    def sync(self, local_commits):
        broadcast_parameters(self.obj.state_dict(), root_rank=0)


class _OptimizerHandler(_StateDictHandler):
    def sync(self, local_commits):
        broadcast_optimizer_state(self.obj, root_rank=0)


class _SamplerHandler(_StateDictHandler):
    def __init__(self, name, sampler):
        self.name = name
        super().__init__(sampler)

    def sync(self, local_commits):
        # The union of the ranks' processed indices (record_indices records on one rank
        # only), taken over the ranks at rank 0's epoch and commit: a rank that got one
        # commit further than rank 0 before a failure must not skip rank 0's next batch.
        gathered = allgather_object((local_commits, self.obj.state_dict()),
                                    name="krug.elastic.sampler.%s" % self.name)
        root_commits, root = gathered[0]
        processed = set(root["processed_indices"])
        for commits, theirs in gathered[1:]:
            if commits == root_commits and theirs["epoch"] == root["epoch"]:
                processed.update(theirs["processed_indices"])
        self.obj.load_state_dict({"epoch": root["epoch"],
                                  "processed_indices": sorted(processed)})

    def on_reset(self):
        self.obj.reset()  # the new rank and size; no collective (new workers sync first)


def _handler_for(name, value):
    """The handler of a tracked attribute, or None for a plain value."""
    import torch

    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(name, value)
    return None


class TorchState(common.ObjectState):
    """The state of an elastic PyTorch training function:

        state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    ``commit()`` saves copies of ``model.state_dict()`` and ``optimizer.state_dict()``,
    restore loads them back, and sync broadcasts rank 0's parameters, buffers and optimizer
    state. Keyword arguments become attributes (``state.epoch``): every module and optimizer
    among them (a GAN's discriminator and its optimizer) is handled as ``model`` and
    ``optimizer`` are, as in Horovod; an :class:`ElasticSampler` keeps its epoch and processed
    indices (merged over the ranks on sync, and dealt to the new ranks after each reset); any
    other value is deep-copied on commit and broadcast from rank 0 on sync, as in
    :class:`ObjectState`. Assigning a new module, optimizer or sampler to one of these
    attributes tracks the new object from then on (its current values are the saved ones).
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        tracked = {"model": model, "optimizer": optimizer}
        tracked.update({k: v for k, v in kwargs.items() if _handler_for(k, v) is not None})
        values = {k: v for k, v in kwargs.items() if k not in tracked}
        super().__init__(**_BINDINGS, **values)
        self._tracked = set(tracked)
        self._handlers = {}
        for name, value in tracked.items():
            setattr(self, name, value)

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in self._tracked:
            handler = _handler_for(name, value) if value is not None else None
            if handler is None:
                handlers.pop(name, None)
            else:
                handlers[name] = handler
        super().__setattr__(name, value)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        local_commits = self.commits
        for handler in self._handlers.values():
            handler.sync(local_commits)
        super().sync()  # the plain values and the commit counter
        self.save()

    def on_reset(self):
        for handler in self._handlers.values():
            handler.on_reset()
        super().on_reset()
