"""TorchState: a model, its optimizer, an ElasticSampler and plain values, committed together."""
import copy

from krug.common.elastic import ObjectState
from krug.torch import _torch_core as _core
from krug.torch.elastic.sampler import ElasticSampler
from krug.torch.functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                  broadcast_parameters)
from krug.torch.mpi_ops import rank


def _host_update():
    return _core.elastic_host_update()


class _ModelHandler:
    def __init__(self, model):
        self.value = model
        self.saved = copy.deepcopy(model.state_dict())

    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        # load_state_dict copies into the existing tensors: optimizers keep their references.
        self.value.load_state_dict(self.saved)

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler:
    def __init__(self, optimizer):
        self.value = optimizer
        self.saved = copy.deepcopy(optimizer.state_dict())

    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(copy.deepcopy(self.saved))

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler:
    def __init__(self, sampler):
        self.value = sampler
        self.saved = copy.deepcopy(sampler.state_dict())

    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(copy.deepcopy(self.saved))

    def sync(self):
        # Every rank processed its own share: the epoch's processed set is their union.
        states = allgather_object(self.value.state_dict(), name="elastic.sampler")
        epoch = states[0]["epoch"]
        processed = set()
        for s in states:
            if s["epoch"] == epoch:
                processed.update(s["processed_indices"])
        self.value.load_state_dict({"epoch": epoch, "processed_indices": sorted(processed)})


class TorchState(ObjectState):
    """Horovod's ``TorchState(model, optimizer, **kwargs)``: commit() saves the model's and the
    optimizer's state dicts (deep copies, in memory), any ElasticSampler given as a keyword
    (what it processed this epoch) and every other keyword value (``epoch=0, batch=0``, read
    and written as attributes: ``state.epoch``); restore() returns to them; sync() broadcasts
    them from rank 0 (the sampler's processed indices are merged across ranks)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        handlers, values = {}, {}
        for name, value in kwargs.items():
            if isinstance(value, ElasticSampler):
                handlers[name] = _SamplerHandler(value)
            else:
                values[name] = value
        if model is not None:
            handlers["model"] = _ModelHandler(model)
        if optimizer is not None:
            handlers["optimizer"] = _OptimizerHandler(optimizer)
        self._handlers = handlers
        super().__init__(lambda obj, root: broadcast_object(obj, root, name="elastic.state"),
                         rank, _host_update, **values)
        for name, handler in handlers.items():
            setattr(self, name, handler.value)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()  # the plain values, then save()

    def on_reset(self):
        # A new number of ranks: samplers deal the rest of the epoch anew (also when the
        # survivors skipped the sync after hosts were only removed).
        for handler in self._handlers.values():
            if isinstance(handler, _SamplerHandler):
                handler.value.reset()
        super().on_reset()
