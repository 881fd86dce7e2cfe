"""Whole parameter trees and Python objects: what a JAX training script broadcasts and averages
(Horovod's ``broadcast_parameters``, ``broadcast_object`` and ``allgather_object``), and the
averaging of gradient trees."""

import jax
import jax.numpy as jnp
import numpy as np

from krug.common import objects as _objects
from krug.common.lifecycle import rank
from krug.jax.compression import Compression
from krug.jax.ops import Average, allgather, broadcast, global_process_set, grouped_allreduce

# One fixed name for every unnamed broadcast_object / allgather_object: non-root ranks that
# pass None must use the root's name (krug.torch's and krug.tensorflow's rule).
_OBJECT_NAME = "krug.object"


def _on_the_wire(value):
    """(a JAX array krug broadcasts bit for bit, the function that turns the broadcast one back
    into ``value``'s kind), or None for a numpy array JAX cannot hold as it is (64-bit values
    without jax_enable_x64), which travels pickled."""
    if isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(value)
        wire, back = _on_the_wire(jax.random.key_data(value))
        return wire, lambda x: jax.random.wrap_key_data(back(x), impl=impl)
    array = jnp.asarray(value)
    from_numpy = not isinstance(value, jax.Array)
    if from_numpy and array.dtype != np.asarray(value).dtype:
        return None
    if from_numpy:
        return array, np.asarray
    return array, lambda x: x


def broadcast_parameters(params, root_rank=0, process_set=global_process_set):
    """``root_rank``'s values of every array of the pytree ``params`` (model parameters, an
    optimizer's state, PRNG keys), as a pytree of the same structure on every rank, each leaf
    of its kind (numpy arrays stay numpy arrays of their dtype). Call it once after
    initialization so that every rank starts from the same model. The broadcasts run in one
    compiled program, named after their paths in the tree."""
    leaves, tree = jax.tree_util.tree_flatten_with_path(params)
    if not leaves:
        return params
    wired = [_on_the_wire(v) for _, v in leaves]
    arrays = [(path, w) for (path, _), w in zip(leaves, wired) if w is not None]

    @jax.jit
    def run(values):
        return [broadcast(v, root_rank, name="broadcast_parameters" +
                          jax.tree_util.keystr(path), process_set=process_set)
                for (path, _), v in zip(arrays, values)]

    sent = iter(back(x) for (_, (_, back)), x in zip(arrays, run([w for _, (w, _) in arrays])))
    pickled = iter(broadcast_object([v for (_, v), w in zip(leaves, wired) if w is None],
                                    root_rank, name="broadcast_parameters.numpy",
                                    process_set=process_set)
                   if any(w is None for w in wired) else [])
    return jax.tree_util.tree_unflatten(
        tree, [next(pickled) if w is None else next(sent) for w in wired])


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


def _room(n):
    # Eager calls compile a program per shape: payloads rounded up to a power of two reuse a few
    # (bench/jax_objects.py: new sizes at 0.25-0.28 of the time of exact ones).
    return max(64, 1 << (n - 1).bit_length()) if n > 0 else 0


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns ``root_rank``'s ``obj`` (any picklable object) on every rank. Not inside jit.
    An object the root cannot pickle raises ValueError on every rank."""
    name = name or _OBJECT_NAME

    def broadcast_array(array, suffix):
        return broadcast(_int32(array), root_rank, name=name + suffix, process_set=process_set)

    return _objects.broadcast_object(obj, root_rank, rank() == root_rank,
                                     lambda a: broadcast_array(a, ".len"),
                                     lambda a: broadcast_array(a, ".data"),
                                     max_bytes=_MAX_OBJECT_BYTES, room=_room)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's ``obj`` (any picklable object), in rank order. Not
    inside jit. An object some rank cannot pickle raises ValueError on every rank."""
    name = name or _OBJECT_NAME + ".gather"

    def allgather_array(array, suffix):
        return allgather(_int32(array), name=name + suffix, process_set=process_set)

    return _objects.allgather_object(obj, process_set.ranks,
                                     lambda a: allgather_array(a, ".len"),
                                     lambda a: allgather_array(a, ".data"),
                                     max_bytes=_MAX_OBJECT_BYTES, room=_room)
