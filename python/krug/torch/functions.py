"""Helpers that make ranks agree on state: parameters, optimizer state, arbitrary objects
(the horovod.torch.functions API)."""

import collections

import torch

from krug.common import objects as _objects
from krug.torch.mpi_ops import (allgather, broadcast_, broadcast_async_,
                                global_process_set, rank, synchronize)


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Broadcasts the parameters from ``root_rank`` to every rank of ``process_set``, in place.

    ``params``: a ``model.state_dict()`` (or any dict name -> tensor), a list of
    ``(name, tensor)`` pairs such as ``list(model.named_parameters())``, or a list of tensors
    such as ``list(model.parameters())``. The broadcasts run asynchronously and are all
    waited for before returning.
    """
    if isinstance(params, dict):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    elif isinstance(params, (list, tuple)) or hasattr(params, '__iter__'):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError('invalid params of type: %s' % type(params))

    handles = []
    for index, (name, p) in enumerate(items):
        if not torch.is_tensor(p):
            raise ValueError('broadcast_parameters: value of %r is not a tensor (%s)'
                             % (name, type(p).__name__))
        # Unnamed tensors are named by position; every rank passes them in the same order.
        full_name = 'broadcast_parameters.%s' % (name if name is not None else index)
        # .data: parameters are leaves that require grad; broadcasting into their storage must
        # not be recorded by autograd.
        handles.append(broadcast_async_(p.data, root_rank, name=full_name,
                                        process_set=process_set))
    for handle in handles:
        synchronize(handle)


def _to_torch(array):
    # The pickled bytes are a read-only buffer; torch wants a writable one.
    return torch.from_numpy(array.copy())


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns ``obj`` as passed on ``root_rank``, on every rank of ``process_set``.

    The object is pickled on the root into a uint8 tensor; its length is broadcast first so
    the other ranks can allocate the buffer. Non-root ranks may pass anything (e.g. None).
    An object the root cannot pickle raises ValueError on every rank.
    """
    if name is None:
        # A fixed default (Horovod derives it from type(obj), which makes non-root ranks
        # that pass None hang); the call is synchronous so reusing the name is safe.
        name = 'broadcast_object'

    def broadcast_tensor(array, suffix):
        t = _to_torch(array)
        broadcast_(t, root_rank, name=name + suffix, process_set=process_set)
        return t.numpy()

    return _objects.broadcast_object(obj, root_rank, rank() == root_rank,
                                     lambda a: broadcast_tensor(a, '.sz'),
                                     lambda a: broadcast_tensor(a, '.t'))


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of the objects passed by every rank of ``process_set``, in rank order.
    An object some rank cannot pickle raises ValueError on every rank."""
    if name is None:
        name = 'allgather_object'

    def allgather_tensor(array, suffix):
        return allgather(_to_torch(array), name=name + suffix, process_set=process_set).numpy()

    return _objects.allgather_object(obj, process_set.ranks,
                                     lambda a: allgather_tensor(a, '.sz'),
                                     lambda a: allgather_tensor(a, '.t'))


def _initialize_optimizer_state(optimizer):
    """Gives a freshly constructed optimizer its state by one step with zero gradients.

    Parameters and gradients are restored afterwards, so the model is unchanged even for
    optimizers whose step moves parameters without gradient (weight decay)."""
    saved = []
    for group in optimizer.param_groups:
        for p in group['params']:
            if p.requires_grad:
                saved.append((p, p.data.clone(), p.grad))
                grad = torch.zeros_like(p.data)
                if isinstance(optimizer, torch.optim.SparseAdam):
                    grad = grad.to_sparse()
                p.grad = grad
    if getattr(optimizer, '_krug_distributed', False):
        # A DistributedOptimizer's step() would allreduce; only rank-local work is wanted.
        super(optimizer.__class__, optimizer).step()
    else:
        optimizer.step()
    with torch.no_grad():
        for p, data, grad in saved:
            p.data.copy_(data)
            p.grad = grad


def broadcast_optimizer_state(optimizer, root_rank, process_set=global_process_set):
    """Makes the optimizer state (per-parameter state tensors and scalars, and the options
    of every param group such as the learning rate) of every rank equal to ``root_rank``'s.

    An optimizer without state yet (never stepped) first creates it with a zero-gradient
    step that leaves the parameters untouched. Accepts a torch optimizer or a
    DistributedOptimizer.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError('cannot broadcast torch.optim.LBFGS state')

    state_dict = optimizer.state_dict()
    if len(state_dict['state']) == 0:
        _initialize_optimizer_state(optimizer)
        state_dict = optimizer.state_dict()
    # The root's state decides which parameters have state and which keys it holds: a parameter
    # that had no gradient on some rank (frozen, or unused in its forward passes) has state
    # there only if it has on the root.
    layout = []
    scalars = {}
    for group in state_dict['param_groups']:
        for pid in group['params']:
            for key, value in sorted(state_dict['state'].get(pid, {}).items(),
                                     key=lambda kv: str(kv[0])):
                if torch.is_tensor(value):
                    layout.append((pid, key, tuple(value.shape), value.dtype,
                                   value.device.type))
                else:
                    scalars[(pid, key)] = value
    options = [{k: v for k, v in group.items() if k != 'params'}
               for group in state_dict['param_groups']]

    # Options, non-tensor state and the layout travel together as one pickled object (they may
    # be any Python value: floats, tuples such as Adam's betas, bools, None).
    root_options, root_scalars, root_layout = broadcast_object(
        (options, scalars, layout), root_rank, name='broadcast_optimizer_state.options',
        process_set=process_set)
    if len(root_options) != len(optimizer.param_groups):
        raise ValueError('broadcast_optimizer_state: rank %s has %d param groups, root has %d'
                         % (rank(), len(optimizer.param_groups),
                            len(root_options)))
    state = _state_like_root(optimizer, state_dict, root_layout, root_scalars)
    tensors = [('optimizer_state.%s.%s' % (pid, key), state[pid][key])
               for pid, key, _, _, _ in root_layout]
    broadcast_parameters(tensors, root_rank, process_set=process_set)

    for group, opts in zip(optimizer.param_groups, root_options):
        group.update(opts)
    for (pid, key), value in root_scalars.items():
        state[pid][key] = value


def _state_like_root(optimizer, state_dict, root_layout, root_scalars):
    """Gives this rank's optimizer state the root's structure: per-parameter dicts for the
    parameters the root has state for (and only those), holding the root's keys (and only
    those), and a tensor of the root's shape and dtype for each of its state tensors, to be
    overwritten by the broadcast. Returns the per-parameter state dicts by state_dict id. A
    state tensor is made on the root's kind of device (a CUDA one on this rank's parameter's
    device): a broadcast pairs like with like."""
    params = {pid: p for sd_group, group in zip(state_dict['param_groups'],
                                                optimizer.param_groups)
              for pid, p in zip(sd_group['params'], group['params'])}
    root_keys = collections.defaultdict(set)
    for pid, key in [entry[:2] for entry in root_layout] + list(root_scalars):
        root_keys[pid].add(key)
    for pid, p in params.items():
        if pid not in root_keys:
            optimizer.state.pop(p, None)
    state = {pid: optimizer.state[params[pid]] for pid in root_keys}
    # A key only this rank has (a momentum buffer when the root has no momentum, say) goes.
    for pid, keys in root_keys.items():
        for key in set(state[pid]) - keys:
            del state[pid][key]
    for pid, key, shape, dtype, device_type in root_layout:
        value = state[pid].get(key)
        if (not torch.is_tensor(value) or tuple(value.shape) != shape or value.dtype != dtype
                or value.device.type != device_type):
            device = params[pid].device if params[pid].device.type == device_type else None
            if device is None:
                device = torch.device(device_type) if device_type == 'cpu' else \
                    torch.device(device_type, torch.cuda.current_device())
            state[pid][key] = torch.zeros(shape, dtype=dtype, device=device)
    return state
