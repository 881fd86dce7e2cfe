"""Broadcasting variables and Python objects (Horovod's ``horovod.tensorflow.functions``)."""

import tensorflow as tf

from krug.common import objects as _objects
from krug.tensorflow.mpi_ops import (_executing_eagerly, allgather, broadcast,
                                     global_process_set, rank)

# One fixed name for every unnamed broadcast_object / allgather_object: non-root ranks that
# pass None must use the root's name (krug.torch does the same).
_OBJECT_NAME = "krug.object"


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=None):
    """Assigns ``root_rank``'s value to every variable (tf.Variable, Keras variables) on every
    rank. Returns the grouped assign op (None in eager mode)."""
    variables = list(variables)
    if not variables:
        return None
    if _executing_eagerly():
        _broadcast_group(variables, root_rank, process_set)
        return None
    return tf.group(*[v.assign(broadcast(tf.convert_to_tensor(v), root_rank,
                                         process_set=process_set, name="KrugBroadcast_%d" % i))
                      for i, v in enumerate(variables)])


def _broadcast_group(variables, root_rank, process_set):
    # Eager: one tf.function per call, so that every broadcast is a named node and they run
    # concurrently rather than one round trip each.
    @tf.function(autograph=False)
    def run(values):
        return [broadcast(x, root_rank, process_set=process_set, name="KrugBroadcast_%d" % i)
                for i, x in enumerate(values)]
    values = run([tf.convert_to_tensor(v) for v in variables])
    for v, x in zip(variables, values):
        v.assign(x)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Returns ``root_rank``'s ``obj`` (any picklable object) on every rank. Eager mode only.
    An object the root cannot pickle raises ValueError on every rank."""
    name = name or _OBJECT_NAME

    def broadcast_array(array, suffix):
        return broadcast(tf.constant(array), root_rank, name=name + suffix,
                         process_set=process_set).numpy()

    return _objects.broadcast_object(obj, root_rank, rank() == root_rank,
                                     lambda a: broadcast_array(a, ".len"),
                                     lambda a: broadcast_array(a, ".data"))


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function that broadcasts its argument from ``root_rank`` (Horovod's helper)."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Returns the list of every rank's ``obj`` (any picklable object), in rank order. An object
    some rank cannot pickle raises ValueError on every rank."""
    name = name or _OBJECT_NAME + ".gather"

    def allgather_array(array, suffix):
        return allgather(tf.constant(array), name=name + suffix,
                         process_set=process_set).numpy()

    return _objects.allgather_object(obj, process_set.ranks,
                                     lambda a: allgather_array(a, ".len"),
                                     lambda a: allgather_array(a, ".data"))


__all__ = ["broadcast_variables", "broadcast_object", "broadcast_object_fn", "allgather_object"]
