"""Elastic training's framework-neutral parts, with Horovod's ``horovod.common.elastic`` names:
the State a training function commits, and the loop that recovers it (docs/elastic.md).

A State is committed at consistent points (every rank at the same step). When a peer fails,
``run_fn``'s wrapper rolls every survivor back to its last commit, re-initializes krug (a new
rendezvous round with a new rank layout), copies rank 0's state to every rank and calls the
training function again. Rank 0 of the new round is the lowest surviving rank, so it always
holds committed state; workers that joined in the round receive it by broadcast.
"""
import copy
import functools
import sys

from krug.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt, WorkerRemoved


# Rounds that break while they form, one after another, before the loop gives up.
_INIT_ATTEMPTS = 5


def _say(line):
    sys.stderr.write("krug.elastic: %s\n" % line)
    sys.stderr.flush()


def _first_line(error):
    text = str(error)
    return text.splitlines()[0] if text else type(error).__name__


class State:
    """Training state that survives failures. Subclasses implement save(), restore() and sync().

    ``bcast_object(obj, root_rank)`` and ``get_rank()`` are the framework's; ``host_update()``
    asks krugrun whether hosts changed, as ``(changed, only_removed)`` (rank 0 only calls it)."""

    def __init__(self, bcast_object, get_rank, host_update):
        self._bcast_object = bcast_object
        self._get_rank = get_rank
        self._host_update = host_update
        self._reset_callbacks = []
        self.commits = 0
        self._saved_commits = 0

    def register_reset_callbacks(self, callbacks):
        """Functions called with no arguments after every reset (a new round), e.g. to scale the
        learning rate by the new ``size()``."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state, then checks for host changes. Call it on every rank at the same
        step: a failure later rolls back to here."""
        self.commits += 1
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank at once when krugrun changed the set of
        hosts. Collective: rank 0 asks and broadcasts the answer, so no rank leaves the step
        alone (the others would wait for it in their next collective)."""
        verdict = self._host_update() if self._get_rank() == 0 else None
        changed, only_removed = self._bcast_object(verdict, 0)
        if changed:
            raise HostsUpdatedInterrupt(skip_sync=only_removed)

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    # The commit count follows the state: a rollback returns to the commit it names.
    def _save_commits(self):
        self._saved_commits = self.commits

    def _restore_commits(self):
        self.commits = self._saved_commits


class ObjectState(State):
    """Plain Python values as attributes (``state.epoch``, ``state.batch`` ...): saved by deep
    copy, restored from it, synced from rank 0 by broadcast."""

    def __init__(self, bcast_object, get_rank, host_update, **kwargs):
        self._saved_state = dict(kwargs)
        self._object_names = list(kwargs)
        super().__init__(bcast_object, get_rank, host_update)
        for name, value in kwargs.items():
            setattr(self, name, value)

    def save(self):
        self._saved_state = {name: copy.deepcopy(getattr(self, name)) for name in self._object_names}
        self._save_commits()

    def restore(self):
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))
        self._restore_commits()

    def sync(self):
        if self._object_names:
            values = self._bcast_object({name: getattr(self, name) for name in self._object_names}, 0)
            for name, value in values.items():
                setattr(self, name, value)
        self.save()


def run_fn(func, reset, get_rank, get_size, round_info):
    """Wraps ``func(state, *args, **kwargs)`` in the elastic loop.

    ``reset()`` shuts krug down and initializes it again (joining the next round);
    ``round_info()`` gives ``(round, has_new_workers)`` of the current round."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                _, has_new_workers = round_info()
                # New workers have no state: whatever the survivors could skip, all ranks sync.
                if not skip_sync or has_new_workers:
                    state.sync()
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as e:
                _say("rank %d: hosts changed; re-forming the job at commit %d"
                     % (get_rank(), state.commits))
                skip_sync = e.skip_sync
            except HorovodInternalError as e:
                rank = _rank_or_unknown(get_rank)
                state.restore()
                _say("rank %s: HorovodInternalError: %s; rolling back to commit %d"
                     % (rank, _first_line(e), state.commits))
                skip_sync = False
            old = (_rank_or_unknown(get_rank), _rank_or_unknown(get_size))
            # A round can break while it forms (a worker dies during init): join the next one.
            # krugrun's --elastic-timeout and --reset-limit bound how often.
            for attempt in range(1, _INIT_ATTEMPTS + 1):
                try:
                    reset()
                    break
                except WorkerRemoved as e:
                    _say(str(e))
                    sys.exit(0)
                except HorovodInternalError as e:
                    if attempt == _INIT_ATTEMPTS:
                        raise
                    _say("worker (was rank %s): joining the new round failed: %s; trying the "
                         "next round" % (old[0], _first_line(e)))
            rnd, _ = round_info()
            _say("round %d: now rank %d of %d (was rank %s of %s)"
                 % (rnd, get_rank(), get_size(), old[0], old[1]))
            state.on_reset()

    return wrapper


def _rank_or_unknown(get):
    try:
        return get()
    except Exception:  # noqa: BLE001 -- only for a log line; krug may be shut down already
        return "?"
