"""One rank of python_interrupt_test.py, under `krugrun -np 2`:

    python_interrupt_worker.py OUT_DIR VICTIM WAIT

The victim rank blocks in a collective no other rank submits (WAIT: "synchronize" waits for an
allreduce, "barrier" for a barrier); the other rank waits for an allreduce of its own. The test
sends SIGINT to the victim once it sleeps in its wait. The victim must raise KeyboardInterrupt;
the other rank must fail with an error that names the victim. Each rank writes what happened to
OUT_DIR/rank<R>.<key> and exits 0 only when it behaved so."""
import os
import signal
import sys
import time

import torch

import krug.torch as hvd
import rank_records
from krug.common.exceptions import HorovodInternalError


def main():
    out_dir, victim, wait = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    hvd.init()
    rank = hvd.rank()

    def record(key, text):
        rank_records.record(out_dir, rank, key, text)

    if rank != victim:
        record("ready", str(os.getpid()))
        try:
            hvd.allreduce(torch.ones(4), name="interrupt.bystander")
        except HorovodInternalError as e:
            record("error", str(e))
            return 0
        record("error", "the allreduce completed")
        return 1

    record("ready", str(os.getpid()))  # the test waits until this thread sleeps, then signals
    try:
        if wait == "barrier":
            hvd.barrier()
        else:
            hvd.allreduce(torch.ones(4), name="interrupt.victim")
    except KeyboardInterrupt:
        record("interrupted", repr(time.monotonic()))
    else:
        record("interrupted", "no: the wait completed")
        return 1
    # krug stopped on this rank: later operations fail at once, with the same reason.
    try:
        hvd.allreduce(torch.ones(1), name="interrupt.after")
        record("after", "the allreduce after the interrupt completed")
        return 1
    except HorovodInternalError as e:
        record("after", str(e))
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
