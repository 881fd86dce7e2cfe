"""Whole parameter trees and Python objects: what a JAX training script broadcasts and averages
(Horovod's ``broadcast_parameters``, ``broadcast_object`` and ``allgather_object``), and the fp16
wire compression."""

import jax
import jax.numpy as jnp
import numpy as np

from krug.common import objects as _objects
from krug.common.lifecycle import rank
from krug.jax.ops import Average, allgather, broadcast, global_process_set, grouped_allreduce

# One fixed name for every unnamed broadcast_object / allgather_object: non-root ranks that
# pass None must use the root's name (krug.torch's and krug.tensorflow's rule).
_OBJECT_NAME = "krug.object"


class Compression:
    """``compression=`` of allreduce_gradients and DistributedOptimizer: ``none`` sends arrays
    as they are; ``fp16`` sends floating-point arrays as float16 and restores their dtype."""

    class none:
        @staticmethod
        def compress(x):
            return x, None

        @staticmethod
        def decompress(x, dtype):
            return x

    class fp16:
        @staticmethod
        def compress(x):
            if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != jnp.float16:
                return x.astype(jnp.float16), x.dtype
            return x, None

        @staticmethod
        def decompress(x, dtype):
            return x if dtype is None else x.astype(dtype)


def broadcast_parameters(params, root_rank=0, process_set=global_process_set):
    """``root_rank``'s values of every array of the pytree ``params`` (model parameters, an
    optimizer's state), as a pytree of the same structure on every rank. Call it once after
    initialization so that every rank starts from the same model. The broadcasts run in one
    compiled program, named after their paths in the tree."""
    leaves, tree = jax.tree_util.tree_flatten_with_path(params)
    if not leaves:
        return params

    @jax.jit
    def run(values):
        return [broadcast(v, root_rank, name="broadcast_parameters" +
                          jax.tree_util.keystr(path), process_set=process_set)
                for (path, _), v in zip(leaves, values)]

    return jax.tree_util.tree_unflatten(tree, run([jnp.asarray(v) for _, v in leaves]))


def allreduce_gradients(grads, op=Average, compression=Compression.none, name=None,
                        process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Every array of the pytree ``grads`` reduced over the ranks (default: averaged), as one
    grouped request, so small gradients are fused. Usable eagerly and inside jax.jit."""
    leaves, tree = jax.tree_util.tree_flatten(grads)
    if not leaves:
        return grads
    packed = [compression.compress(jnp.asarray(g)) for g in leaves]
    reduced = grouped_allreduce([x for x, _ in packed], op=op, name=name,
                                prescale_factor=prescale_factor,
                                postscale_factor=postscale_factor, process_set=process_set)
    return jax.tree_util.tree_unflatten(
        tree, [compression.decompress(x, dtype) for x, (_, dtype) in zip(reduced, packed)])


# JAX makes 32-bit integers unless jax_enable_x64 is set: lengths are int32.
_MAX_OBJECT_BYTES = int(np.iinfo(np.int32).max)


def _int32(array):
    return array.astype(np.int32) if array.dtype == np.int64 else array


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns ``root_rank``'s ``obj`` (any picklable object) on every rank. Not inside jit.
    An object the root cannot pickle raises ValueError on every rank."""
    name = name or _OBJECT_NAME

    def broadcast_array(array, suffix):
        return broadcast(_int32(array), root_rank, name=name + suffix, process_set=process_set)

    return _objects.broadcast_object(obj, root_rank, rank() == root_rank,
                                     lambda a: broadcast_array(a, ".len"),
                                     lambda a: broadcast_array(a, ".data"),
                                     max_bytes=_MAX_OBJECT_BYTES)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's ``obj`` (any picklable object), in rank order. Not
    inside jit. An object some rank cannot pickle raises ValueError on every rank."""
    name = name or _OBJECT_NAME + ".gather"

    def allgather_array(array, suffix):
        return allgather(_int32(array), name=name + suffix, process_set=process_set)

    return _objects.allgather_object(obj, process_set.ranks,
                                     lambda a: allgather_array(a, ".len"),
                                     lambda a: allgather_array(a, ".data"),
                                     max_bytes=_MAX_OBJECT_BYTES)
