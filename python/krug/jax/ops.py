"""krug's collectives on JAX arrays, eagerly and inside ``jax.jit``: one XLA FFI custom call
(src/frameworks/jax/ffi_collective.cc) per operation, which enqueues the arrays' buffers through
krug's frontend seam without copying them through Python.

Names. Ranks match operations by name. An unnamed operation is named after the line of the
user's code that called it (``jax.allreduce@train.py:42``), the same on every rank and every
time a function is traced again. A jitted program's collectives run one after another in the
order it called them (_ProgramOrder), so operations of one line that share a name never
overlap; every rank must run the same jitted programs in the same order (as SPMD training
does).

Shapes. XLA fixes every result's shape when it traces a program. Eagerly krug.jax asks the
other ranks first, so allgather and alltoall accept a first dimension (and alltoall splits)
that differs per rank, as Horovod does. Inside ``jax.jit`` it cannot ask: every rank must pass
the same shape to allgather and alltoall, and alltoall splits evenly. A rank that breaks this
fails the operation on every rank with a message that says so.

Errors. A refused argument raises ValueError, a failure of the job (a dead peer, ranks that
disagree) HorovodInternalError; inside ``jax.jit`` XLA raises them as
``jax.errors.JaxRuntimeError`` when the program runs.
"""

import collections
import ctypes
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from krug.common import lifecycle as _lifecycle
from krug.common import process_sets as _process_sets
from krug.common import reduce_ops as _reduce_ops
from krug.common.binding import load_jax_ops
from krug.common.exceptions import HorovodInternalError
from krug.common.lifecycle import check_initialized

_basics, _library = load_jax_ops()
_lifecycle.use_core(_basics)
_TARGET = "krug_collective"
jax.ffi.register_ffi_target(
    _TARGET, jax.ffi.pycapsule(ctypes.CDLL(_library).KrugJaxCollective), platform="cpu")

# Reduction ops: the core's names and values, the same for every binding.
_REDUCE_OPS = _reduce_ops.ReduceOps(_basics)
Average, Sum, Adasum, Min, Max, Product = _REDUCE_OPS.horovod_constants()

# krug::frontend::OpType (include/krug/frontend.h).
_ALLREDUCE, _ALLGATHER, _BROADCAST, _ALLTOALL, _REDUCESCATTER, _JOIN = 0, 1, 2, 3, 4, 6

global_process_set = _process_sets.global_process_set


try:  # a program being staged out for jax.jit, its tracers, and JAX's tracing context
    from jax._src.core import trace_ctx as _trace_ctx
    from jax._src.interpreters.partial_eval import DynamicJaxprTrace as _DynamicJaxprTrace
    from jax._src.interpreters.partial_eval import DynamicJaxprTracer as _DynamicJaxprTracer
except ImportError:  # pragma: no cover
    _trace_ctx, _DynamicJaxprTrace, _DynamicJaxprTracer = None, (), jax.core.Tracer

try:  # JAX's own test for a jit trace (not grad's); gone from a future JAX: the arrays say
    from jax._src.core import unsafe_am_i_under_a_jit as _under_jit
except ImportError:  # pragma: no cover
    def _under_jit():
        return False


def _traced(*arrays):
    """Whether the call is being traced for jax.jit (also with only closed-over arrays)."""
    return _under_jit() or any(isinstance(a, jax.core.Tracer) for a in arrays)


# Frames of these packages are not the user's call site.
_LIBRARY_MODULES = ("krug.", "jax.", "jaxlib.", "optax.", "flax.", "equinox.", "functools",
                    "contextlib")


def _call_site():
    """``file:line`` of the user's code that called into krug.jax (through JAX's and optax's
    frames), the same on every rank that runs the same script."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not (module + ".").startswith(_LIBRARY_MODULES):
            return "%s:%d" % (os.path.basename(frame.f_code.co_filename), frame.f_lineno)
        frame = frame.f_back
    return "unknown"


def _name(kind, name):
    """``name``, or one after the call site (``jax.allreduce@train.py:42``). A program runs its
    collectives one after another (_ProgramOrder), so the ops of one line may share its name; a
    name from the code rather than from a counter stays the same when a function is traced
    again (another shape, jax.eval_shape) on some ranks only, and stall reports point at the
    line."""
    if name is not None:
        return str(name)
    return "jax.%s@%s" % (kind, _call_site())


def _check_op(op):
    _REDUCE_OPS.check(op)


def raised(error):
    """The exception krug.jax raises for XLA's error from the custom call."""
    message = str(error)
    for prefix in ("INVALID_ARGUMENT: ", "INTERNAL: "):
        if message.startswith(prefix):
            message = message[len(prefix):]
            return (ValueError if prefix.startswith("INVALID") else HorovodInternalError)(message)
    return HorovodInternalError(message)


def _custom_call(results, attributes):
    """The custom call for these results and attributes (a tuple of (name, value) pairs)."""
    call = jax.ffi.ffi_call(_TARGET, [jax.ShapeDtypeStruct(shape, dtype)
                                      for shape, dtype in results], has_side_effect=True)
    kinds = dict(name=str, op=np.int64, reduce_op=np.int64, prescale=np.float64,
                 postscale=np.float64, root=np.int64, process_set=np.int64, grouped=np.int64,
                 after=np.int64)
    typed = {key: kinds[key](value) for key, value in attributes}
    return lambda *arrays: call(*arrays, **typed)


@functools.lru_cache(maxsize=4096)
def _compiled(results, attributes):
    # Eager calls go through one jitted function per signature: JAX's C++ dispatch then finds it
    # in a few microseconds, where an ffi_call dispatched as a primitive costs hundreds.
    return jax.jit(_custom_call(results, attributes))


class _ProgramOrder:
    """Runs the collectives of a traced program in the order the program called them, on every
    rank. XLA's CPU runtime runs a program's operations as their data allows, on a pool of
    threads, not in program order; two independent collectives could then start in one order
    on one rank and in the other on another, each rank waiting in a different one. So each
    collective takes the previous collective's result of the same program as one more operand,
    which the handler ignores: a data dependency XLA keeps (an optimization barrier does not
    survive compilation). JAX traces a custom_vjp's body as a program of its own, so the
    collectives' custom_vjp functions take that operand as an argument (``after``)."""

    # Programs remembered at once: the one traced and those it is nested in (custom_vjp bodies).
    _PROGRAMS = 16

    def __init__(self):
        # id(program) -> (program, its last collective's result). Held strongly: a result the
        # program discards (a gradient kept on the root only) dies with its last user, yet the
        # next collective must come after it. So the most recent programs only: a finished
        # program stays alive until 16 others have been traced.
        self._last = collections.OrderedDict()

    @staticmethod
    def _program():
        """The program being staged out for jax.jit where the call is traced (the innermost
        jit trace of JAX's tracing context, under grad's or vmap's); None eagerly."""
        trace = getattr(_trace_ctx, "trace", None)
        while trace is not None and not isinstance(trace, _DynamicJaxprTrace):
            trace = getattr(trace, "parent_trace", None)
        return trace

    @staticmethod
    def _staged(values):
        """The first leaf of ``values`` as the program holds it (under grad or vmap a leaf wraps
        it: ``primal``, ``val``), or None."""
        for leaf in jax.tree_util.tree_leaves(values):
            while isinstance(leaf, jax.core.Tracer):
                if isinstance(leaf, _DynamicJaxprTracer):
                    return leaf
                leaf = getattr(leaf, "primal", getattr(leaf, "val", None))
        return None

    def previous(self):
        """The last collective's result in the program being traced, or None."""
        program = self._program()
        entry = self._last.get(id(program)) if program is not None else None
        return entry[1] if entry is not None and entry[0] is program else None

    def record(self, results):
        """``results`` (a pytree) are the last collective's of the program being traced."""
        program = self._program()
        staged = self._staged(results)
        if program is not None and staged is not None and staged._trace is program:
            self._last[id(program)] = (program, staged)
            self._last.move_to_end(id(program))
            while len(self._last) > self._PROGRAMS:
                self._last.popitem(last=False)
        return results


_program_order = _ProgramOrder()


def forget_compiled():
    """Drops the eager calls' compiled functions (after an elastic reset)."""
    _compiled.cache_clear()


def _collective(op_type, arrays, results, name, traced, reduce_op=0, prescale=1.0, postscale=1.0,
                root=0, process_set=global_process_set, grouped=False, after=None):
    """The custom call's results; eagerly, waited for, with krug's errors raised. Traced, it
    comes after ``after`` (the previous collective's result), or after the previous collective
    of the program being traced (_ProgramOrder)."""
    check_initialized()
    results = tuple((tuple(r.shape), jnp.dtype(r.dtype).name) for r in results)
    attributes = (("name", name), ("op", op_type), ("reduce_op", int(reduce_op)),
                  ("prescale", float(prescale)), ("postscale", float(postscale)),
                  ("root", int(root)), ("process_set", _process_sets.set_id(process_set)),
                  ("grouped", int(grouped)))
    if traced:
        previous = after if after is not None else _program_order.previous()
        inputs = list(arrays) + ([previous] if previous is not None else [])
        call = _custom_call(results, attributes + (("after", int(previous is not None)),))
        return _program_order.record(call(*inputs))
    try:
        return jax.block_until_ready(_compiled(results, attributes + (("after", 0),))(*arrays))
    except jax.errors.JaxRuntimeError as e:
        raise raised(e) from None


def _primal_or_differentiable(fn, *args):
    """``fn`` (a jax.custom_vjp) itself when it may be differentiated or traced, else its
    primal function: eagerly the custom_vjp machinery costs more than the collective."""
    if _traced(*jax.tree_util.tree_leaves(args)):
        # The caller's program's previous collective goes in as ``after``: JAX traces a
        # custom_vjp's body as a program of its own.
        return _program_order.record(fn(*args, _program_order.previous()))
    return fn.fun(*args, None)


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
# are not arrays (name, op, process set) stay Python values, closed over; ``after`` is the
# previous collective's result in the caller's program, or None (_ProgramOrder).


def _reduce(tensors, name, op, prescale, postscale, process_set, after):
    traced = _traced(*tensors)
    grouped = len(tensors) > 1
    name = _name("grouped_allreduce" if grouped else "allreduce", name)
    return list(_collective(_ALLREDUCE, tensors, [_like(t) for t in tensors], name, traced,
                            reduce_op=op, prescale=prescale, postscale=postscale,
                            process_set=process_set, grouped=grouped, after=after))


def _allreduce_fn(name, op, prescale, postscale, process_set):
    @jax.custom_vjp
    def reduce(tensors, after):
        return _reduce(tensors, name, op, prescale, postscale, process_set, after)

    def forward(tensors, after):
        return reduce(tensors, after), None

    def backward(_, grads):
        # Horovod's rule: the same allreduce of the output's gradient. Integer and bool outputs
        # have none (JAX passes float0 zeros), which go back as they came.
        _REDUCE_OPS.check_differentiable("allreduce", op)
        grads = list(grads)
        floating = [i for i, g in enumerate(grads) if jnp.issubdtype(g.dtype, jnp.inexact)]
        if floating:
            fn = _allreduce_fn(None, op, prescale, postscale, process_set)
            reduced = _primal_or_differentiable(fn, [grads[i] for i in floating])
            for i, g in zip(floating, reduced):
                grads[i] = g
        return grads, None

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
    return _primal_or_differentiable(fn, [jnp.asarray(tensor)])[0]


def grouped_allreduce(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set):
    """allreduce of every tensor as one request: negotiated together, fused where they fit."""
    op = _reduction_op(op, average)
    tensors = [jnp.asarray(t) for t in tensors]
    if not tensors:
        return []
    fn = _allreduce_fn(name, op, float(prescale_factor), float(postscale_factor), process_set)
    return _primal_or_differentiable(fn, tensors)


def _gathered_ints(values, name, process_set):
    """Every rank's ``values`` (the same count on every rank), as a list per rank in set order:
    one small eager allgather called ``name`` (after the operation it serves, so ranks that
    name that one alike match here too)."""
    n = _set_size(process_set)
    out = _collective(_ALLGATHER, [jnp.asarray(values, dtype=jnp.int32)],
                      [jax.ShapeDtypeStruct((n * len(values),), jnp.int32)],
                      name, False, process_set=process_set)[0]
    flat = [int(v) for v in np.asarray(out)]
    return [flat[i * len(values):(i + 1) * len(values)] for i in range(n)]


def _set_rows(rows, process_set):
    """Each rank's share of ``rows`` rows in a reducescatter (the engine's rule: rank i of n
    gets rows // n, one more when i < rows % n)."""
    n = _set_size(process_set)
    return [rows // n + (1 if i < rows % n else 0) for i in range(n)]


def _allgather_fn(name, process_set, known_rows=None):
    rows_of = {}  # every rank's first dimension, found by the forward pass, for the backward

    @jax.custom_vjp
    def gather(tensor, after):
        if tensor.ndim == 0:
            raise ValueError("allgather needs a tensor of at least one dimension")
        traced = _traced(tensor)
        if known_rows is not None:
            rows = known_rows
        elif traced:
            rows = [tensor.shape[0]] * _set_size(process_set)
        else:
            rows = [r[0] for r in _gathered_ints([tensor.shape[0]],
                                                  _name("allgather", name) + ".rows",
                                                  process_set)]
        rows_of["rows"] = rows
        result = jax.ShapeDtypeStruct((sum(rows),) + tensor.shape[1:], tensor.dtype)
        return _collective(_ALLGATHER, [tensor], [result], _name("allgather", name), traced,
                           process_set=process_set, after=after)[0]

    def forward(tensor, after):
        return gather(tensor, after), None

    def backward(_, grad):
        # Horovod's rule: the gradient averaged over the ranks, this rank's rows.
        rows = rows_of["rows"]
        grad = allreduce(grad, op=Average, process_set=process_set)
        me = _set_rank(process_set)
        start = sum(rows[:me])
        return jax.lax.slice_in_dim(grad, start, start + rows[me], axis=0), None

    gather.defvjp(forward, backward)
    return gather


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order. Eagerly
    the first dimension may differ per rank; inside jax.jit it must not. Differentiable."""
    return _primal_or_differentiable(_allgather_fn(name, process_set), jnp.asarray(tensor))


def _broadcast_fn(root, name, process_set):
    index = _process_sets.root_index(root, process_set)

    @jax.custom_vjp
    def bcast(tensor, after):
        traced = _traced(tensor)
        return _collective(_BROADCAST, [tensor], [_like(tensor)], _name("broadcast", name),
                           traced, root=index, process_set=process_set, after=after)[0]

    def forward(tensor, after):
        return bcast(tensor, after), None

    def backward(_, grad):
        # Horovod's rule: the gradient averaged over the ranks, kept on the root.
        reduced = allreduce(grad, op=Average, process_set=process_set)
        return (reduced if _set_rank(process_set) == index else jnp.zeros_like(reduced)), None

    bcast.defvjp(forward, backward)
    return bcast


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """``tensor`` of ``root_rank`` (a global rank, a member of ``process_set``) on every rank.
    Differentiable: the gradient is averaged over the ranks and kept on the root."""
    return _primal_or_differentiable(_broadcast_fn(root_rank, name, process_set),
                                     jnp.asarray(tensor))


def _alltoall_fn(splits, name, process_set):
    agreed = {}  # the rows received from each rank, found by the forward pass, for the backward

    @jax.custom_vjp
    def exchange(tensor, after):
        traced = _traced(tensor)
        if traced:
            if splits is not None:
                raise ValueError("alltoall with splits works outside jax.jit only: the rows each "
                                 "rank receives decide the result's shape, which jit fixes when "
                                 "it traces")
            sent, received, rows = np.zeros([0], np.int32), None, tensor.shape[0]
        else:
            sent, received = _agreed_splits(tensor.shape[0], splits, name, process_set)
            rows = sum(received)
        agreed["received"] = received
        results = [jax.ShapeDtypeStruct((rows,) + tensor.shape[1:], tensor.dtype),
                   jax.ShapeDtypeStruct((_set_size(process_set),), jnp.int32)]
        return tuple(_collective(_ALLTOALL, [tensor, jnp.asarray(sent, jnp.int32)], results,
                                 name, traced, process_set=process_set, after=after))

    def forward(tensor, after):
        return exchange(tensor, after), None

    def backward(_, cotangents):
        # Horovod's rule: the gradient goes back the way the rows came, each rank returning to
        # every other the rows it received from it. The received counts have none (float0).
        grad, _ = cotangents
        return alltoall(grad, splits=agreed["received"], process_set=process_set)[0], None

    exchange.defvjp(forward, backward)
    return exchange


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends ``splits[r]`` rows of ``tensor`` to rank r of the set (None: an even split) and
    returns (the rows received, in rank order; how many came from each rank). Splits need the
    other ranks' answers first, so they work eagerly only; inside jax.jit the split is even and
    every rank passes the same shape. Differentiable: the gradient goes back the way the rows
    came."""
    tensor = jnp.asarray(tensor)
    if tensor.ndim == 0:
        raise ValueError("alltoall needs a tensor of at least one dimension")
    if splits is not None and (_under_jit() or _traced(splits)):
        raise ValueError("alltoall with splits works outside jax.jit only: the rows each rank "
                         "receives decide the result's shape, which jit fixes when it traces")
    fn = _alltoall_fn(splits, _name("alltoall", name), process_set)
    return _primal_or_differentiable(fn, tensor)


# What a rank's splits are, in the exchange: none (an even split), given, or of a wrong count.
_EVEN, _GIVEN, _WRONG_COUNT = 0, 1, 2


def _agreed_splits(rows, splits, name, process_set):
    """(this rank's splits, the rows each rank sends it), eagerly. Every rank learns every
    rank's splits (one small allgather) and checks them all with the core's rule, so a bad
    split raises the same ValueError on every rank instead of leaving the others waiting."""
    n = _set_size(process_set)
    mine = [0] * n if splits is None else [int(v) for v in np.asarray(splits).reshape(-1)]
    kind = _EVEN if splits is None else _GIVEN if len(mine) == n else _WRONG_COUNT
    if kind == _WRONG_COUNT:
        mine = [0] * n  # every rank reports it below
    everyone = _gathered_ints([rows, kind] + mine, name + ".splits", process_set)
    set_id = _process_sets.set_id(process_set)
    ranks = _basics.process_set_ranks(set_id)
    agreed = []
    for rank, (their_rows, their_kind, *theirs) in zip(ranks, everyone):
        if their_kind == _WRONG_COUNT:
            raise ValueError("alltoall: rank {} passed splits with a wrong number of entries "
                             "(one per rank of the set: {})".format(rank, n))
        if their_kind == _EVEN:
            if their_rows % n:
                raise ValueError("alltoall: rank {} has {} rows, which do not split evenly over "
                                 "{} ranks; pass splits".format(rank, their_rows, n))
            theirs = [their_rows // n] * n
        try:
            _basics.check_alltoall_splits(theirs, their_rows, set_id)
        except ValueError as e:
            raise ValueError("{} (rank {}'s splits)".format(e, rank)) from None
        agreed.append(theirs)
    me = ranks.index(_basics.rank())
    return agreed[me], [theirs[me] for theirs in agreed]


def _reducescatter_fn(name, op, prescale, postscale, process_set):
    n = _set_size(process_set)
    me = _set_rank(process_set)
    rows_of = {}  # the input's first dimension, for the backward pass

    @jax.custom_vjp
    def scatter(tensor, after):
        if tensor.ndim == 0:
            raise ValueError("reducescatter needs a tensor of at least one dimension")
        rows_of["rows"] = tensor.shape[0]
        traced = _traced(tensor)
        rows = _set_rows(tensor.shape[0], process_set)[me]
        result = jax.ShapeDtypeStruct((rows,) + tensor.shape[1:], tensor.dtype)
        return _collective(_REDUCESCATTER, [tensor], [result], _name("reducescatter", name),
                           traced, reduce_op=op, prescale=prescale, postscale=postscale,
                           process_set=process_set, after=after)[0]

    def forward(tensor, after):
        return scatter(tensor, after), None

    def backward(_, grad):
        # Horovod's rule (as krug.torch's): the allgather of the output's gradient times the
        # scale factors, and for Sum times the set's size. Each rank's share is known, so the
        # allgather needs no exchange and works under jit with uneven shares too.
        _REDUCE_OPS.check_differentiable("reducescatter", op)
        scale = prescale * postscale * (n if op == Sum else 1)
        gather = _allgather_fn(None, process_set, _set_rows(rows_of["rows"], process_set))
        grad = _primal_or_differentiable(gather, grad)
        return (grad * jnp.asarray(scale, grad.dtype) if scale != 1.0 else grad), None

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
    return _primal_or_differentiable(fn, jnp.asarray(tensor))


def join():
    """For a rank out of data: returns once every rank has joined, while the other ranks'
    allreduces go on with this rank contributing zeros. Returns the rank that joined last."""
    out = _collective(_JOIN, [], [jax.ShapeDtypeStruct((), jnp.int32)], "join", False)[0]
    return int(out)
