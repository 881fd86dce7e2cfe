"""krug's TensorFlow ops with Horovod's ``horovod.tensorflow.mpi_ops`` API: lifecycle and
topology, the collectives as TensorFlow ops (eager and inside ``tf.function``) and their
registered gradients.

Ranks match operations by name. Inside a graph an unnamed op is named after the tensor it
reduces (``KrugAllreduce_<tensor name>``), so every rank that builds the same graph uses the
same names; in eager mode ops run one after another and share their op's name.
"""

import re

import tensorflow as tf
from tensorflow.python.framework import ops as _tf_ops

from krug.common import lifecycle as _lifecycle
from krug.common import process_sets as _process_sets
from krug.common import reduce_ops as _reduce_ops
from krug.common.binding import load_tensorflow_ops
from krug.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from krug.common.lifecycle import (  # noqa: F401 (krug.tensorflow's API)
    init, shutdown, is_initialized, start_timeline, stop_timeline, size, rank, local_size,
    local_rank, cross_size, cross_rank, is_homogeneous, mpi_threads_supported, mpi_built,
    mpi_enabled, gloo_built, gloo_enabled, nccl_built, ddl_built, ccl_built, cuda_built,
    rocm_built, add_process_set, remove_process_set, barrier)
from krug.common.util import num_rank_is_power_2 as check_num_rank_power_of_2  # noqa: F401
from krug.tensorflow.util import _executing_eagerly

_basics, _ops = load_tensorflow_ops()
_lifecycle.use_core(_basics)

# Reduction ops: the core's names and values, the same for every binding.
_REDUCE_OPS = _reduce_ops.ReduceOps(_basics)
Average, Sum, Adasum, Min, Max, Product = _REDUCE_OPS.horovod_constants()

ProcessSet = _process_sets.ProcessSet
global_process_set = _process_sets.global_process_set


# ---------------------------------------------------------------------------------------------
# Lifecycle and topology: krug.common.lifecycle's, shared with the other frontends.


def _check_has_gpu():
    """krug's TensorFlow ops have CPU kernels only (krug.common.util.gpu_available asks this)."""
    return False


# Topology as ops: read when the graph runs, not when it was traced (elastic jobs).
def size_op(process_set_id=0, name=None):
    return _ops.krug_size(process_set_id=process_set_id, name=name)


def rank_op(process_set_id=0, name=None):
    return _ops.krug_rank(process_set_id=process_set_id, name=name)


def local_size_op(name=None):
    return _ops.krug_local_size(name=name)


def local_rank_op(name=None):
    return _ops.krug_local_rank(name=name)


def process_set_included_op(process_set_id=0, name=None):
    return _ops.krug_process_set_included(process_set_id=process_set_id, name=name)


# ---------------------------------------------------------------------------------------------
# Names


def _normalize_name(name):
    """A tensor name as an op name: what TensorFlow refuses becomes '_'."""
    return re.sub("[^a-zA-Z0-9_]", "_", name)


def _op_name(kind, tensor, name):
    if name is None and not _executing_eagerly():
        return "%s_%s" % (kind, _normalize_name(tensor.name))
    return name


def _check_op(op):
    _REDUCE_OPS.check(op)


def handle_average_backwards_compatibility(op, average):
    """Resolves Horovod's deprecated ``average=`` argument into ``op``."""
    return _reduce_ops.handle_average_backwards_compatibility(op, average, Average, Sum)


# ---------------------------------------------------------------------------------------------
# The raw ops (no compression, no IndexedSlices): what the gradients and the helpers use.


def _reduction(kind, raw_op, default_op):
    """One of the reducing ops (``kind``: KrugAllreduce, KrugReducescatter and their grouped
    forms) as a function of ``inputs``: a tensor, or a list of them for a grouped op. Unnamed
    inside a graph, the op is named after its (first) tensor."""

    def reduce(inputs, name=None, op=default_op, prescale_factor=1.0, postscale_factor=1.0,
               ignore_name_scope=False, process_set=global_process_set):
        _check_op(op)
        grouped = isinstance(inputs, (list, tuple))
        if grouped and not inputs:
            return []
        return raw_op(inputs, name=_op_name(kind, inputs[0] if grouped else inputs, name),
                      reduce_op=op, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                      process_set_id=_process_sets.set_id(process_set))

    reduce.__name__ = "_" + kind[len("Krug"):].lower()
    return reduce


_allreduce = _reduction("KrugAllreduce", _ops.krug_allreduce, Sum)
_grouped_allreduce = _reduction("KrugGroupedAllreduce", _ops.krug_grouped_allreduce, Sum)
_reducescatter = _reduction("KrugReducescatter", _ops.krug_reducescatter, Average)
_grouped_reducescatter = _reduction("KrugGroupedReducescatter",
                                    _ops.krug_grouped_reducescatter, Average)


def _same_reduction(op):
    """The arguments of the reducing op ``op`` as _allreduce takes them: its gradient reduces
    the same way."""
    return dict(op=op.get_attr("reduce_op"), prescale_factor=op.get_attr("prescale_factor"),
                postscale_factor=op.get_attr("postscale_factor"),
                ignore_name_scope=op.get_attr("ignore_name_scope"),
                process_set=_set_of(op.get_attr("process_set_id")))


@_tf_ops.RegisterGradient("KrugAllreduce")
def _allreduce_grad(op, grad):
    """The gradient of allreduce: allreduce of the output's gradient with the same op."""
    return _allreduce(grad, **_same_reduction(op))


@_tf_ops.RegisterGradient("KrugGroupedAllreduce")
def _grouped_allreduce_grad(op, *grads):
    return _grouped_allreduce(list(grads), **_same_reduction(op))


def _set_of(process_set_id):
    """The registered ProcessSet with this id (for gradients, which see only the op's attrs)."""
    if process_set_id == 0:
        return global_process_set
    for ps in _process_sets._registered:
        if ps.process_set_id == process_set_id:
            return ps
    raise ValueError("process set {} is not registered any more".format(process_set_id))


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Every rank's ``tensor`` concatenated along the first dimension (which may differ per
    rank). Differentiable."""
    return _ops.krug_allgather(tensor, name=_op_name("KrugAllgather", tensor, name),
                               ignore_name_scope=ignore_name_scope,
                               process_set_id=_process_sets.set_id(process_set))


def grouped_allgather(tensors, name=None, ignore_name_scope=False,
                      process_set=global_process_set):
    """allgather of every tensor, as one request."""
    if not tensors:
        return []
    name = _op_name("KrugGroupedAllgather", tensors[0], name)
    return _ops.krug_grouped_allgather(tensors, name=name, ignore_name_scope=ignore_name_scope,
                                       process_set_id=_process_sets.set_id(process_set))


def _allgather_grad_one(x, grad, ignore_name_scope, process_set):
    # Horovod's rule: the gradient averaged over the ranks, this rank's rows.
    grad = _allreduce(grad, op=Average, ignore_name_scope=ignore_name_scope,
                      process_set=process_set)
    rows = tf.reshape(tf.shape(x, out_type=tf.int64)[0], [1])
    all_rows = allgather(rows, ignore_name_scope=ignore_name_scope, process_set=process_set)
    me = rank_op(process_set.process_set_id)
    offset = tf.reduce_sum(all_rows[:me])
    return tf.slice(grad, tf.concat([[offset], tf.zeros([tf.rank(grad) - 1], tf.int64)], 0),
                    tf.concat([rows, tf.fill([tf.rank(grad) - 1], tf.constant(-1, tf.int64))],
                              0))


@_tf_ops.RegisterGradient("KrugAllgather")
def _allgather_grad(op, grad):
    ps = _set_of(op.get_attr("process_set_id"))
    return _allgather_grad_one(op.inputs[0], grad, op.get_attr("ignore_name_scope"), ps)


@_tf_ops.RegisterGradient("KrugGroupedAllgather")
def _grouped_allgather_grad(op, *grads):
    ps = _set_of(op.get_attr("process_set_id"))
    return [_allgather_grad_one(x, g, op.get_attr("ignore_name_scope"), ps)
            for x, g in zip(op.inputs, grads)]


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """``tensor`` of ``root_rank`` (a global rank, a member of ``process_set``) on every rank.
    Differentiable: the gradient is averaged over the ranks and kept on the root."""
    root = _process_sets.root_index(root_rank, process_set)
    return _ops.krug_broadcast(tensor, name=_op_name("KrugBroadcast", tensor, name),
                               root_rank=root, ignore_name_scope=ignore_name_scope,
                               process_set_id=_process_sets.set_id(process_set))


@_tf_ops.RegisterGradient("KrugBroadcast")
def _broadcast_grad(op, grad):
    ps = _set_of(op.get_attr("process_set_id"))
    reduced = _allreduce(grad, op=Average, ignore_name_scope=op.get_attr("ignore_name_scope"),
                         process_set=ps)
    is_root = tf.equal(rank_op(ps.process_set_id), op.get_attr("root_rank"))
    return tf.where(is_root, reduced, tf.zeros_like(reduced))


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """Sends ``splits[r]`` rows to rank r of the set (None: an even split). Returns the rows
    received and, when ``splits`` is given, how many came from each rank: ``(rows, received)``,
    as Horovod does."""
    given = splits is not None
    if not given:
        splits = tf.zeros([0], dtype=tf.int32)
    else:
        splits = tf.cast(tf.convert_to_tensor(splits), tf.int32)
    rows, received = _ops.krug_alltoall(tensor, splits,
                                        name=_op_name("KrugAlltoall", tensor, name),
                                        ignore_name_scope=ignore_name_scope,
                                        process_set_id=_process_sets.set_id(process_set))
    return (rows, received) if given else rows


@_tf_ops.RegisterGradient("KrugAlltoall")
def _alltoall_grad(op, grad_output, grad_received_splits):
    # The gradient goes back to the ranks it came from, with the received splits.
    grad, _ = alltoall(grad_output, splits=op.outputs[1],
                       ignore_name_scope=op.get_attr("ignore_name_scope"),
                       process_set=_set_of(op.get_attr("process_set_id")))
    return [grad, None]


def _reducescatter_grad_one(grad, op, ignore_name_scope, process_set):
    # Horovod's rule (as krug.torch): the allgather of the output's gradient times the scale
    # factors, and for Sum times the set's size.
    reduce_op = op.get_attr("reduce_op")
    _REDUCE_OPS.check_differentiable("reducescatter", reduce_op)
    scale = op.get_attr("prescale_factor") * op.get_attr("postscale_factor")
    grad = allgather(grad, ignore_name_scope=ignore_name_scope, process_set=process_set)
    if reduce_op == Sum:
        return grad * tf.cast(scale * tf.cast(size_op(process_set.process_set_id), tf.float64),
                              grad.dtype)
    return grad * tf.cast(scale, grad.dtype) if scale != 1.0 else grad


@_tf_ops.RegisterGradient("KrugReducescatter")
def _reducescatter_grad(op, grad):
    return _reducescatter_grad_one(grad, op, op.get_attr("ignore_name_scope"),
                                   _set_of(op.get_attr("process_set_id")))


@_tf_ops.RegisterGradient("KrugGroupedReducescatter")
def _grouped_reducescatter_grad(op, *grads):
    ps = _set_of(op.get_attr("process_set_id"))
    return [_reducescatter_grad_one(g, op, op.get_attr("ignore_name_scope"), ps) for g in grads]


def join():
    """For a rank out of data: returns once every rank joined; the others' allreduces proceed
    with this rank contributing zeros. Returns the rank that joined last."""
    return _ops.krug_join()
