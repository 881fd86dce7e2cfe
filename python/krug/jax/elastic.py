"""Elastic training with JAX: workers come and go, a failure costs no committed work.

    state = hvd.elastic.JaxState(params=params, opt_state=opt_state, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...                 # train, replacing state.params / state.opt_state, and
                            # state.commit() at consistent points

A failed collective inside a jitted step raises ``jax.errors.JaxRuntimeError``; ``run`` turns
it into HorovodInternalError (an argument krug refused into ValueError, which is not retried),
which the recovery loop of krug.common.elastic handles: roll back to the last commit, re-form
the job, sync rank 0's state. A reset also drops JAX's compiled programs, which fixed the old
job's rank, size and shapes when they were traced.
"""

import jax
import numpy as np

from krug.common import elastic as common
from krug.common import lifecycle
from krug.common.exceptions import WorkerRemoved
from krug.jax import ops
from krug.jax.functions import broadcast_object, broadcast_parameters


def _forget_old_job():
    # Programs traced for the old job baked in its rank and size (hvd.size() in a learning
    # rate, reducescatter's share, allgather's result): they are traced again.
    jax.clear_caches()
    ops.forget_compiled()


def _bindings():
    return lifecycle.elastic_state_bindings(broadcast_object)


def run(func):
    """Decorator: runs ``func(state, ...)`` in the elastic recovery loop (see
    krug.common.elastic.run_fn). A failed krug collective in a jitted program (a lost peer, a
    stopped engine) surfaces as jax.errors.JaxRuntimeError and recovers; one krug refused (an
    argument that can never work) is raised as ValueError, as it is eagerly, and ends the run
    rather than failing again after every reset."""
    return lifecycle.elastic_run_fn(func, (jax.errors.JaxRuntimeError,), convert=ops.raised,
                                    forget=_forget_old_job)


class ObjectState(common.ObjectState):
    """Plain Python values as attributes, committed, restored and synced from rank 0."""

    def __init__(self, **kwargs):
        super().__init__(**_bindings(), **kwargs)


def _array_tree(value):
    """Whether ``value`` is a pytree of arrays (parameters, an optimizer's state)."""
    leaves = jax.tree_util.tree_leaves(value)
    return bool(leaves) and all(isinstance(leaf, (jax.Array, np.ndarray)) for leaf in leaves)


class JaxState(common.ObjectState):
    """Pytrees of arrays (parameters, optimizer state) and plain values, as attributes:
    ``commit()`` copies them, ``restore()`` puts the copy back, ``sync()`` gives every rank
    rank 0's. Which values are trees of arrays is rank 0's call; those are broadcast as arrays
    (one compiled program for all), the others as Python objects. A worker that joins builds
    its state with the same code, so its trees of arrays have rank 0's structure and shapes
    (plain values, such as a list that grows, need not)."""

    def __init__(self, **kwargs):
        super().__init__(**_bindings(), **kwargs)

    def sync(self):
        values = self._values()
        array_names = sorted(name for name, value in values.items() if _array_tree(value))
        plain = {name: value for name, value in values.items() if name not in array_names}
        array_names, plain = self._bcast_object((array_names, plain))
        arrays = broadcast_parameters({name: values[name] for name in array_names},
                                      root_rank=0)
        for name, value in list(plain.items()) + list(arrays.items()):
            setattr(self, name, value)
        common.State.sync(self)
        common.ObjectState.save(self)


__all__ = ["run", "ObjectState", "JaxState", "WorkerRemoved"]
