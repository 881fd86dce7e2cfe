"""``hvd.start_timeline`` and ``hvd.stop_timeline``, one definition for every frontend
(krug.torch, krug.tensorflow, krug.keras): Horovod's API over the core's
``krug::start_timeline`` / ``krug::stop_timeline`` (include/krug/krug.h, docs/timeline.md)."""

import json
import os


def make_timeline_api(core):
    """``(start_timeline, stop_timeline)`` over ``core``, a frontend's compiled module."""

    def start_timeline(file_path, mark_cycles=False):
        """Starts writing krug's timeline to ``file_path``: a Chrome trace (chrome://tracing,
        ui.perfetto.dev) of every tensor's negotiation, queue and collective phases, with a
        CYCLE_START marker per negotiation round when ``mark_cycles``.

        Only rank 0 writes the file (it sees when every rank was ready); on the other ranks the
        call does nothing, and ranks need not call it together. A timeline already running
        (``KRUG_TIMELINE`` / ``HOROVOD_TIMELINE``, or an earlier call) is closed first as a
        complete file, unless it writes ``file_path``: that one goes on, as in Horovod.

        Raises ``ValueError`` if krug is not initialized, or if ``file_path`` cannot be created
        (the message names the path and the reason)."""
        if not core.is_initialized():
            raise ValueError("krug has not been initialized; use hvd.init().")
        core.start_timeline(os.fspath(file_path), bool(mark_cycles))

    def stop_timeline():
        """Stops the timeline and closes its file as a complete JSON array; does nothing when
        none runs. Raises ``ValueError`` if krug is not initialized."""
        if not core.is_initialized():
            raise ValueError("krug has not been initialized; use hvd.init().")
        core.stop_timeline()

    return start_timeline, stop_timeline


def timeline_events(path):
    """The phases a timeline file recorded, in file order, as ``(row, event)`` pairs: a row is
    a tensor's name or ``cycles``, an event Chrome's dict (``name``, ``ph``: ``B`` for a
    phase's begin, ``i`` for a marker; ``ts`` in microseconds). Raises
    ``json.JSONDecodeError`` unless the file is a complete trace, as it is once the timeline has
    stopped."""
    with open(path) as f:
        events = json.load(f)
    rows = {e["pid"]: e["args"]["name"] for e in events
            if e["ph"] == "M" and e["name"] == "process_name"}
    return [(rows[e["pid"]], e) for e in events if e["ph"] in ("B", "i")]


def read_timeline(path):
    """What a timeline file recorded, for checks in scripts and tests: ``{row: names}``, where a
    row is a tensor (its phases: ``NEGOTIATE_ALLREDUCE``, ``QUEUE``, ``ALLREDUCE``, ...) or
    ``cycles`` (``CYCLE_START``). Raises ``json.JSONDecodeError`` unless the file is a complete
    trace, as it is once the timeline has stopped."""
    names = {}
    for row, e in timeline_events(path):
        names.setdefault(row, set()).add(e["name"])
    return names


__all__ = ["make_timeline_api", "read_timeline", "timeline_events"]
