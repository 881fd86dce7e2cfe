"""Horovod's ``horovod.tensorflow.util``: the small helpers that krug.tensorflow, krug.keras and
scripts ported from Horovod import (``from horovod.tensorflow.util import _executing_eagerly``).

Every name of Horovod 0.28.1's module is here, and ``_has_eager`` of its older releases."""

import tensorflow as tf
from tensorflow.python.eager import context  # noqa: F401 (Horovod's module exports it)

# Horovod kept this for TensorFlow before 1.7; every TensorFlow krug supports runs eagerly.
_has_eager = True


def _executing_eagerly():
    """Whether ops run eagerly here: False inside a tf.function and in a tf.compat.v1 graph."""
    return context.executing_eagerly()


def _make_subgraph(f):
    """``f`` as a tf.function: called eagerly, its ops run as one graph (concurrently)."""
    return tf.function(f)


def _cache(f):
    """``f`` memoized on its positional arguments and on whether it is called eagerly, so that a
    factory returns one function per mode (an eager tf.function, a graph-building one). The
    arguments must be hashable; keyword arguments are not accepted, as in Horovod."""
    results = {}

    def cached(*args):
        key = (args, _executing_eagerly())
        if key not in results:
            results[key] = f(*args)
        return results[key]
    return cached


def vars_to_refs(variables):
    """A hashable stand-in for a variable or a (nested) list of them: tuples of ``v.ref()``,
    for use as a key of ``_cache``. A variable without ``ref()`` (Keras 3's) stands for itself:
    it is hashable by identity."""
    if isinstance(variables, list):
        return tuple(vars_to_refs(v) for v in variables)
    ref = getattr(variables, "ref", None)
    return ref() if callable(ref) else variables


def refs_to_vars(refs):
    """The inverse of vars_to_refs: tuples become lists again, refs their variables."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    deref = getattr(refs, "deref", None)
    return deref() if callable(deref) else refs


__all__ = ["_executing_eagerly", "_make_subgraph", "_cache", "_has_eager", "vars_to_refs",
           "refs_to_vars"]
