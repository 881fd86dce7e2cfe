"""How a task forwards its rank's output (krug.spark._task, no Spark cluster needed): every line
the rank printed before returning reaches the driver before its result, whatever the pipes
buffer, and what it prints while exiting follows."""

import os
import subprocess
import sys
import textwrap
import time

from krug.spark._task import _forward_output

# A rank's shape: prints more than a pipe holds (64 KiB), so lines are still in flight when it
# says its outcome is ready; flushes, signals, then prints once more while exiting.
RANK = textwrap.dedent("""
    import os, sys
    for i in range(4000):
        print("line %d of the rank's output" % i)
    sys.stdout.write("a last line without a newline")
    sys.stdout.flush()
    print("and one on stderr", file=sys.stderr)
    os.write(int(sys.argv[1]), b"r")
    sys.stdout.write("\\nprinted while exiting\\n")
""")


class Recorder:
    """The driver's side of the message client: what arrived, in order. Each send takes a
    moment, as one over the network does, so forwarding lags the rank's printing."""

    def __init__(self):
        self.messages = []

    def send(self, *message):
        time.sleep(0.0002)
        self.messages.append(message)


def run_rank(script, signal_ready=True):
    ready_r, ready_w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", script, str(ready_w)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            pass_fds=(ready_w,))
    os.close(ready_w)
    client = Recorder()
    try:
        _forward_output(proc, ready_r, client, 3, lambda written: client.send("done", written))
    finally:
        os.close(ready_r)
    assert proc.wait(timeout=60) == 0
    return client.messages


def test_every_line_printed_before_the_result_arrives_before_it():
    messages = run_rank(RANK)
    done = messages.index(("done", True))  # it said its outcome was written
    before = messages[:done]
    lines = ["line %d of the rank's output\n" % i for i in range(4000)]
    assert [m[3] for m in before if m[2] == "stdout"][:4000] == lines
    assert ("out", 3, "stderr", "and one on stderr\n") in before
    # What it printed while exiting follows (or is read in the same drain), completing the
    # partial line; nothing is lost.
    assert [m[3] for m in messages if m[0] == "out" and m[2] == "stdout"] == lines + [
        "a last line without a newline\n", "printed while exiting\n"]


def test_a_rank_that_dies_before_its_result_still_ends_the_wait():
    messages = run_rank("import sys; print('about to go'); sys.stdout.flush()")
    assert messages == [("out", 3, "stdout", "about to go\n"), ("done", False)]


def test_a_rank_gets_its_payload_and_returns_its_result_through_memory_files():
    import cloudpickle

    from krug.spark._task import run_rank

    def open_descriptors():
        return sorted(os.listdir("/proc/self/fd"))

    job = {"payload": cloudpickle.dumps((lambda x, y=0: x * y, (6,), {"y": 7})), "env": {}}
    before = open_descriptors()
    reports = []
    run_rank(job, {}, 0, Recorder(), lambda code, data: reports.append((code, data)),
             early=False)
    assert len(reports) == 1, reports
    code, data = reports[0]
    assert code == 0 and cloudpickle.loads(data) == ("ok", 42, None)
    assert open_descriptors() == before  # nothing of the rank's plumbing stays open
