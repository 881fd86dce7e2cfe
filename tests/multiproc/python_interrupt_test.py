"""A blocking wait in krug.torch gives way to Ctrl-C (issue 17, item 6): SIGINT to a rank that
waits for a collective no other rank submits raises KeyboardInterrupt there, and the other rank
fails with an error naming that rank; the job ends. So do init() waiting for a rank that never
starts and shutdown() draining an operation the other rank never submits. Run by ctest as
python.interrupt; each case starts `krugrun -np 2 python3 python_interrupt_worker.py` (or
python_lifecycle_interrupt_worker.py)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from rank_records import record_path

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "python_interrupt_worker.py")
LIFECYCLE_WORKER = os.path.join(HERE, "python_lifecycle_interrupt_worker.py")
KRUGRUN = os.environ.get("KRUGRUN", os.path.join(HERE, "..", "..", "build", "krugrun"))
# Hang guards only: the job takes a few seconds.
JOB_SECONDS = 120
# KeyboardInterrupt must come well within this after the signal (the wait looks every 50 ms).
INTERRUPT_SECONDS = 5.0


def read(path):
    with open(path) as f:
        return f.read()


def wait_for_file(path, job, deadline):
    while not os.path.exists(path):
        assert job.poll() is None, "the job ended early:\n" + job.communicate()[0]
        assert time.monotonic() < deadline, "no %s in time" % path
        time.sleep(0.01)  # polling a file, not synchronizing ranks
    return read(path)


def sleeping(pid):
    """Whether the process's main thread is asleep (S): in its wait, not running Python."""
    with open("/proc/%d/task/%d/stat" % (pid, pid)) as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"


def wait_until_asleep(pid, deadline):
    """Until the main thread is asleep twice in a row, 20 ms apart: then it is inside its wait,
    which wakes only to look for signals (a Python thread running code is R, not S)."""
    while True:
        if sleeping(pid):
            time.sleep(0.02)
            if sleeping(pid):
                return
        assert time.monotonic() < deadline, "rank never slept in its wait"
        time.sleep(0.01)


def interrupt_a_waiting_rank(tmp_path, worker, victim, wait, both_ready=True):
    """Runs `krugrun -np 2 worker OUT_DIR VICTIM WAIT`, sends SIGINT to the victim once it sleeps
    in its wait, and checks that the job succeeded and KeyboardInterrupt came in time."""
    job = subprocess.Popen([KRUGRUN, "-np", "2", sys.executable, worker, str(tmp_path),
                            str(victim), wait],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + JOB_SECONDS
        pid = int(wait_for_file(record_path(str(tmp_path), victim, "ready"), job, deadline))
        if both_ready:
            wait_for_file(record_path(str(tmp_path), 1 - victim, "ready"), job, deadline)
        wait_until_asleep(pid, deadline)
        signalled = time.monotonic()
        os.kill(pid, signal.SIGINT)
        output, _ = job.communicate(timeout=JOB_SECONDS)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode == 0, output
    interrupted = read(record_path(str(tmp_path), victim, "interrupted"))
    latency = float(interrupted) - signalled
    print("%s on rank %d: KeyboardInterrupt %.3f s after SIGINT" % (wait, victim, latency))
    assert latency < INTERRUPT_SECONDS, (latency, output)


@pytest.mark.parametrize("victim", [1, 0], ids=["worker", "coordinator"])
@pytest.mark.parametrize("wait", ["synchronize", "barrier"])
def test_sigint_interrupts_the_wait_and_fails_the_other_rank(tmp_path, victim, wait):
    interrupt_a_waiting_rank(tmp_path, WORKER, victim, wait)
    # The other rank was told, by name, rather than waiting for the victim until a timeout.
    error = read(record_path(str(tmp_path), 1 - victim, "error"))
    assert "rank %d " % victim in error and "interrupted" in error, error
    after = read(record_path(str(tmp_path), victim, "after"))
    assert "interrupted" in after, after


@pytest.mark.parametrize("victim", [1, 0], ids=["worker", "coordinator"])
def test_sigint_interrupts_init_waiting_for_a_rank_that_never_starts(tmp_path, victim):
    # The worker waits for rank 0's address in the store; rank 0 for the worker's connection.
    interrupt_a_waiting_rank(tmp_path, LIFECYCLE_WORKER, victim, "init", both_ready=False)
    assert read(record_path(str(tmp_path), victim, "after")) == "not initialized"


def test_sigint_interrupts_shutdown_draining_and_fails_the_other_rank(tmp_path):
    interrupt_a_waiting_rank(tmp_path, LIFECYCLE_WORKER, 0, "shutdown", both_ready=False)
    after = read(record_path(str(tmp_path), 0, "after"))
    assert after == "not initialized, set forgotten", after
    error = read(record_path(str(tmp_path), 1, "error"))
    assert "rank 0 " in error and "interrupted" in error and "shutdown" in error, error
