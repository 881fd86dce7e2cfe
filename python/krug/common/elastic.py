"""Elastic training, independent of the framework (Horovod's ``horovod.common.elastic``).

An elastic job keeps training while workers fail, join or leave. The training function
commits its state at consistent points; when a collective fails it rolls back to the last
commit, when the hosts change it stops at the commit; either way krug is re-initialized
with the new set of workers and the state is synchronized from rank 0 before training goes
on. Frameworks build on this module: ``krug.torch.elastic`` gives ``run`` and ``TorchState``.

The pieces:

- :class:`State`: what ``commit()`` saves and a failure restores. Subclasses say how to
  save, restore and sync (copy from rank 0) their values.
- :class:`ObjectState`: a State of plain Python values, kept as attributes.
- :func:`run_fn`: the recovery loop around a training function.
- :func:`call_worker`: how a cluster engine's task (Spark, Ray) runs an elastic worker.
"""

import copy
import functools
import sys

from krug.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt, WorkerRemoved


def log(message, rank=None):
    """Writes one ``krug.elastic:`` line to stderr (where krugrun prefixes it with the
    worker); ``rank`` is added when known."""
    prefix = "krug.elastic: " if rank is None else "krug.elastic: rank %s: " % rank
    print(prefix + message, file=sys.stderr, flush=True)


class State:
    """The state of an elastic training function: saved by :meth:`commit`, put back by
    :meth:`restore` after a failure, copied from rank 0 by :meth:`sync` after a reset.

    bcast_object: ``bcast_object(obj)`` returns rank 0's ``obj`` on every rank.
    get_rank: returns this process's rank.
    host_update: called on rank 0 only; asks the elastic driver whether the hosts changed
        since this round began and returns ``(changed, only_removed)``. None: never.
    elastic_enabled: whether the process runs under an elastic driver; without one,
        :meth:`check_host_updates` does nothing (and costs no collective). Default: whether
        ``host_update`` was given.

    ``commits`` counts the calls of :meth:`commit`; it is part of the saved state, so a
    restore rolls it back with everything else. Subclasses implement :meth:`save`,
    :meth:`restore` and :meth:`sync` for their own values and call the base versions, which
    handle ``commits``.
    """

    def __init__(self, bcast_object, get_rank, host_update=None, elastic_enabled=None):
        self._bcast_object = bcast_object
        self._get_rank = get_rank
        self._host_update = host_update
        if elastic_enabled is None:
            elastic_enabled = (lambda: host_update is not None)
        self._elastic_enabled = elastic_enabled
        self._reset_callbacks = []
        self.commits = 0
        self._saved_commits = 0

    def register_reset_callbacks(self, callbacks):
        """Adds functions called (without arguments, in order) after every reset, once krug
        runs with the new set of workers: e.g. to scale the learning rate with ``size()``."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        """Called by the recovery loop after each reset; runs the reset callbacks."""
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state, then raises :class:`HostsUpdatedInterrupt` if the hosts changed.

        Call it on every rank at the same step (the host check is collective). A failure
        later rolls back to the last commit, so the work since then is redone: commit often
        enough to bound that, rarely enough that saving does not dominate."""
        self.commits += 1
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises :class:`HostsUpdatedInterrupt` on every rank when the elastic driver reports
        changed hosts. Rank 0 asks, and its answer is broadcast, so that all ranks stop at the
        same step; ``skip_sync`` is set when hosts were only removed."""
        if not self._elastic_enabled():
            return
        update = self._host_update() if self._get_rank() == 0 else None
        changed, only_removed = self._bcast_object(update)
        if changed:
            raise HostsUpdatedInterrupt(skip_sync=bool(only_removed))

    def save(self):
        """Saves the current state in memory (the base saves ``commits``)."""
        self._saved_commits = self.commits

    def restore(self):
        """Returns to the last saved state (the base restores ``commits``)."""
        self.commits = self._saved_commits

    def sync(self):
        """Makes every rank's state rank 0's (the base syncs ``commits``); collective.
        Subclasses save the synced state afterwards, so a failure before the next commit
        rolls back to it."""
        self.commits = self._bcast_object(self.commits)


class ObjectState(State):
    """A State of plain Python values, given as keyword arguments and kept as attributes:

        state = ObjectState(bcast_object, get_rank, epoch=0, batch=0)
        state.epoch += 1
        state.commit()

    Values are saved by deep copy, so they may be mutable (lists, dicts); they must be
    picklable to be synced from rank 0."""

    def __init__(self, bcast_object, get_rank, host_update=None, elastic_enabled=None,
                 **kwargs):
        super().__init__(bcast_object, get_rank, host_update=host_update,
                         elastic_enabled=elastic_enabled)
        self._value_names = list(kwargs)
        self._saved_values = {}
        for name, value in kwargs.items():
            setattr(self, name, value)
        ObjectState.save(self)

    def _values(self):
        return {name: getattr(self, name) for name in self._value_names}

    def save(self):
        self._saved_values = copy.deepcopy(self._values())
        super().save()

    def restore(self):
        for name, value in copy.deepcopy(self._saved_values).items():
            setattr(self, name, value)
        super().restore()

    def sync(self):
        if self._value_names:
            for name, value in self._bcast_object(self._values()).items():
                setattr(self, name, value)
        super().sync()
        ObjectState.save(self)


def _first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _call_or_none(fn):
    # Topology is only for log lines: a broken or shut-down krug must not hide the real error.
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None


# The recovery loop of the C++ and LibTorch APIs is krug::elastic::run (src/api/elastic.cc); this
# one follows the same policy (a policy change goes into both). Python does not drive the C++
# loop because the loop is steered by Python exceptions raised by Python code (the training
# function, the state's save/restore/sync), which would cross into C++ and back on every
# recovery, and because krug.common has no compiled module of its own: docs/architecture.md,
# "Elastic recovery: two loops, on purpose".

# Rounds that break while they form (a worker dies during init), one after another, before the
# loop gives up; krugrun's --elastic-timeout and --reset-limit bound them too (kInitAttempts in
# src/api/elastic.cc).
_INIT_ATTEMPTS = 5


def _reset_until_a_round_forms(reset, before):
    for attempt in range(1, _INIT_ATTEMPTS + 1):
        try:
            reset()
            return
        except HorovodInternalError as e:
            if attempt == _INIT_ATTEMPTS:
                raise
            log("joining the new round failed: %s; trying the next round" % _first_line(e),
                rank=before and before[0])


def run_fn(func, reset, elastic_round=None, topology=None, elastic_enabled=None):
    """Wraps ``func(state, *args, **kwargs)`` in the elastic recovery loop.

    reset: shuts krug down and initializes it again (blocking until the driver forms the
        next round); raises :class:`WorkerRemoved` when this worker is no longer in the job.
    elastic_round: returns ``(round, has_new_workers)`` for the current round; when new
        workers joined, the state is synced even after an interrupt that allowed skipping
        it (the new workers sync in any case, and every rank must take part).
    topology: returns ``(rank, size)``, for the log lines.
    elastic_enabled: returns whether an elastic driver runs this process; when it returns
        False, failures propagate (there is no driver to form a new round).

    The loop: sync the state from rank 0 and call ``func``. On
    :class:`HorovodInternalError` restore the last commit; on
    :class:`HostsUpdatedInterrupt` keep the state (skipping the next sync when the
    interrupt says so); then ``reset()``, ``state.on_reset()`` and go again. Returns what
    ``func`` returns. A removed worker logs one line and exits with status 0.
    """
    if elastic_round is None:
        elastic_round = (lambda: (0, False))
    if topology is None:
        topology = (lambda: None)
    if elastic_enabled is None:
        elastic_enabled = (lambda: True)

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        before = None
        try:
            while True:
                try:
                    if not skip_sync:
                        state.sync()
                    before = _call_or_none(topology) or before
                    return func(state, *args, **kwargs)
                except HorovodInternalError as e:
                    if not elastic_enabled():
                        raise
                    state.restore()
                    log("HorovodInternalError: %s; rolling back to commit %d"
                        % (_first_line(e), state.commits), rank=before and before[0])
                    skip_sync = False
                except HostsUpdatedInterrupt as e:
                    if not elastic_enabled():
                        raise
                    log("hosts changed%s; keeping commit %d"
                        % (" (only removed)" if e.skip_sync else "", state.commits),
                        rank=before and before[0])
                    skip_sync = e.skip_sync
                _reset_until_a_round_forms(reset, before)
                round_, has_new_workers = elastic_round()
                if has_new_workers:
                    # New workers have no state: they sync first thing, so everyone must.
                    skip_sync = False
                now = _call_or_none(topology)
                log("round %d: now rank %s of %s (was rank %s of %s)%s"
                    % (round_, *(now or ("?", "?")), *(before or ("?", "?")),
                       "" if skip_sync else "; syncing state from rank 0"))
                state.on_reset()
        except WorkerRemoved as e:
            log("removed from the job by the elastic driver (%s); exiting with status 0"
                % _first_line(e), rank=before and before[0])
            sys.exit(0)

    return wrapper


def call_worker(fn, args, kwargs):
    """Calls ``fn(*args, **kwargs)`` in an elastic worker that a cluster engine's task runs.
    Returns ``(True, value)``, or ``(False, None)`` when the job no longer needs this worker:
    ``elastic.run`` exited with status 0, or ``init()`` raised :class:`WorkerRemoved` before
    ``elastic.run`` could catch it (the job finished while the worker was starting, as with
    a task that Spark retries late). Neither is a failure. Other exits and errors propagate."""
    try:
        return True, fn(*args, **kwargs)
    except WorkerRemoved:
        return False, None
    except SystemExit as e:
        if e.code in (0, None):
            return False, None
        raise


__all__ = ["State", "ObjectState", "run_fn", "call_worker", "log"]
