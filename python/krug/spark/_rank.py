"""A rank of a krug.spark job: the child process a Spark task starts.

    python -m krug.spark._rank PAYLOAD_FD RESULT_FD READY_FD

PAYLOAD_FD is an in-memory file holding the pickled (fn, args, kwargs); the rank writes the
pickled outcome, ("ok", value, rank), ("removed", None, None) or ("error", traceback text, None),
into the empty RESULT_FD, then a byte to READY_FD says it is there. The rank runs in a process
of its own, not in Spark's Python worker, so that its environment (KRUG_RANK, ...) and its krug
engine end with it, and a task that Spark kills takes it down (the parent-death signal) instead
of leaving it running."""

import os
import sys
import traceback

from krug.common.elastic import call_worker

try:
    import cloudpickle
except ImportError:  # pragma: no cover - PySpark ships a copy
    from pyspark import cloudpickle


def _final_rank():
    """This rank's krug rank when fn returned (an elastic worker's rank in the last round)."""
    torch_api = sys.modules.get("krug.torch")
    try:
        if torch_api is not None and torch_api.is_initialized():
            return torch_api.rank()
    except Exception:  # noqa: B902 - no rank to report
        pass
    return None


def main(payload_fd, result_fd):
    code = 0
    try:
        with open(payload_fd, "rb") as f:
            f.seek(0)  # the task wrote it through a descriptor that shares this offset
            fn, args, kwargs = cloudpickle.load(f)
        finished, value = call_worker(fn, args, kwargs)
        data = cloudpickle.dumps(("ok", value, _final_rank()) if finished else
                                 ("removed", None, None))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        data = cloudpickle.dumps(("error", "the rank exited with status %s" % e.code, None))
    except BaseException:  # noqa: B902 - every failure goes to the driver with its traceback
        code = 1
        data = cloudpickle.dumps(("error", traceback.format_exc(), None))
    with open(result_fd, "wb") as f:
        f.write(data)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    status = main(int(sys.argv[1]), int(sys.argv[2]))
    # Tell the task the result is there now, before the interpreter's exit shuts krug down:
    # a failing rank's own error must reach the driver before its peers' errors about it.
    os.write(int(sys.argv[3]), b"r")
    sys.exit(status)
