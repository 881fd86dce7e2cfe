"""No collective hangs unreported (issue 16): a job whose ranks disagree (one waits in join,
barrier or remove_process_set while the others never come) gets a stall warning naming the
operation and the ranks that did and did not submit it, and KRUG_STALL_SHUTDOWN_TIME_SECONDS
ends it with that message.

A rank that leaves a collective early (issue 32: a test fails an assertion between two
collectives and pytest goes on to the next test) is reported on every rank's own output, the
operations each rank waits in fail naming the operation and the rank that never came, and the
tests after it run: nothing hangs (stall_job.py).

Each case is its own krugrun job of 2 and 3 ranks, started from a 1-rank run of this file (ctest
runs it at 1 rank only; a larger run skips, so the jobs run once)."""

import os
import subprocess
import sys
import textwrap

import pytest

import krug.torch as hvd
import stall_job
from krug._launcher import krugrun_path

SCRIPT = textwrap.dedent('''
    import sys, time
    import krug.torch as hvd
    hvd.init()
    case = sys.argv[1]
    ps = hvd.add_process_set([hvd.size() - 1]) if case == "remove_process_set" else None
    if hvd.rank() == 0:
        {"join": hvd.join, "barrier": hvd.barrier,
         "remove_process_set": lambda: hvd.remove_process_set(ps)}[case]()
        print("rank 0 returned from", case, flush=True)
    else:
        time.sleep(120)  # never comes: the stall inspector must end the job long before
''')


CASES = [(case, np) for case in ("join", "barrier", "remove_process_set") for np in (2, 3)]


@pytest.fixture(scope="module")
def finished_jobs(tmp_path_factory):
    """Every case's job, started together (each mostly waits for its stall to be declared), as
    {(case, np): (returncode, output)}."""
    if hvd.size() != 1:
        pytest.skip("runs its own jobs from the 1-rank run")
    launcher = krugrun_path()
    # ctest runs this from a build tree, which always has the launcher: missing, it is a failure.
    assert os.access(launcher, os.X_OK), "no krugrun at %s" % launcher
    script = tmp_path_factory.mktemp("stall") / "stall.py"
    script.write_text(SCRIPT)
    # The jobs' own environment: none of this (outer) job's rank variables.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KRUG_", "HOROVOD_"))}
    env.update(KRUG_STALL_CHECK_TIME_SECONDS="1", KRUG_STALL_SHUTDOWN_TIME_SECONDS="3")
    jobs = {(case, np): subprocess.Popen(
        [launcher, "-np", str(np), sys.executable, str(script), case], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for case, np in CASES}
    results = {}
    for key, job in jobs.items():
        try:
            out, _ = job.communicate(timeout=150)  # a hang guard: the jobs end in seconds
        except subprocess.TimeoutExpired:
            job.kill()
            out, _ = job.communicate()
        results[key] = (job.returncode, out)
    return results


@pytest.mark.parametrize("case,np", CASES)
def test_stall_is_reported_and_ends_the_job(case, np, finished_jobs):
    returncode, out = finished_jobs[(case, np)]
    assert returncode not in (0, -9), out  # failed, and not by the hang guard's kill
    assert "rank 0 returned" not in out
    missing = ", ".join(str(k) for k in range(1, np))
    # The warning, then the shutdown, each naming the op, who waits and who never came.
    assert "stalled operations" in out, out
    assert "KRUG_STALL_SHUTDOWN_TIME_SECONDS" in out, out
    assert out.count("{} '".format(case)) >= 2, out
    assert "for ranks [{}]; ready on ranks [0]".format(missing) in out, out


LEAVING = [(raising, per_test) for raising in (1, 0) for per_test in (False, True)]


@pytest.fixture(scope="module")
def left_early_jobs(tmp_path_factory):
    """stall_job's job for each rank that leaves early, with and without a shutdown() after
    every test, started together: {(raising rank, per_test): finish()'s result}."""
    if hvd.size() != 1:
        pytest.skip("runs its own jobs from the 1-rank run")
    jobs = {key: stall_job.start("torch", tmp_path_factory.mktemp("left_early"), key[0],
                                 shutdown_per_test=key[1]) for key in LEAVING}
    return {key: stall_job.finish(job, timeout=150) for key, job in jobs.items()}


@pytest.mark.parametrize("raising", [1, 0])
def test_a_rank_that_leaves_early_is_reported_and_the_next_tests_run(raising, left_early_jobs):
    returncode, out, ranks = left_early_jobs[(raising, False)]
    stall_job.check_stall_reported_and_job_goes_on(returncode, out, ranks, raising,
                                                   "HorovodInternalError")


@pytest.mark.parametrize("raising", [1, 0])
def test_a_rank_shut_down_after_a_failed_test_names_what_the_other_waits_for(
        raising, left_early_jobs):
    # Its shutdown() after the failed test ends the other rank's wait in 'b' at once, naming
    # it; the next tests then run on both ranks.
    returncode, out, ranks = left_early_jobs[(raising, True)]
    assert returncode not in (0, -9, None), out
    waiting = 1 - raising
    got = stall_job.result(ranks[waiting], waiting, "test_1_leaves_between_collectives")
    assert got.startswith("HorovodInternalError: "), out
    assert "allreduce 'b' (process set 0)" in got, got
    assert "rank %d (" % raising in got and "called shutdown()" in got, got
    for rank in (0, 1):
        assert "1 failed, 2 passed" in ranks[rank], out
