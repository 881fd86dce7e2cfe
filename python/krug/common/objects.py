"""``broadcast_object`` and ``allgather_object`` for every frontend: Python objects pickled into
uint8 arrays, sent with the frontend's own broadcast and allgather, whose lengths go first so
that receivers can make room.

Objects are pickled with cloudpickle where it is installed (as Horovod does: lambdas and
classes defined in a function travel too), else with pickle. A rank that cannot pickle its
object (or whose object is too large for the frontend) sends a length of -1 instead, so every
rank raises the same ValueError rather than the others waiting for data that never comes."""

import pickle

import numpy as np

try:
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - cloudpickle comes with the project's environment
    _pickler = pickle

_UNPICKLABLE = -1


def _dumps(obj, max_bytes):
    """(obj pickled as a uint8 array, None), or (None, why it cannot be sent)."""
    try:
        data = _pickler.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # what pickling raises depends on the object: any failure counts
        return None, e
    if max_bytes is not None and len(data) > max_bytes:
        return None, ValueError("it pickles to {} bytes, more than the {} this frontend can "
                                "send".format(len(data), max_bytes))
    return np.frombuffer(data, dtype=np.uint8), None


def _unpicklable(what, ranks, error):
    reason = ": {}: {}".format(type(error).__name__, error) if error is not None else ""
    return ValueError("{}: rank(s) {} could not send the object{}; pass a picklable object "
                      "(plain data, arrays, classes defined at module level)"
                      .format(what, ", ".join(str(r) for r in ranks), reason))


def _exact(n):
    return n


def _padded(data, size):
    """``data`` (a uint8 array) followed by zeros up to ``size`` bytes."""
    if len(data) == size:
        return data
    out = np.zeros([size], np.uint8)
    out[:len(data)] = data
    return out


def broadcast_object(obj, root_rank, is_root, broadcast_length, broadcast_bytes, max_bytes=None,
                     room=_exact):
    """``obj`` as passed on the root, on every rank. The frontend's side:
    ``broadcast_length(int64 array of 1) -> array`` and ``broadcast_bytes(uint8 array) -> array``,
    each a broadcast from the root; non-root ranks pass arrays of the right size. ``max_bytes``:
    the most the frontend can send in one array; ``room(n)``: the bytes sent for n bytes of
    payload (a frontend that compiles a program per shape rounds up, zeros filling the rest)."""
    data, error = _dumps(obj, max_bytes) if is_root else (None, None)
    mine = (_UNPICKLABLE if data is None else len(data)) if is_root else 0
    length = int(np.asarray(broadcast_length(np.asarray([mine], np.int64))).reshape(-1)[0])
    if length == _UNPICKLABLE:
        raise _unpicklable("broadcast_object", [root_rank], error) from error
    payload = broadcast_bytes(_padded(data if is_root else np.zeros([0], np.uint8), room(length)))
    if is_root:
        return obj
    return pickle.loads(np.asarray(payload).tobytes()[:length])


def allgather_object(obj, ranks, allgather_lengths, allgather_bytes, max_bytes=None,
                     room=_exact):
    """Every rank's ``obj``, in the order of ``ranks`` (the set's global ranks). The frontend's
    side: ``allgather_lengths(int64 array of 1) -> array`` and
    ``allgather_bytes(uint8 array) -> array``, each an allgather over the set. ``max_bytes``
    and ``room``: as for broadcast_object."""
    data, error = _dumps(obj, max_bytes)
    mine = _UNPICKLABLE if data is None else len(data)
    lengths = [int(n) for n in np.asarray(
        allgather_lengths(np.asarray([mine], np.int64))).reshape(-1)]
    failed = [rank for rank, n in zip(ranks, lengths) if n == _UNPICKLABLE]
    if failed:
        raise _unpicklable("allgather_object", failed, error) from error
    gathered = np.asarray(allgather_bytes(_padded(data, room(len(data))))).tobytes()
    out, offset = [], 0
    for n in lengths:
        out.append(pickle.loads(gathered[offset:offset + n]))
        offset += room(n)
    return out


__all__ = ["broadcast_object", "allgather_object"]
