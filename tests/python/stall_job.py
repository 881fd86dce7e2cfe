"""A krugrun job of two ranks, each running Horovod-style pytest tests, in which one rank fails an
assertion between two collectives and goes on to the next test while the other waits in the
second collective (issue 32). Shared by the torch tests (test_stall_inspector.py here) and the
TensorFlow ones (tests/tensorflow/test_ops.py)."""

import os
import re
import subprocess
import sys
import textwrap

from krug._launcher import krugrun_path

# The tests every rank runs. Each prints its outcome on one line (RESULT ...), so that the
# outer test reads every rank's errors whole.
TESTS = textwrap.dedent(r'''
    import functools
    import os

    import pytest

    RAISING = int(os.environ["STALL_RAISING_RANK"])
    if os.environ["STALL_FRAMEWORK"] == "torch":
        import torch
        import krug.torch as hvd

        def allreduce(name):
            return hvd.allreduce(torch.ones(2), name=name, op=hvd.Sum).tolist()
    else:
        import tensorflow as tf
        import krug.tensorflow as hvd

        def allreduce(name):
            # In a function, as Keras runs it: there the op keeps its name (eager ops are
            # matched by their order alone).
            fn = tf.function(lambda x: hvd.allreduce(x, name=name, op=hvd.Sum))
            return fn(tf.ones([2])).numpy().tolist()


    @pytest.fixture(autouse=True)
    def krug_session():
        hvd.init()
        yield
        if os.environ.get("STALL_SHUTDOWN_PER_TEST") == "1":
            hvd.shutdown()


    def reported(test):
        """Prints the test's outcome on one line."""
        @functools.wraps(test)
        def run():
            rank = hvd.rank()
            try:
                test()
            except BaseException as e:
                print("RESULT rank=%d %s %s: %s" % (rank, test.__name__, type(e).__name__,
                                                    str(e).replace("\n", " | ")), flush=True)
                raise
            print("RESULT rank=%d %s ok" % (rank, test.__name__), flush=True)
        return run


    @reported
    def test_1_leaves_between_collectives():
        allreduce("a")
        assert hvd.rank() != RAISING, "rank %d leaves between collectives" % RAISING
        allreduce("b")


    @reported
    def test_2_next_collective():
        allreduce("c")


    @reported
    def test_3_shutdown_and_init_again():
        hvd.shutdown()
        hvd.init()
        assert allreduce("d") == [2.0, 2.0]
''')


def start(framework, directory, raising_rank, shutdown_per_test=False):
    """Starts the job (check time 1 s, shutdown time 3 s) in `directory`; finish() waits."""
    tests = directory / "test_stall_job.py"
    tests.write_text(TESTS)
    # The job's own environment: none of the calling job's rank variables.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KRUG_", "HOROVOD_"))}
    env.update(KRUG_STALL_CHECK_TIME_SECONDS="1", KRUG_STALL_SHUTDOWN_TIME_SECONDS="3",
               STALL_FRAMEWORK=framework, STALL_RAISING_RANK=str(raising_rank),
               STALL_SHUTDOWN_PER_TEST="1" if shutdown_per_test else "0")
    return subprocess.Popen(
        [krugrun_path(), "-np", "2", sys.executable, "-m", "pytest", "-q", "-s",
         "-p", "no:cacheprovider", str(tests)],
        cwd=str(directory), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(job, timeout):
    """The job's return code, its output, and each rank's output ({rank: text}, without
    krugrun's line prefixes). `timeout` only guards against a hang: the job ends in seconds."""
    try:
        out, _ = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        job.kill()
        out, _ = job.communicate()
    ranks = {0: [], 1: []}
    for line in out.splitlines():
        m = re.match(r"\[(\d)\]<std(?:out|err)>:(.*)", line)
        if m:
            ranks[int(m.group(1))].append(m.group(2))
    return job.returncode, out, {r: "\n".join(lines) for r, lines in ranks.items()}


def result(text, rank, test):
    """What rank's `test` printed: "ok", or "<error type>: <message>"."""
    # Not at a line's start: pytest -q's progress letters may come first.
    m = re.search(r"RESULT rank=%d %s (.*)$" % (rank, test), text, re.M)
    return m.group(1) if m else "(no result)"


def check_stall_reported_and_job_goes_on(returncode, out, ranks, raising, error):
    """The assertions of a job with the stall shutdown: both ranks are told of both stalls, each
    pending operation fails with `error` (a type name) naming the operation and the rank that
    never submitted it, and shutdown() and init() again run the last test on both ranks."""
    waiting = 1 - raising
    assert returncode not in (0, -9, None), out  # tests failed, but nothing hung
    # Both stalls, on every rank's own output: rank 0's inspector found them and told rank 1.
    b = "allreduce 'b' (process set 0): waiting "
    c = "allreduce 'c' (process set 0): waiting "
    for rank in (0, 1):
        text = ranks[rank]
        assert "[krug warning rank %d] stalled operations" % rank in text, out
        assert re.search(re.escape(b) + r"\d+ s for ranks \[%d\]; ready on ranks \[%d\]"
                         % (raising, waiting), text), out
        assert re.search(re.escape(c) + r"\d+ s for ranks \[%d\]; ready on ranks \[%d\]"
                         % (waiting, raising), text), out
    # The waiting rank's 'b' and the raising rank's 'c' fail after the shutdown time.
    for rank, test, name, missing in ((waiting, "test_1_leaves_between_collectives", b, raising),
                                      (raising, "test_2_next_collective", c, waiting)):
        got = result(ranks[rank], rank, test)
        assert got.startswith(error + ": "), out
        assert "KRUG_STALL_SHUTDOWN_TIME_SECONDS" in got, got
        assert re.search(re.escape(name) + r"\d+ s for ranks \[%d\]" % missing, got), got
    assert result(ranks[raising], raising, "test_1_leaves_between_collectives").startswith(
        "AssertionError: rank %d leaves between collectives" % raising), out
    for rank in (0, 1):
        assert result(ranks[rank], rank, "test_3_shutdown_and_init_again") == "ok", out
        assert "2 failed, 1 passed" in ranks[rank], out
