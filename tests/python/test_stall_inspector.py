"""No collective hangs unreported (issue 16): a job whose ranks disagree (one waits in join,
barrier or remove_process_set while the others never come) gets a stall warning naming the
operation and the ranks that did and did not submit it, and KRUG_STALL_SHUTDOWN_TIME_SECONDS
ends it with that message.

Each case is its own krugrun job of 2 and 3 ranks, started from the 1-rank run of this file (the
larger runs skip, so the jobs run once)."""

import os
import subprocess
import sys
import textwrap

import pytest

import krug.torch as hvd
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
