"""krug's collectives on JAX arrays, eagerly and inside ``jax.jit``: one XLA FFI custom call
(src/frameworks/jax/ffi_collective.cc) per operation, which enqueues the arrays' buffers through
krug's frontend seam without copying them through Python.

Names. Ranks match operations by name. Inside ``jax.jit`` an unnamed operation gets krug's next
unnamed name when the function is traced, so every rank that traces the same functions in the
same order agrees; a function that only some ranks trace should name its operations. Eagerly,
operations run one at a time, and an unnamed one shares its kind's fixed name.

Shapes. XLA fixes every result's shape when it traces a program. Eagerly krug.jax asks the
other ranks first, so allgather and alltoall accept a first dimension (and alltoall splits)
that differs per rank, as Horovod does. Inside ``jax.jit`` it cannot ask: every rank must pass
the same shape to allgather and alltoall, and alltoall splits evenly. A rank that breaks this
fails the operation on every rank with a message that says so.

Errors. Eagerly an operation waits for its result: a refused argument raises ValueError, a
failure of the job (a dead peer, ranks that disagree) HorovodInternalError. Inside ``jax.jit``
XLA raises them as ``jax.errors.JaxRuntimeError`` when the result is read.
"""

import ctypes

import jax
import jax.numpy as jnp
import numpy as np

from krug.common import process_sets as _process_sets
from krug.common import reduce_ops as _reduce_ops
from krug.common.binding import load_jax_ops
from krug.common.exceptions import HorovodInternalError
from krug.common.lifecycle import check_initialized

_basics, _library = load_jax_ops()
_TARGET = "krug_collective"
jax.ffi.register_ffi_target(
    _TARGET, jax.ffi.pycapsule(ctypes.CDLL(_library).KrugJaxCollective), platform="cpu")

# Reduction ops: the core's names and values, the same for every binding.
_REDUCE_OPS = _reduce_ops.ReduceOps(_basics)
Average, Sum, Adasum, Min, Max, Product = _REDUCE_OPS.horovod_constants()

# krug::frontend::OpType (include/krug/frontend.h).
_ALLREDUCE, _ALLGATHER, _BROADCAST, _ALLTOALL, _REDUCESCATTER, _JOIN = 0, 1, 2, 3, 4, 6

global_process_set = _process_sets.global_process_set


def _traced(*arrays):
    return any(isinstance(a, jax.core.Tracer) for a in arrays)


def _name(kind, name, process_set, traced):
    if name is not None:
        return str(name)
    if traced:
        return _basics.unnamed_op_name("jax." + kind, _process_sets.set_id(process_set))
    return "jax.%s.eager.%d" % (kind, _process_sets.set_id(process_set))


def _check_op(op):
    _REDUCE_OPS.check(op)


def _raised(error):
    """The exception krug.jax raises for XLA's error from the custom call."""
    message = str(error)
    for prefix in ("INVALID_ARGUMENT: ", "INTERNAL: "):
        if message.startswith(prefix):
            message = message[len(prefix):]
            return (ValueError if prefix.startswith("INVALID") else HorovodInternalError)(message)
    return HorovodInternalError(message)


def _collective(op_type, arrays, results, name, traced, reduce_op=0, prescale=1.0, postscale=1.0,
                root=0, process_set=global_process_set, grouped=False):
    """The custom call's results; eagerly, waited for, with krug's errors raised."""
    check_initialized()
    call = jax.ffi.ffi_call(_TARGET, results, has_side_effect=True)
    attributes = dict(name=name, op=np.int64(op_type), reduce_op=np.int64(reduce_op),
                      prescale=np.float64(prescale), postscale=np.float64(postscale),
                      root=np.int64(root), process_set=np.int64(_process_sets.set_id(process_set)),
                      grouped=np.int64(grouped))
    if traced:
        return call(*arrays, **attributes)
    try:
        return jax.block_until_ready(call(*arrays, **attributes))
    except jax.errors.JaxRuntimeError as e:
        raise _raised(e) from None


def _like(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _set_size(process_set):
    check_initialized()
    return len(_basics.process_set_ranks(_process_sets.set_id(process_set)))


def _set_rank(process_set):
    check_initialized()
    ranks = _basics.process_set_ranks(_process_sets.set_id(process_set))
    if _basics.rank() not in ranks:
        raise ValueError("rank {} is not a member of {}: only its members run its collectives"
                         .format(_basics.rank(), process_set))
    return ranks.index(_basics.rank())


# ---------------------------------------------------------------------------------------------
# The collectives. Each differentiable one is a jax.custom_vjp made per call: its arguments that
# are not arrays (name, op, process set) stay Python values, closed over.


def _reduce(tensors, name, op, prescale, postscale, process_set):
    traced = _traced(*tensors)
    grouped = len(tensors) > 1
    name = _name("grouped_allreduce" if grouped else "allreduce", name, process_set, traced)
    return list(_collective(_ALLREDUCE, tensors, [_like(t) for t in tensors], name, traced,
                            reduce_op=op, prescale=prescale, postscale=postscale,
                            process_set=process_set, grouped=grouped))


def _allreduce_fn(name, op, prescale, postscale, process_set):
    @jax.custom_vjp
    def reduce(tensors):
        return _reduce(tensors, name, op, prescale, postscale, process_set)

    def forward(tensors):
        return reduce(tensors), None

    def backward(_, grads):
        # Horovod's rule: the same allreduce of the output's gradient.
        if op not in (Sum, Average):
            raise NotImplementedError("the gradient of allreduce is only defined for Sum and "
                                      "Average, not {}".format(_REDUCE_OPS.name(op)))
        return (_allreduce_fn(None, op, prescale, postscale, process_set)(list(grads)),)

    reduce.defvjp(forward, backward)
    return reduce


def _reduction_op(op, average):
    op = _reduce_ops.handle_average_backwards_compatibility(op, average, Average, Sum)
    _check_op(op)
    return op


def allreduce(tensor, average=None, name=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """The reduction of ``tensor`` over the ranks of ``process_set`` (default op: Average),
    scaled by ``prescale_factor`` before and ``postscale_factor`` after. Differentiable for Sum
    and Average."""
    op = _reduction_op(op, average)
    fn = _allreduce_fn(name, op, float(prescale_factor), float(postscale_factor), process_set)
    return fn([jnp.asarray(tensor)])[0]


def grouped_allreduce(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set):
    """allreduce of every tensor as one request: negotiated together, fused where they fit."""
    op = _reduction_op(op, average)
    tensors = [jnp.asarray(t) for t in tensors]
    if not tensors:
        return []
    fn = _allreduce_fn(name, op, float(prescale_factor), float(postscale_factor), process_set)
    return fn(tensors)


def _first_dims(tensor, process_set):
    """Every rank's first dimension, in set order (eagerly: one small allgather)."""
    rows = jnp.asarray([tensor.shape[0]], dtype=jnp.int32)
    n = _set_size(process_set)
    out = _collective(_ALLGATHER, [rows], [jax.ShapeDtypeStruct((n,), jnp.int32)],
                      _name("allgather_rows", None, process_set, False), False,
                      process_set=process_set)[0]
    return [int(v) for v in np.asarray(out)]


def _allgather_fn(name, process_set):
    rows_of = {}  # every rank's first dimension, found by the forward pass, for the backward

    @jax.custom_vjp
    def gather(tensor):
        if tensor.ndim == 0:
            raise ValueError("allgather needs a tensor of at least one dimension")
        traced = _traced(tensor)
        if traced:
            rows = [tensor.shape[0]] * _set_size(process_set)
        else:
            rows = _first_dims(tensor, process_set)
        rows_of["rows"] = rows
        result = jax.ShapeDtypeStruct((sum(rows),) + tensor.shape[1:], tensor.dtype)
        return _collective(_ALLGATHER, [tensor], [result],
                           _name("allgather", name, process_set, traced), traced,
                           process_set=process_set)[0]

    def forward(tensor):
        return gather(tensor), None

    def backward(_, grad):
        # Horovod's rule: the gradient averaged over the ranks, this rank's rows.
        rows = rows_of["rows"]
        grad = allreduce(grad, op=Average, process_set=process_set)
        me = _set_rank(process_set)
        start = sum(rows[:me])
        return (jax.lax.slice_in_dim(grad, start, start + rows[me], axis=0),)

    gather.defvjp(forward, backward)
    return gather


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order. Eagerly
    the first dimension may differ per rank; inside jax.jit it must not. Differentiable."""
    return _allgather_fn(name, process_set)(jnp.asarray(tensor))


def _broadcast_fn(root, name, process_set):
    index = _process_sets.root_index(root, process_set)

    @jax.custom_vjp
    def bcast(tensor):
        traced = _traced(tensor)
        return _collective(_BROADCAST, [tensor], [_like(tensor)],
                           _name("broadcast", name, process_set, traced), traced, root=index,
                           process_set=process_set)[0]

    def forward(tensor):
        return bcast(tensor), None

    def backward(_, grad):
        # Horovod's rule: the gradient averaged over the ranks, kept on the root.
        reduced = allreduce(grad, op=Average, process_set=process_set)
        return (reduced if _set_rank(process_set) == index else jnp.zeros_like(reduced),)

    bcast.defvjp(forward, backward)
    return bcast


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """``tensor`` of ``root_rank`` (a global rank, a member of ``process_set``) on every rank.
    Differentiable: the gradient is averaged over the ranks and kept on the root."""
    return _broadcast_fn(root_rank, name, process_set)(jnp.asarray(tensor))


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends ``splits[r]`` rows of ``tensor`` to rank r of the set (None: an even split) and
    returns (the rows received, in rank order; how many came from each rank). Splits need the
    other ranks' answers first, so they work eagerly only; inside jax.jit the split is even and
    every rank passes the same shape."""
    tensor = jnp.asarray(tensor)
    if tensor.ndim == 0:
        raise ValueError("alltoall needs a tensor of at least one dimension")
    n = _set_size(process_set)
    traced = _traced(tensor)
    if splits is not None and (traced or _traced(splits)):
        raise ValueError("alltoall with splits works outside jax.jit only: the rows each rank "
                         "receives decide the result's shape, which jit fixes when it traces")
    if splits is None:
        sent = np.zeros([0], np.int32)
        rows = tensor.shape[0]
        if not traced and tensor.shape[0] % n == 0:
            rows = sum(_exchange_splits([tensor.shape[0] // n] * n, process_set))
    else:
        sent = np.asarray(splits, dtype=np.int32).reshape(-1)
        rows = sum(_exchange_splits(sent, process_set))
    results = [jax.ShapeDtypeStruct((rows,) + tensor.shape[1:], tensor.dtype),
               jax.ShapeDtypeStruct((n,), jnp.int32)]
    out, received = _collective(_ALLTOALL, [tensor, jnp.asarray(sent)], results,
                                _name("alltoall", name, process_set, traced), traced,
                                process_set=process_set)
    return out, received


def _exchange_splits(splits, process_set):
    """The rows each rank of the set will send this one (eagerly: one alltoall of one int32 per
    rank)."""
    n = _set_size(process_set)
    if len(splits) != n:
        raise ValueError("alltoall splits need one entry per rank of the set ({}), got {}"
                         .format(n, len(splits)))
    out, _ = _collective(_ALLTOALL, [jnp.asarray(splits, dtype=jnp.int32),
                                     jnp.zeros([0], jnp.int32)],
                         [jax.ShapeDtypeStruct((n,), jnp.int32),
                          jax.ShapeDtypeStruct((n,), jnp.int32)],
                         _name("alltoall_splits", None, process_set, False), False,
                         process_set=process_set)
    return [int(v) for v in np.asarray(out)]


def _reducescatter_fn(name, op, prescale, postscale, process_set):
    n = _set_size(process_set)
    me = _set_rank(process_set)

    @jax.custom_vjp
    def scatter(tensor):
        if tensor.ndim == 0:
            raise ValueError("reducescatter needs a tensor of at least one dimension")
        traced = _traced(tensor)
        rows = tensor.shape[0] // n + (1 if me < tensor.shape[0] % n else 0)
        result = jax.ShapeDtypeStruct((rows,) + tensor.shape[1:], tensor.dtype)
        return _collective(_REDUCESCATTER, [tensor], [result],
                           _name("reducescatter", name, process_set, traced), traced,
                           reduce_op=op, prescale=prescale, postscale=postscale,
                           process_set=process_set)[0]

    def forward(tensor):
        return scatter(tensor), None

    def backward(_, grad):
        # Horovod's rule (as krug.torch's): the allgather of the output's gradient times the
        # scale factors, and for Sum times the set's size.
        if op not in (Sum, Average):
            raise NotImplementedError("the gradient of reducescatter is only defined for Sum "
                                      "and Average, not {}".format(_REDUCE_OPS.name(op)))
        scale = prescale * postscale * (n if op == Sum else 1)
        grad = allgather(grad, process_set=process_set)
        return (grad * jnp.asarray(scale, grad.dtype) if scale != 1.0 else grad,)

    scatter.defvjp(forward, backward)
    return scatter


def reducescatter(tensor, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                  process_set=global_process_set):
    """The reduction of ``tensor`` over the set, of which this rank keeps its share of the first
    dimension: rank i of n gets d // n rows, one more when i < d % n. Differentiable for Sum and
    Average."""
    _check_op(op)
    fn = _reducescatter_fn(name, op, float(prescale_factor), float(postscale_factor),
                           process_set)
    return fn(jnp.asarray(tensor))


def join():
    """For a rank out of data: returns once every rank has joined, while the other ranks'
    allreduces go on with this rank contributing zeros. Returns the rank that joined last."""
    out = _collective(_JOIN, [], [jax.ShapeDtypeStruct((), jnp.int32)], "join", False)[0]
    return int(out)
