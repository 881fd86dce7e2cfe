"""Process sets, shared by every Python frontend (Horovod's ``horovod.common.process_sets``).

krug.common.lifecycle.use_core binds the module to a frontend's compiled core (any object with
``rank``, ``process_set_ranks``, ``add_process_set`` and ``remove_process_set``: the torch
module, or ``krug.common._basics``). All frontends of a process share one engine, so they share
these sets too: a set registered through ``krug.torch`` is usable from ``krug.tensorflow``.
"""

import threading

_state = {"core": None}
_lock = threading.Lock()
_registered = []  # sets registered since init() (invalidated by shutdown())


def use_core(core):
    """Makes `core` answer for the sets (the first frontend imported binds it)."""
    with _lock:
        if _state["core"] is None:
            _state["core"] = core


def _core():
    return _state["core"]


class ProcessSet:
    """A subset of ranks that runs collectives among themselves.

    Create it with a list of global ranks and register it with ``add_process_set`` (or
    ``init(process_sets=[...])``); every rank must register the same sets in the same order.
    ``process_set_id`` is None until registered."""

    def __init__(self, ranks_or_comm):
        if isinstance(ranks_or_comm, ProcessSet):
            ranks_or_comm = ranks_or_comm.ranks
        if hasattr(ranks_or_comm, "Get_size"):
            raise ValueError("ProcessSet takes the ranks (any iterable of ints); MPI "
                             "communicators are not supported (krug runs on Gloo)")
        try:
            self.ranks = sorted(int(r) for r in ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet takes the ranks (any iterable of ints), got {!r}"
                             .format(ranks_or_comm)) from None
        self.process_set_id = None
        self.mpi_comm = None

    def _invalidate(self):
        self.process_set_id = None

    def size(self):
        """Number of ranks in the set, or None when it is not registered."""
        if self.process_set_id is None:
            return None
        return len(_core().process_set_ranks(self.process_set_id))

    def rank(self):
        """This process's rank within the set (-1 when not a member), or None when the set
        is not registered."""
        if self.process_set_id is None:
            return None
        ranks = _core().process_set_ranks(self.process_set_id)
        me = _core().rank()
        return ranks.index(me) if me in ranks else -1

    def included(self):
        """Whether this process is a member (of the ranks given, for a set not registered yet:
        Horovod's answer, so that code guarded by it reaches the set's "not registered" error
        instead of skipping its collectives)."""
        if self.process_set_id is None:
            return _core().rank() in self.ranks
        return _core().rank() in _core().process_set_ranks(self.process_set_id)

    def __str__(self):
        return "ProcessSet(process_set_id={}, ranks={})".format(self.process_set_id, self.ranks)

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def set_id(process_set):
    """The id of a registered set; ValueError for anything else."""
    if not isinstance(process_set, ProcessSet):
        raise ValueError("process_set must be a krug ProcessSet, got {!r}".format(process_set))
    if process_set.process_set_id is None:
        raise ValueError("{} is not registered: call hvd.add_process_set() on every rank "
                         "first".format(process_set))
    return process_set.process_set_id


def _check_new_ranks(ranks):
    """Horovod's ValueErrors for a set that cannot be added: repeated or out-of-range ranks, or
    the ranks of a set registered already (the global set included)."""
    everyone = list(_core().process_set_ranks(0))
    if len(set(ranks)) != len(ranks):
        raise ValueError("process set {} repeats a rank".format(ranks))
    outside = [r for r in ranks if r not in everyone]
    if outside or not ranks:
        raise ValueError("process set {}: ranks must be among 0..{} and at least one"
                         .format(ranks, len(everyone) - 1))
    with _lock:
        taken = [everyone] + [p.ranks for p in _registered if p.process_set_id is not None]
    if ranks in taken:
        raise ValueError("Attempted to add a duplicate process set: {}".format(ranks))


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of global ranks) on every rank.

    Collective: every rank must call it with the same ranks, in the same order relative to
    other add/remove calls. Returns the registered ProcessSet."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError("{} is already registered".format(process_set))
    _check_new_ranks(process_set.ranks)
    process_set.process_set_id = _core().add_process_set(process_set.ranks)
    with _lock:
        _registered.append(process_set)
    return process_set


def remove_process_set(process_set):
    """Removes a registered process set on every rank (collective). Returns True if it was
    removed; the global process set cannot be removed."""
    if process_set is global_process_set or process_set.process_set_id in (None, 0):
        return False
    _core().remove_process_set(process_set.process_set_id)
    with _lock:
        if process_set in _registered:
            _registered.remove(process_set)
    process_set._invalidate()
    return True


def on_init(size, process_sets):
    """After init(): the global set spans `size` ranks; `process_sets` (a list, "dynamic" or
    None) are registered."""
    global_process_set.process_set_id = 0
    global_process_set.ranks = list(range(size))
    if process_sets is not None and process_sets != "dynamic":
        for ps in process_sets:
            if ps.process_set_id is None:
                add_process_set(ps)


def on_shutdown():
    """After shutdown(): every registered set is forgotten."""
    with _lock:
        for ps in _registered:
            ps._invalidate()
        _registered.clear()


def root_index(root_rank, process_set):
    """The position of ``root_rank`` (a global rank, as in Horovod) within ``process_set``: the
    core numbers roots within their set."""
    root_rank = int(root_rank)
    if process_set is global_process_set and 0 <= root_rank < len(global_process_set.ranks):
        return root_rank
    try:
        return process_set.ranks.index(root_rank)
    except ValueError:
        raise ValueError("root_rank {} is not a member of {}: with process_set=, root_rank is a "
                         "global rank of one of the set's members".format(root_rank,
                                                                         process_set)) from None
