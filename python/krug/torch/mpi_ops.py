"""Horovod's ``horovod.torch`` collective API on krug's engine.

Names, arguments, defaults and semantics follow Horovod, so ``import krug.torch as hvd``
works for existing scripts. Operations are submitted by name to krug's background engine;
the ``*_async`` forms return an integer handle for :func:`poll` and :func:`synchronize`.
Only CPU tensors are supported by this build.
"""

import torch

from krug.torch.compression import Compression
from krug.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from krug.common.binding import load_torch_core
from krug.common import lifecycle as _lifecycle
from krug.common import process_sets as _process_sets
from krug.common import reduce_ops as _reduce_ops
from krug.common.lifecycle import (  # noqa: F401 (krug.torch's API)
    init, shutdown, is_initialized, start_timeline, stop_timeline, size, rank, local_size,
    local_rank, cross_size, cross_rank, is_homogeneous, mpi_threads_supported, mpi_enabled,
    mpi_built, gloo_enabled, gloo_built, nccl_built, ddl_built, ccl_built, cuda_built,
    rocm_built, add_process_set, remove_process_set, barrier)

_core = load_torch_core()  # an ImportError that says how to rebuild when it is missing

# Reduction ops: the core's names and values, the same for every binding.
_REDUCE_OPS = _reduce_ops.ReduceOps(_core)
Average, Sum, Adasum, Min, Max, Product = _REDUCE_OPS.horovod_constants()


# Horovod's default for the compression= argument.
_NoCompression = Compression.none


# ---------------------------------------------------------------------------------------------
# Lifecycle, topology, build flags and process sets: krug.common.lifecycle's, shared with the
# other frontends.


def _forget_handles():
    # After the core's shutdown, which completed every pending operation: dropping the handles
    # never waits for one (a handle's destructor waits for its operation).
    _results.clear()
    _handles.clear()


_lifecycle.use_core(_core, on_shutdown=_forget_handles)
ProcessSet = _process_sets.ProcessSet
global_process_set = _process_sets.global_process_set
_set_id = _process_sets.set_id


def _check_has_gpu():
    """Whether CUDA tensors can be reduced here: a CUDA build and a visible GPU (Horovod's
    probe, which krug.common.util.gpu_available runs in a forked process)."""
    return cuda_built() and torch.cuda.is_available()


# ---------------------------------------------------------------------------------------------
# Names and handles

def _name(kind, name, process_set):
    """The user's name, or the core's "<kind>.noname.<n>" (krug::unnamed_op_name): a counter per
    op kind and process set that every init() starts again, so the same sequence of unnamed calls
    gets the same names on every rank, also after an elastic reset."""
    if name is not None:
        return str(name)
    return _core.unnamed_op_name(kind, _set_id(process_set))


# Handles are integers (as Horovod's), mapped to their operations by the core's table, which
# keeps the tensors an operation reads and writes alive until synchronize(). _results holds
# how to make the result of the ops whose result is not their first output tensor. One dict
# operation each: atomic under the GIL, so no lock on this per-call path.
_handles = _core.Handles()
_results = {}


def _register(core_handle, result):
    handle = _handles.add(core_handle)
    if result is not _first_output:
        _results[handle] = result
    return handle


def poll(handle):
    """True if the asynchronous operation of ``handle`` has finished (successfully or not);
    never blocks. Call synchronize() to get its result."""
    return _handles.poll(handle)


def synchronize(handle):
    """Waits for the operation of ``handle`` and returns its output: the output tensor (the
    input itself for in-place ops), a list of tensors for grouped ops, and
    ``(output, received_splits)`` for alltoall, the reduced sparse tensor for
    sparse_allreduce_async. Raises HorovodInternalError if it failed."""
    # The core waits with the GIL released, in slices so that Ctrl-C reaches Python; an unknown
    # handle (already synchronized) gives None.
    if callable(handle):
        return handle()  # sparse_allreduce_async's
    result = _results.pop(handle, None)
    if result is None:
        return _handles.synchronize(handle, True)
    core_handle = _handles.synchronize(handle, False)
    return None if core_handle is None else result(core_handle)


def _first_output(h):
    return h.output(0)


def _all_outputs(h):
    return list(h.outputs())


# ---------------------------------------------------------------------------------------------
# Allreduce


def handle_average_backwards_compatibility(op, average):
    """Resolves Horovod's deprecated ``average=`` argument into ``op``."""
    return _reduce_ops.handle_average_backwards_compatibility(op, average, Average, Sum)


def _check_op(op):
    _REDUCE_OPS.check(op)
    if op == Adasum and not _core.adasum_available():
        raise NotImplementedError("Adasum is not available in this build")


def _check_adasum_size(op, process_set):
    # Horovod refuses at the call what the engine would refuse only at synchronize.
    if op != Adasum or not isinstance(process_set, ProcessSet):
        return  # a bad process set gets _set_id's message
    n = process_set.size()
    if n is not None and n & (n - 1):
        raise NotImplementedError("Adasum needs a power-of-two number of ranks; {} has {}"
                                  .format(process_set, n))


# The ops the core takes as they are (Adasum needs the build's check and code).
_PLAIN_OPS = frozenset((Sum, Average, Min, Max, Product))


def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set):
    # Every gradient of every step comes here: the common case is checked inline, the helpers
    # (and their messages) handle the rest.
    if op not in _PLAIN_OPS:
        _check_op(op)
        _check_adasum_size(op, process_set)
    if isinstance(process_set, ProcessSet) and process_set.process_set_id is not None:
        set_id = process_set.process_set_id
    else:
        set_id = _set_id(process_set)
    if type(name) is not str:
        name = _name("allreduce", name, process_set)
    if output is None:
        output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _handles.allreduce_async(name, tensor, output, op, float(prescale_factor),
                                    float(postscale_factor), set_id)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts an allreduce of ``tensor`` into a new tensor; returns a handle for
    poll()/synchronize(). ``op``: Average (default), Sum, Min, Max, Product (Adasum when the
    build has it). ``prescale_factor`` multiplies the input, ``postscale_factor`` the result."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensor, None, name, op, prescale_factor, postscale_factor,
                            process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce_async: the result is written into ``tensor``."""
    if op is None or average is not None:
        op = handle_average_backwards_compatibility(op, average)
    # DistributedOptimizer's call for every gradient: _allreduce_async's common case inline,
    # a Python call less (the core converts the scale factors).
    if (op in _PLAIN_OPS and type(name) is str and type(process_set) is ProcessSet
            and process_set.process_set_id is not None):
        return _handles.allreduce_async(name, tensor, tensor, op, prescale_factor,
                                        postscale_factor, process_set.process_set_id)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor,
                            process_set)


def _keep_reduction(ctx, op, prescale_factor, postscale_factor, process_set):
    """Keeps a reducing op's arguments in its autograd ``ctx``: its backward reduces or
    gathers with them."""
    ctx.op = op
    ctx.prescale_factor = prescale_factor
    ctx.postscale_factor = postscale_factor
    ctx.process_set = process_set


def _needs_graph(tensor):
    """Whether autograd must record an op on ``tensor``. Only then is a differentiable op's
    torch.autograd.Function worth its cost (7 us a call on a 2-core VM, more than a small
    allreduce on the direct lane); without it the result is the same, with no grad_fn."""
    return tensor.requires_grad and torch.is_grad_enabled()


def _user_name(name):
    # The user's name as the core takes it; None leaves the unnamed call's name to the core.
    return name if name is None or type(name) is str else str(name)


def _direct(name, tensor, output, op, prescale_factor, postscale_factor):
    """A synchronous allreduce on the global set, run at once on the direct lane (a small CPU
    tensor whose call every rank of this one host makes together: docs/architecture.md) into
    ``output`` (None: a new tensor). Returns the output when it ran there, else the name the call
    takes through the engine (an unnamed call's is made by the core: krug::unnamed_op_name)."""
    return _core.allreduce_direct(_user_name(name), tensor, output, op, float(prescale_factor),
                                  float(postscale_factor))


def _allreduced(tensor, name, op, prescale_factor, postscale_factor, process_set):
    """The reduction of ``tensor`` in a new tensor: hvd.allreduce's forward."""
    if op in _PLAIN_OPS and process_set is global_process_set:
        name = _direct(name, tensor, None, op, prescale_factor, postscale_factor)
        if type(name) is not str:
            return name  # the output
    return synchronize(_allreduce_async(tensor, None, name, op, prescale_factor,
                                        postscale_factor, process_set))


class HorovodAllreduce(torch.autograd.Function):
    """Differentiable allreduce: the gradient is the allreduce of the output's gradient with
    the same op and scale factors."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        _keep_reduction(ctx, op, prescale_factor, postscale_factor, process_set)
        return _allreduced(tensor, name, op, prescale_factor, postscale_factor, process_set)

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=ctx.op, prescale_factor=ctx.prescale_factor,
                         postscale_factor=ctx.postscale_factor, process_set=ctx.process_set)
        return grad, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=_NoCompression, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Returns the reduction of ``tensor`` over all ranks of ``process_set`` (a new tensor;
    the input is unchanged). Differentiable. ``compression`` compresses the tensor on the
    wire (e.g. hvd.Compression.fp16)."""
    op = handle_average_backwards_compatibility(op, average)
    compressed, cctx = compression.compress(tensor)
    if _needs_graph(compressed):
        reduced = HorovodAllreduce.apply(compressed, name, op, prescale_factor,
                                         postscale_factor, process_set)
    else:
        reduced = _allreduced(compressed, name, op, prescale_factor, postscale_factor,
                              process_set)
    return compression.decompress(reduced, cctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce: reduces ``tensor`` over all ranks and returns it. Not
    differentiable."""
    op = handle_average_backwards_compatibility(op, average)
    if op in _PLAIN_OPS and process_set is global_process_set:
        name = _direct(name, tensor, tensor, op, prescale_factor, postscale_factor)
        if type(name) is not str:
            return tensor
    return synchronize(allreduce_async_(tensor, None, name, op, prescale_factor,
                                        postscale_factor, process_set))


def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor,
                             process_set):
    _check_op(op)
    set_id = _set_id(process_set)
    _check_adasum_size(op, process_set)
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped_allreduce: no tensors")
    name = _name("grouped_allreduce", name, process_set)
    if outputs is None:
        outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    h = _core.grouped_allreduce_async(name, tensors, list(outputs), op,
                                      float(prescale_factor),
                                      float(postscale_factor), set_id)
    return _register(h, _all_outputs)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts one allreduce request for all ``tensors`` (they run together); synchronize()
    returns the list of reduced tensors."""
    op = handle_average_backwards_compatibility(op, average)
    return _grouped_allreduce_async(tensors, None, name, op, prescale_factor, postscale_factor,
                                    process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped_allreduce_async."""
    op = handle_average_backwards_compatibility(op, average)
    tensors = list(tensors)
    return _grouped_allreduce_async(tensors, tensors, name, op, prescale_factor,
                                    postscale_factor, process_set)


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        _keep_reduction(ctx, op, prescale_factor, postscale_factor, process_set)
        return tuple(synchronize(_grouped_allreduce_async(
            tensors, None, name, op, prescale_factor, postscale_factor, process_set)))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = grouped_allreduce(list(grad_output), op=ctx.op,
                                  prescale_factor=ctx.prescale_factor,
                                  postscale_factor=ctx.postscale_factor,
                                  process_set=ctx.process_set)
        return (None, None, None, None, None) + tuple(grads)


def grouped_allreduce(tensors, average=None, name=None, compression=_NoCompression, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduces a list of tensors as one request; returns the list of results.
    Differentiable."""
    op = handle_average_backwards_compatibility(op, average)
    compressed = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedAllreduce.apply(name, op, prescale_factor, postscale_factor,
                                            process_set, *[c[0] for c in compressed])
    return [compression.decompress(t, c[1]) for t, c in zip(reduced, compressed)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped allreduce; returns the (reduced) input tensors."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Starts the reduction of a sparse COO ``tensor`` over the ranks of ``process_set``, as
    Horovod does: an allgather of its indices and of its values (a sum of sparse tensors is the
    concatenation of their entries). ``op`` is Average (values divided by the set's size) or
    Sum. Returns a callable: ``handle()`` (or ``synchronize(handle)``) waits and returns the
    reduced sparse tensor, coalesced."""
    if op not in (Average, Sum):
        raise NotImplementedError("sparse allreduce supports only op=Average or op=Sum, not {}; "
                                  "reduce the tensor dense instead".format(_REDUCE_OPS.name(op)))
    if not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async takes a sparse COO tensor; use allreduce_async "
                         "for dense tensors")
    t = tensor.coalesce()
    name = _name("sparse_allreduce", name, process_set)
    # allgather concatenates along the first dimension: indices travel as (nnz, sparse_dim).
    indices_handle = allgather_async(t.indices().t().contiguous(), name=name + ".indices",
                                     process_set=process_set)
    values_handle = allgather_async(t.values().contiguous(), name=name + ".values",
                                    process_set=process_set)

    def handle():
        values = synchronize(values_handle)
        indices = synchronize(indices_handle)
        if op == Average:
            values = values / process_set.size()
        return torch.sparse_coo_tensor(indices.t(), values, t.size()).coalesce()

    return handle


# ---------------------------------------------------------------------------------------------
# Allgather


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts an allgather: the concatenation of every rank's ``tensor`` along the first
    dimension (which may differ between ranks)."""
    set_id = _set_id(process_set)
    h = _core.allgather_async(_name("allgather", name, process_set), tensor, set_id)
    return _register(h, _first_output)


def _allgather_backward(grad_output, dim, process_set):
    # Horovod's rule: average the gradient over the ranks, then keep this rank's rows.
    grad_reduced = allreduce(grad_output, op=Average, process_set=process_set)
    dims = allgather(torch.tensor([dim], dtype=torch.int64), process_set=process_set)
    r = process_set.rank()
    offset = int(dims[:r].sum().item()) if r > 0 else 0
    return grad_reduced.narrow(0, offset, dim)


def _allgathered(tensor, name, process_set):
    """Every rank's ``tensor`` concatenated along the first dimension: hvd.allgather's
    forward."""
    if process_set is global_process_set:
        # The direct lane, for a small tensor whose shape is the same on every rank.
        name = _core.allgather_direct(_user_name(name), tensor, None)
        if type(name) is not str:
            return name  # the output
    return synchronize(allgather_async(tensor, name, process_set))


class HorovodAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0] if tensor.dim() > 0 else 1
        ctx.process_set = process_set
        return _allgathered(tensor, name, process_set)

    @staticmethod
    def backward(ctx, grad_output):
        return _allgather_backward(grad_output, ctx.dim, ctx.process_set), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Returns the concatenation of every rank's ``tensor`` along the first dimension.
    Differentiable."""
    if _needs_graph(tensor):
        return HorovodAllgather.apply(tensor, name, process_set)
    return _allgathered(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts one allgather request for a list of tensors; synchronize() returns a list."""
    set_id = _set_id(process_set)
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped_allgather: no tensors")
    h = _core.grouped_allgather_async(_name("grouped_allgather", name, process_set), tensors,
                                      set_id)
    return _register(h, _all_outputs)


class HorovodGroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims = [t.shape[0] for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(tensors, name, process_set)))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = [_allgather_backward(g, d, ctx.process_set)
                 for g, d in zip(grad_output, ctx.dims)]
        return (None, None) + tuple(grads)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers a list of tensors as one request; returns the list of results.
    Differentiable."""
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# ---------------------------------------------------------------------------------------------
# Broadcast


_root_index = _process_sets.root_index


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts an in-place broadcast of ``tensor`` from ``root_rank`` (a global rank, which must
    be a member of ``process_set``)."""
    set_id = _set_id(process_set)
    h = _core.broadcast_async(_name("broadcast", name, process_set), tensor,
                              _root_index(root_rank, process_set), set_id)
    return _register(h, _first_output)


def _broadcast_output(tensor):
    """A contiguous copy of ``tensor`` outside autograd: where an out-of-place broadcast writes."""
    with torch.no_grad():
        return tensor.detach().clone(memory_format=torch.contiguous_format)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast of ``tensor`` from ``root_rank`` into a new tensor."""
    return broadcast_async_(_broadcast_output(tensor), root_rank, name, process_set)


class HorovodBroadcast(torch.autograd.Function):
    """Differentiable broadcast. Horovod's rule: the gradient is averaged over the ranks and
    kept on the root; other ranks get zeros."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return broadcast_(_broadcast_output(tensor), root_rank, name, process_set)

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            grad_reduced = grad_reduced * 0
        return grad_reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns ``tensor`` of ``root_rank`` on every rank (a new tensor). Differentiable."""
    if _needs_graph(tensor):
        return HorovodBroadcast.apply(tensor, root_rank, name, process_set)
    # No graph to keep the copy out of (_broadcast_output's no_grad and detach cost 10 us).
    return broadcast_(tensor.clone(memory_format=torch.contiguous_format), root_rank, name,
                      process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast from ``root_rank``; returns ``tensor``. Not differentiable."""
    if process_set is global_process_set:
        name = _core.broadcast_direct(_user_name(name), tensor, int(root_rank))
        if type(name) is not str:
            return tensor
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---------------------------------------------------------------------------------------------
# Alltoall


def _splits_list(splits):
    # The core checks them (krug::check_alltoall_splits: ValueError before anything is sent).
    if splits is None:
        return []
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    return [int(s) for s in splits]


def _alltoall_result(h):
    return h.output(0), torch.tensor(h.received_splits(), dtype=torch.int32)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall: splits[r] rows of ``tensor`` (first dimension) go to rank r; without
    splits the rows are divided evenly. synchronize() returns (output, received_splits)."""
    set_id = _set_id(process_set)
    split_list = _splits_list(splits)
    h = _core.alltoall_async(_name("alltoall", name, process_set), tensor, split_list, set_id)
    return _register(h, _alltoall_result)


class HorovodAlltoall(torch.autograd.Function):
    """Differentiable alltoall: the gradient goes back with the received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received_splits = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.process_set = process_set
        ctx.recvsplits = received_splits
        if splits is None:
            return output
        ctx.mark_non_differentiable(received_splits)
        return output, received_splits

    @staticmethod
    def backward(ctx, grad_output, *dead_gradients):
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.recvsplits,
                                             process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Scatters slices of ``tensor`` to every rank and gathers what they send.

    splits: how many rows (first dimension) go to each rank, in rank order (a list or an
    integer tensor); None divides the rows evenly.
    Returns the received rows, concatenated in rank order; when ``splits`` is given, returns
    ``(output, received_splits)`` where received_splits (int32) says how many rows came from
    each rank. Differentiable."""
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


# ---------------------------------------------------------------------------------------------
# Reducescatter


def _check_reducescatter_op(op):
    _check_op(op)
    if op == Adasum:
        raise NotImplementedError("reducescatter does not support Adasum")


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter: the reduction over ranks, of which rank r keeps its share of the
    first dimension (split as evenly as possible, lower ranks get the extra rows)."""
    _check_reducescatter_op(op)
    set_id = _set_id(process_set)
    h = _core.reducescatter_async(_name("reducescatter", name, process_set), tensor, op,
                                  float(prescale_factor), float(postscale_factor), set_id)
    return _register(h, _first_output)


def _reducescatter_backward(grad_output, op, prescale_factor, postscale_factor, process_set):
    # Horovod's rule, kept for parity (it matches the gradient of allreduce's Average, where
    # every rank's loss counts once): Sum scales the output's gradient by the set's size,
    # Average does not; both apply the scale factors; then every rank gets every share.
    _REDUCE_OPS.check_differentiable("reducescatter", op)
    scale = float(prescale_factor) * float(postscale_factor)
    if op == Sum:
        scale *= process_set.size()
    grad = grad_output.contiguous()
    if scale != 1.0:
        grad = grad * scale
    return allgather(grad, process_set=process_set)


class HorovodReducescatter(torch.autograd.Function):
    """Differentiable reducescatter: the gradient is the allgather of the output's gradient,
    times the scale factors, and for Sum times the set's size (as Horovod)."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        _keep_reduction(ctx, op, prescale_factor, postscale_factor, process_set)
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad = _reducescatter_backward(grad_output, ctx.op, ctx.prescale_factor,
                                       ctx.postscale_factor, ctx.process_set)
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=_NoCompression, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Returns this rank's share of the reduction of ``tensor`` over all ranks.
    Differentiable for Sum and Average."""
    compressed, cctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                     postscale_factor)
    return compression.decompress(out, cctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts one reducescatter request for a list of tensors; synchronize() returns a
    list."""
    _check_reducescatter_op(op)
    set_id = _set_id(process_set)
    tensors = list(tensors)
    if not tensors:
        raise ValueError("grouped_reducescatter: no tensors")
    h = _core.grouped_reducescatter_async(_name("grouped_reducescatter", name, process_set),
                                          tensors, op, float(prescale_factor),
                                          float(postscale_factor), set_id)
    return _register(h, _all_outputs)


class HorovodGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        _keep_reduction(ctx, op, prescale_factor, postscale_factor, process_set)
        return tuple(synchronize(grouped_reducescatter_async(
            tensors, name, op, process_set, prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = [_reducescatter_backward(g, ctx.op, ctx.prescale_factor, ctx.postscale_factor,
                                         ctx.process_set) for g in grad_output]
        return (None, None, None, None, None) + tuple(grads)


def grouped_reducescatter(tensors, name=None, compression=_NoCompression, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatters a list of tensors as one request; returns the list of results.
    Differentiable for Sum and Average."""
    compressed = [compression.compress(t) for t in tensors]
    outs = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                             postscale_factor, *[c[0] for c in compressed])
    return [compression.decompress(t, c[1]) for t, c in zip(outs, compressed)]


# ---------------------------------------------------------------------------------------------
# Join


def join(device=-1):
    """For a rank that ran out of data: until every rank has joined, the other ranks'
    allreduces proceed with this rank contributing zeros. Returns the rank that joined last.
    ``device`` is accepted for compatibility: krug's zeros follow the other ranks' tensors."""
    _lifecycle.check_initialized()
    h = _handles.synchronize(_handles.add(_core.join_async()), False)
    return int(h.value())
