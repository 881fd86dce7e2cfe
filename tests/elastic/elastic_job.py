"""Runs one elastic krugrun job for the tests: a discovery file the test edits, the job's
output read line by line with arrival times, and helpers to kill a worker at a chosen step."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "torch_elastic_digits.py")
# The ranks run the interpreter of the harness: the one the torch binding was built for (ctest
# runs pytest with it).
PYTHON = sys.executable

STARTED = re.compile(r"krugrun: elastic: worker (w\d+) on host (\S+): pid (\d+) started")
COMMITTED = re.compile(r"step (\d+) committed")
FINAL = re.compile(r"final accuracy: ([0-9.]+)")


class ElasticJob:
    """krugrun --host-discovery-script over a file of host:slots lines (hosts 127.0.0.x are
    this machine under different names, so each is a separate "host" to krug)."""

    def __init__(self, tmp_path, hosts, krugrun_args=(), example_args=(), env=None,
                 command=None, fixed_hosts=False):
        """Runs `command` (default: the elastic digits example with `example_args`). With
        `fixed_hosts` the hosts are given with -H instead (horovodrun's elastic job on fixed
        hosts) and set_hosts() changes nothing."""
        os.makedirs(str(tmp_path), exist_ok=True)
        self.hosts_file = os.path.join(str(tmp_path), "hosts")
        self.set_hosts(hosts)
        script = os.path.join(str(tmp_path), "discover.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\ncat %s\n" % self.hosts_file)
        os.chmod(script, 0o755)
        self.result_file = os.path.join(str(tmp_path), "result.json")
        if command is None:
            command = [PYTHON, EXAMPLE, "--log-every", "1", "--result-file", self.result_file,
                       *example_args]
        hosts_args = ["-H", ",".join(hosts)] if fixed_hosts else \
            ["--host-discovery-script", script]
        cmd = [os.environ.get("KRUGRUN", os.path.join(REPO, "build", "krugrun")),
               *hosts_args, *krugrun_args, *command]
        full_env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        full_env.update(env or {})
        self.lines = []  # (monotonic time, line)
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=full_env, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def set_hosts(self, hosts):
        tmp = self.hosts_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("".join("%s\n" % h for h in hosts))
        os.replace(tmp, self.hosts_file)  # the driver never reads half a file

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, pattern, timeout=120, after=0):
        """The first line matching `pattern` (a regex) from index `after` on: (index, time, match)."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.cond:
            i = after
            while True:
                while i < len(self.lines):
                    m = rx.search(self.lines[i][1])
                    if m:
                        return i, self.lines[i][0], m
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.reader.is_alive()):
                    raise AssertionError("no line matching %r within %s s; output:\n%s"
                                         % (pattern, timeout, self.text()[-6000:]))
                self.cond.wait(min(left, 1.0))

    def worker_pids(self):
        """worker id -> (host, pid) of every worker started so far."""
        out = {}
        for _, line in list(self.lines):
            m = STARTED.search(line)
            if m:
                out[m.group(1)] = (m.group(2), int(m.group(3)))
        return out

    def finish(self, timeout=300):
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError("the job did not end within %s s; output:\n%s"
                                 % (timeout, self.text()[-6000:]))
        self.reader.join(10)
        return code

    def text(self):
        return "\n".join(line for _, line in self.lines)

    def final_accuracy(self):
        m = FINAL.findall(self.text())
        assert m, "no final accuracy in the output:\n" + self.text()[-4000:]
        return float(m[-1])
