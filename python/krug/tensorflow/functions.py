"""Broadcasting variables and Python objects (Horovod's ``horovod.tensorflow.functions``), and
Horovod's TF1 helpers ``broadcast_global_variables`` and ``BroadcastGlobalVariablesHook``.

Every call works eagerly and in a ``tf.compat.v1`` graph. In a graph the variable helpers return
an op for the user's session to run; the object helpers build their ops in the session's graph
and run them through it (``session=``, else the default session), as Horovod does."""

import tensorflow as tf

from krug.common import objects as _objects
from krug.tensorflow.mpi_ops import allgather, broadcast, global_process_set, rank
from krug.tensorflow.util import _executing_eagerly

# One fixed name for every unnamed broadcast_object / allgather_object: non-root ranks that
# pass None must use the root's name (krug.torch does the same).
_OBJECT_NAME = "krug.object"


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=None):
    """Assigns ``root_rank``'s value to every variable (tf.Variable, Keras variables) on every
    rank. Eagerly it assigns and returns None; in a graph it returns the grouped assign op
    (a no-op for no variables)."""
    variables = list(variables)
    if _executing_eagerly():
        if variables:
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


def broadcast_global_variables(root_rank):
    """An op that assigns ``root_rank``'s value to every global variable of the default graph
    (``tf.compat.v1.global_variables()``) on every rank; run it in the session after the
    variables are initialized. TF1 graphs only: eagerly there is no collection of global
    variables, so it raises RuntimeError (use broadcast_variables)."""
    if _executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution: "
                           "there are no global variables. Use "
                           "hvd.broadcast_variables(<model/optimizer variables>) instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A SessionRunHook (``tf.compat.v1.train.MonitoredTrainingSession(hooks=[...])``) that
    broadcasts every global variable from ``root_rank`` once the session is created, so that
    every rank starts from the same initial or restored weights."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op = None
        self.device = device

    def begin(self):
        # A MonitoredSession may build a new graph for a restarted session: the op follows it.
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            with tf.device(self.device):
                self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)


# ---------------------------------------------------------------------------------------------
# Python objects: krug.common.objects' protocol over a pair of collectives (the lengths, then
# the bytes), run eagerly or as ops of a tf.compat.v1 graph.


def _eager_channel(collective, name):
    def run(suffix):
        return lambda array: collective(tf.constant(array), name + suffix).numpy()
    return run(".len"), run(".data")


class _GraphChannel:
    """The protocol's two collectives as ops of a graph, fed through placeholders: built once,
    then run through a session once per object (broadcast_object_fn reuses them)."""

    def __init__(self, collective, name, graph):
        with graph.as_default():
            self._length = tf.compat.v1.placeholder(tf.int64, [1], name=name + ".len_in")
            self._length_out = collective(self._length, name + ".len")
            self._bytes = tf.compat.v1.placeholder(tf.uint8, [None], name=name + ".data_in")
            self._bytes_out = collective(self._bytes, name + ".data")

    def bind(self, session):
        return (lambda array: session.run(self._length_out, {self._length: array}),
                lambda array: session.run(self._bytes_out, {self._bytes: array}))


def _check_not_traced(what):
    if tf.compat.v1.get_default_graph().building_function:
        raise RuntimeError("{} cannot run inside a tf.function: it pickles the object in Python. "
                           "Call it outside the function (eagerly), or in a tf.compat.v1 graph "
                           "with a session.".format(what))


def _session(session, what):
    session = session or tf.compat.v1.get_default_session()
    if session is None:
        raise RuntimeError("{} in graph mode runs its ops through a session: pass session=, or "
                           "call it inside `with session.as_default():`.".format(what))
    return session


def _channel(collective, name, session, what):
    """(send_length, send_bytes) for krug.common.objects: eager ops, or new ops of the
    session's graph run through that session."""
    if _executing_eagerly():
        return _eager_channel(collective, name)
    _check_not_traced(what)
    session = _session(session, what)
    return _GraphChannel(collective, name, session.graph).bind(session)


def _broadcaster(root_rank, process_set):
    return lambda tensor, name: broadcast(tensor, root_rank, name=name,
                                          process_set=process_set)


def _gatherer(process_set):
    return lambda tensor, name: allgather(tensor, name=name, process_set=process_set)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Returns ``root_rank``'s ``obj`` (any picklable object) on every rank. In a
    tf.compat.v1 graph its ops run through ``session`` (default: the default session). An object
    the root cannot pickle raises ValueError on every rank."""
    send_length, send_bytes = _channel(_broadcaster(root_rank, process_set),
                                       name or _OBJECT_NAME, session, "broadcast_object")
    return _objects.broadcast_object(obj, root_rank, rank() == root_rank, send_length,
                                     send_bytes)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function ``fn(obj)`` that broadcasts ``obj`` from ``root_rank``. Made in a
    tf.compat.v1 graph, it builds its ops once, in the default graph (or ``session``'s), and
    runs them through ``session`` (default: the default session when called), so that repeated
    calls do not grow the graph."""
    name = name or _OBJECT_NAME + ".fn"
    if _executing_eagerly():
        return lambda obj: broadcast_object(obj, root_rank, None, name, process_set)
    _check_not_traced("broadcast_object_fn")
    graph = session.graph if session is not None else tf.compat.v1.get_default_graph()
    channel = _GraphChannel(_broadcaster(root_rank, process_set), name, graph)
    session = session or tf.compat.v1.get_default_session()

    def broadcast_one(obj):
        send_length, send_bytes = channel.bind(_session(session, "broadcast_object_fn"))
        return _objects.broadcast_object(obj, root_rank, rank() == root_rank, send_length,
                                         send_bytes)
    return broadcast_one


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Returns the list of every rank's ``obj`` (any picklable object), in rank order. In a
    tf.compat.v1 graph its ops run through ``session`` (default: the default session). An
    object some rank cannot pickle raises ValueError on every rank."""
    send_lengths, send_bytes = _channel(_gatherer(process_set), name or _OBJECT_NAME + ".gather",
                                        session, "allgather_object")
    return _objects.allgather_object(obj, process_set.ranks, send_lengths, send_bytes)


__all__ = ["broadcast_variables", "broadcast_object", "broadcast_object_fn", "allgather_object",
           "broadcast_global_variables", "BroadcastGlobalVariablesHook"]
