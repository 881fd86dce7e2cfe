"""Lifecycle, topology, process sets and barrier for the frontends that reach the core through
``krug.common._basics`` (krug.tensorflow, krug.keras, krug.jax): Horovod's ``hvd.init()``,
``hvd.rank()``, ... defined once. krug.torch has the same calls in its own compiled module."""

import atexit
import functools

from krug.common import elastic
from krug.common import process_sets as _process_sets
from krug.common.binding import load_basics
from krug.common.exceptions import HorovodInternalError
from krug.common.timeline import make_timeline_api

_basics = load_basics()
_process_sets.use_core(_basics)

global_process_set = _process_sets.global_process_set


def check_initialized():
    if not _basics.is_initialized():
        raise ValueError("krug has not been initialized; use hvd.init().")


_atexit = {"registered": False}


def init(comm=None, process_sets=None):
    """Initializes krug from the environment krugrun sets (a job of one without krugrun).

    comm: None or the list of every rank (MPI communicators are not supported).
    process_sets: ProcessSet objects to register now (every rank passes the same list), or
        "dynamic". Calling init() again while initialized does nothing."""
    if not _basics.is_initialized():
        _basics.init()
        if not _atexit["registered"]:
            # While the framework is still whole, not from a static destructor after Python.
            _atexit["registered"] = True
            atexit.register(shutdown)
    if comm is not None and list(comm) != list(range(_basics.size())):
        raise ValueError("init(comm=...) is not supported: krug always uses every rank of the "
                         "job; use process sets for subsets")
    _process_sets.on_init(_basics.size(), process_sets)


def shutdown():
    """Drains pending operations and stops krug; init() may follow."""
    try:
        _basics.shutdown()
    finally:  # krug is shut down even when Ctrl-C stopped the wait
        _process_sets.on_shutdown()


def is_initialized():
    return _basics.is_initialized()


start_timeline, stop_timeline = make_timeline_api(_basics)


def _topology(fn):
    def get():
        check_initialized()
        return fn()
    get.__name__ = fn.__name__
    get.__doc__ = "This rank's {} (Horovod's hvd.{}()).".format(fn.__name__.replace("_", " "),
                                                               fn.__name__)
    return get


size = _topology(_basics.size)
rank = _topology(_basics.rank)
local_size = _topology(_basics.local_size)
local_rank = _topology(_basics.local_rank)
cross_size = _topology(_basics.cross_size)
cross_rank = _topology(_basics.cross_rank)


def is_homogeneous():
    """Whether every host runs the same number of ranks."""
    check_initialized()
    return size() == local_size() * cross_size()


def mpi_threads_supported():
    check_initialized()
    return _basics.mpi_threads_supported()


def mpi_built():
    return _basics.mpi_built()


def mpi_enabled():
    return _basics.is_initialized() and _basics.cpu_operations() == "mpi"


def gloo_built():
    return True


def gloo_enabled():
    # Horovod's "Gloo mode": krug's own controller and CPU planes (Gloo, or shared memory
    # inside a host), that is, not MPI.
    return _basics.is_initialized() and _basics.cpu_operations() != "mpi"


def add_process_set(process_set):
    """Registers a process set on every rank (collective); returns the ProcessSet."""
    check_initialized()
    return _process_sets.add_process_set(process_set)


def remove_process_set(process_set):
    """Removes a registered process set on every rank (collective)."""
    check_initialized()
    return _process_sets.remove_process_set(process_set)


def barrier(process_set=global_process_set):
    """Returns once every rank of the set called it."""
    check_initialized()
    _basics.barrier(_process_sets.set_id(process_set))


# Elastic training (krug.common.elastic) over _basics: what krug.tensorflow.elastic and
# krug.jax.elastic both pass to the recovery loop and the states.


def elastic_state_bindings(broadcast_object):
    """The keyword arguments of krug.common.elastic's states, given the frontend's
    ``broadcast_object(obj, root_rank, name=...)``."""
    return dict(bcast_object=lambda obj: broadcast_object(obj, 0, name="krug.elastic.state"),
                get_rank=rank,
                host_update=_basics.elastic_host_update,
                elastic_enabled=_basics.elastic_enabled)


def _internal_error(e):
    return HorovodInternalError(str(e))


def elastic_run_fn(func, errors, convert=_internal_error, forget=None):
    """krug.common.elastic.run_fn around ``func``, the decorator ``hvd.elastic.run`` of a
    frontend: ``errors`` (a tuple of the framework's exception types), as which a failed krug
    operation reaches the training function, are raised as ``convert(e)``: a
    HorovodInternalError (the default, with ``e``'s message) recovers, any other exception
    (a refused argument, which would fail again) ends the run. A reset re-initializes krug and
    then calls ``forget()`` (a frontend's caches of the old job, if it has any)."""
    @functools.wraps(func)
    def converting(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except errors as e:
            raise convert(e) from e

    def reset():
        shutdown()
        init()
        if forget is not None:
            forget()

    return elastic.run_fn(converting, reset, elastic_round=_basics.elastic_round,
                          topology=lambda: (rank(), size()),
                          elastic_enabled=_basics.elastic_enabled)
