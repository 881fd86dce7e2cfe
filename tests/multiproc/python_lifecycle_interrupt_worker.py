"""One rank of python_interrupt_test.py's init and shutdown cases, under `krugrun -np 2`:

    python_lifecycle_interrupt_worker.py OUT_DIR VICTIM WAIT

WAIT "init": the victim calls init() while the other rank never does, so the victim waits for it
(rank 0 for its connection, rank 1 for rank 0's address). WAIT "shutdown": both initialize, the
victim submits an allreduce the other rank never submits and calls shutdown(), which waits for
it to drain. The test sends SIGINT to the victim once it sleeps in its wait; the victim must raise
KeyboardInterrupt and leave krug uninitialized. After a shutdown the other rank's next operation
must fail naming the victim. Each rank writes what happened to OUT_DIR/rank<R>.<key> and exits 0
only when it behaved so."""
import os
import signal
import sys
import time

import torch

import krug.torch as hvd
import rank_records
from krug.common.exceptions import HorovodInternalError

# Hang guard for the other rank's wait for the victim's outcome.
WAIT_SECONDS = 100


def main():
    out_dir, victim, wait = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rank = int(os.environ["KRUG_RANK"])

    def record(key, text):
        rank_records.record(out_dir, rank, key, text)

    def wait_for_victim():
        deadline = time.monotonic() + WAIT_SECONDS
        while not os.path.exists(rank_records.record_path(out_dir, victim, "interrupted")):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)  # polling a file, not synchronizing ranks
        return True

    if rank != victim:
        if wait == "init":
            return 0 if wait_for_victim() else 1
        hvd.init(process_sets=[hvd.ProcessSet([0])])
        if not wait_for_victim():
            return 1
        try:
            hvd.allreduce(torch.ones(4), name="interrupt.bystander")
            record("error", "the allreduce completed")
            return 1
        except HorovodInternalError as e:
            record("error", str(e))
        hvd.shutdown()
        return 0

    subset = hvd.ProcessSet([0])
    if wait == "shutdown":
        hvd.init(process_sets=[subset])
        hvd.allreduce_async(torch.ones(4), name="interrupt.pending")
    record("ready", str(os.getpid()))  # the test waits until this thread sleeps, then signals
    try:
        hvd.init() if wait == "init" else hvd.shutdown()
    except KeyboardInterrupt:
        record("interrupted", repr(time.monotonic()))
    else:
        record("interrupted", "no: %s completed" % wait)
        return 1
    after = "initialized" if hvd.is_initialized() else "not initialized"
    if wait == "shutdown":  # krug is down: the Python side must have forgotten its sets too
        after += ", set %s" % ("forgotten" if subset.process_set_id is None else "still registered")
    record("after", after)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
