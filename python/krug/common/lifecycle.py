"""Lifecycle, topology, build flags, process sets and barrier of every Python frontend
(krug.torch, krug.tensorflow, krug.keras, krug.jax): Horovod's ``hvd.init()``, ``hvd.rank()``,
... defined once.

A frontend binds this module to its compiled core with :func:`use_core` (the torch module, or
``krug.common._basics``: both define the same calls, src/frameworks/python/basics.h). All
frontends of a process share one engine, so the first core bound answers for every frontend,
as the process sets do (krug.common.process_sets)."""

import atexit
import functools
import threading

from krug.common import elastic
from krug.common import process_sets as _process_sets
from krug.common.exceptions import HorovodInternalError
from krug.common.timeline import make_timeline_api

_lock = threading.Lock()
_state = {"core": None, "atexit": False}
_forgetters = []  # what frontends drop at shutdown() (krug.torch's handle table)

global_process_set = _process_sets.global_process_set


def use_core(core, on_shutdown=None):
    """Makes ``core`` answer for the lifecycle and the process sets (the first frontend
    imported binds it); ``on_shutdown()``, if given, runs after every shutdown()."""
    with _lock:
        if _state["core"] is None:
            _state["core"] = core
        if on_shutdown is not None:
            _forgetters.append(on_shutdown)
    _process_sets.use_core(core)


class _BoundCore:
    """The bound core's calls, looked up when they are made (a frontend binds it after
    importing this module)."""

    def __getattr__(self, name):
        core = _state["core"]
        if core is None:
            raise RuntimeError("krug.common.lifecycle: no frontend has bound its core; import "
                               "krug.torch, krug.tensorflow or krug.jax")
        return getattr(core, name)


_core = _BoundCore()


def check_initialized():
    if not _core.is_initialized():
        raise ValueError("krug has not been initialized; use hvd.init().")


def init(comm=None, process_sets=None):
    """Initializes krug from the environment krugrun sets (a job of one without krugrun).

    comm: not supported (MPI communicators; krug always uses every rank of the job): must be
        None or the list of every rank.
    process_sets: ProcessSet objects to register now (every rank passes the same list), or
        "dynamic" (accepted for compatibility: sets can always be added later).
    Calling init() again while initialized does nothing."""
    if not _core.is_initialized():
        _core.init()
        with _lock:
            register, _state["atexit"] = not _state["atexit"], True
        if register:
            # Shut down while the interpreter (and the framework) are still whole, rather than
            # from a static destructor after Python has finalized.
            atexit.register(shutdown)
    if comm is not None and list(comm) != list(range(_core.size())):
        raise ValueError("init(comm=...) is not supported: krug always uses every rank of the "
                         "job; use process sets for subsets")
    _process_sets.on_init(_core.size(), process_sets)


def shutdown():
    """Drains pending operations and stops krug; init() may follow. Operations that other
    ranks never submitted fail."""
    # The core first: it completes every pending operation, so what the frontends drop below
    # never waits for one. krug is shut down even when the core raises (Ctrl-C stops its wait),
    # so the cleanup always follows.
    try:
        _core.shutdown()
    finally:
        _process_sets.on_shutdown()
        for forget in list(_forgetters):
            forget()


def is_initialized():
    return _core.is_initialized()


start_timeline, stop_timeline = make_timeline_api(_core)


def _topology(name, doc):
    def get():
        check_initialized()
        return getattr(_core, name)()
    get.__name__ = name
    get.__doc__ = doc
    return get


size = _topology("size", "Number of ranks in the job.")
rank = _topology("rank", "This process's rank, 0 .. size()-1.")
local_size = _topology("local_size", "Number of ranks on this host.")
local_rank = _topology("local_rank", "This process's rank among the ranks of its host.")
cross_size = _topology("cross_size", "Number of hosts.")
cross_rank = _topology("cross_rank", "Index of this process's host.")


def is_homogeneous():
    """Whether every host runs the same number of ranks."""
    check_initialized()
    return size() == local_size() * cross_size()


def mpi_threads_supported():
    """Whether MPI runs with MPI_THREAD_MULTIPLE (the program may then make its own MPI calls,
    e.g. with mpi4py, from any thread). As Horovod's, a ValueError where krug does not run on
    MPI: ask mpi_enabled() first."""
    check_initialized()
    if not mpi_enabled():
        raise ValueError("mpi_threads_supported(): krug runs on {} here, not on MPI; start the "
                         "job with mpirun or krugrun --mpi for MPI, or ask hvd.mpi_enabled() "
                         "first".format(_core.cpu_operations()))
    return _core.mpi_threads_supported()


def mpi_enabled():
    """Whether the data plane is MPI (the job was started by mpirun or krugrun --mpi)."""
    return _core.is_initialized() and _core.cpu_operations() == "mpi"


def mpi_built():
    """Whether this krug was built with the MPI backend."""
    return _core.mpi_built()


def gloo_enabled():
    """Whether krug runs in Horovod's "Gloo mode": its own controller and CPU planes (Gloo, or
    shared memory inside a host), not MPI."""
    return _core.is_initialized() and _core.cpu_operations() != "mpi"


def gloo_built():
    return True


def nccl_built():
    """The version of NCCL this krug's data plane for CUDA tensors was built against, as
    Horovod's ``hvd.nccl_built()`` gives it: nccl.h's NCCL_VERSION_CODE (22809 for 2.28.9),
    or 0 when krug was built without NCCL."""
    return _core.nccl_version_code()


def cuda_built():
    """Whether this krug takes CUDA tensors (built with the CUDA toolkit)."""
    return _core.cuda_built()


def _false():
    return False


# Horovod's other planes and devices, which krug does not have.
ddl_built = ccl_built = rocm_built = _false


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of global ranks) on every rank.

    Collective: every rank must call it with the same ranks, in the same order relative to
    other add/remove calls. Returns the registered ProcessSet."""
    check_initialized()
    return _process_sets.add_process_set(process_set)


def remove_process_set(process_set):
    """Removes a registered process set on every rank (collective). Returns True if it was
    removed; the global process set cannot be removed."""
    check_initialized()
    return _process_sets.remove_process_set(process_set)


def barrier(process_set=global_process_set):
    """Returns once every rank of ``process_set`` has called barrier()."""
    check_initialized()
    _core.barrier(_process_sets.set_id(process_set))


# Elastic training (krug.common.elastic) over the core: what krug.tensorflow.elastic and
# krug.jax.elastic both pass to the recovery loop and the states.


def elastic_state_bindings(broadcast_object):
    """The keyword arguments of krug.common.elastic's states, given the frontend's
    ``broadcast_object(obj, root_rank, name=...)``."""
    return dict(bcast_object=lambda obj: broadcast_object(obj, 0, name="krug.elastic.state"),
                get_rank=rank,
                host_update=_core.elastic_host_update,
                elastic_enabled=_core.elastic_enabled)


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

    return elastic.run_fn(converting, reset, elastic_round=_core.elastic_round,
                          topology=lambda: (rank(), size()),
                          elastic_enabled=_core.elastic_enabled)
