"""Averaging gradients across ranks: allreduce with compression and IndexedSlices, and the
gradient-reduction function that DistributedGradientTape and the DistributedOptimizers share."""

import tensorflow as tf

from krug.common.util import split_list
from krug.tensorflow.compression import Compression
from krug.tensorflow.mpi_ops import (Adasum, Average, Sum, _allreduce, _executing_eagerly,
                                     _grouped_allreduce, _grouped_reducescatter, _process_sets,
                                     _reducescatter, allgather,
                                     global_process_set, handle_average_backwards_compatibility,
                                     size_op)


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """The reduction of ``tensor`` over the ranks of ``process_set`` (Average by default).

    A ``tf.IndexedSlices`` is allgathered (values and indices; Average divides the values by
    the set's size) rather than densified; as in Horovod, only Average and Sum and no scale
    factors (NotImplementedError). ``compression`` applies to dense tensors."""
    op = handle_average_backwards_compatibility(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        if op == Adasum:
            raise NotImplementedError("Adasum does not support sparse tensors (IndexedSlices); "
                                      "use sparse_as_dense=True")
        if op not in (Average, Sum):
            raise NotImplementedError("IndexedSlices are reduced by allgather: only Average and "
                                      "Sum are defined for them")
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            # Horovod's rule (raised here, before any rank sends anything).
            raise NotImplementedError("Pre/postscale_factor are not supported with "
                                      "tf.IndexedSlices (got {}, {}); use sparse_as_dense=True "
                                      "or scale the values yourself"
                                      .format(prescale_factor, postscale_factor))
        values = allgather(tensor.values, name=None if name is None else name + ".values",
                           ignore_name_scope=ignore_name_scope, process_set=process_set)
        indices = allgather(tensor.indices, name=None if name is None else name + ".indices",
                            ignore_name_scope=ignore_name_scope, process_set=process_set)
        if op == Average:
            values = values / tf.cast(size_op(_process_sets.set_id(process_set)), values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    compressed, ctx = compression.compress(tensor)
    reduced = _allreduce(compressed, name=name, op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                         process_set=process_set)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set, name=None,
                      ignore_name_scope=False):
    """allreduce of every tensor; the dense ones as one request (negotiated and fused
    together), IndexedSlices each by allgather."""
    op = handle_average_backwards_compatibility(op, average)
    tensors = list(tensors)
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    out = list(tensors)
    for i, t in enumerate(tensors):
        if i not in dense:
            out[i] = allreduce(t, compression=compression, op=op, prescale_factor=prescale_factor,
                               postscale_factor=postscale_factor, process_set=process_set,
                               ignore_name_scope=ignore_name_scope)
    if dense:
        compressed = [compression.compress(tensors[i]) for i in dense]
        reduced = _grouped_allreduce([c for c, _ in compressed], name=name, op=op,
                                     prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor,
                                     ignore_name_scope=ignore_name_scope,
                                     process_set=process_set)
        for i, r, (_, ctx) in zip(dense, reduced, compressed):
            out[i] = compression.decompress(r, ctx)
    return out


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """The reduction of ``tensor`` over the ranks, of which this rank keeps its share of the
    first dimension (lower ranks get the extra rows). Differentiable for Sum and Average."""
    compressed, ctx = compression.compress(tensor)
    out = _reducescatter(compressed, name=name, op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                         process_set=process_set)
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0, name=None, ignore_name_scope=False):
    """reducescatter of every tensor, as one request."""
    compressed = [compression.compress(t) for t in tensors]
    out = _grouped_reducescatter([c for c, _ in compressed], name=name, op=op,
                                 prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor,
                                 ignore_name_scope=ignore_name_scope, process_set=process_set)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(out, compressed)]


def var_key(v):
    """A hashable identity of a variable: tf.Variable's ref(); Keras 3's variables have none
    (Horovod's Keras optimizer fails on TF 2.16 for this: 'Variable' object has no attribute
    'ref'), their identity is the object."""
    ref = getattr(v, "ref", None)
    return ref() if callable(ref) else ("id", id(v))


def check_groups(groups, num_groups=0):
    """Horovod's rules for groups= (and the deprecated num_groups=)."""
    if num_groups:
        import warnings
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed",
                      DeprecationWarning)
        if groups is None:
            groups = num_groups
    if groups is not None and not (isinstance(groups, list) or groups > 0):
        raise ValueError("groups should be a non-negative integer or a list of lists of "
                         "tf.Variable")
    return groups


def make_allreduce_grads_fn(name, compression, sparse_as_dense, op, gradient_predivide_factor,
                            groups, process_set):
    """A function (grads, variables) -> reduced grads (None stays None), as a tf.function when
    called eagerly: every allreduce is then a graph node, named after its gradient and run
    concurrently with the others (one round of negotiation for a whole step)."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Average:
        # The average's division moves to the postscale: sum(g / f) * f / size.
        prescale, postscale = 1.0 / gradient_predivide_factor, gradient_predivide_factor
    else:
        prescale = postscale = 1.0

    def plan(grads, variables):
        """Which gradients are reduced together: a tuple of index tuples (hashable, so that
        the tf.function below is traced once per plan)."""
        present = [i for i, g in enumerate(grads) if g is not None]
        if groups is None:
            return tuple((i,) for i in present)
        if isinstance(groups, list):
            member = {}
            for k, group in enumerate(groups):
                for v in group:
                    member[var_key(v)] = k
            buckets = {}
            for i in present:
                key = member.get(var_key(variables[i]), ("alone", i)) if variables else ("alone", i)
                buckets.setdefault(key, []).append(i)
            return tuple(tuple(b) for b in buckets.values())
        return tuple(tuple(g) for g in split_list(present, groups) if g)

    def reduce_grads(grads, index_groups):
        out = list(grads)
        with tf.name_scope(name + "_Allreduce"):
            for idx in index_groups:
                if groups is None:
                    i = idx[0]
                    out[i] = allreduce(grads[i], compression=compression, op=op,
                                       prescale_factor=prescale, postscale_factor=postscale,
                                       process_set=process_set)
                    continue
                reduced = grouped_allreduce([grads[i] for i in idx], compression=compression,
                                            op=op, prescale_factor=prescale,
                                            postscale_factor=postscale, process_set=process_set)
                for i, r in zip(idx, reduced):
                    out[i] = r
        return out

    compiled = tf.function(reduce_grads, autograph=False)

    def run(grads, variables=None):
        grads = list(grads)
        if not process_set.included():
            return grads  # Horovod's rule: a rank outside the set keeps its own gradients
        if sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
        index_groups = plan(grads, variables)
        if not index_groups:
            return grads
        if _executing_eagerly():
            return compiled(grads, index_groups)
        return reduce_grads(grads, index_groups)
    return run


__all__ = ["allreduce", "grouped_allreduce", "reducescatter", "grouped_reducescatter", "make_allreduce_grads_fn", "check_groups", "var_key",
           "Sum"]
