"""Simulated hosts for the multi-host tests: network namespaces with sshd (scripts/netns-hosts).

Every test launches krugrun from inside host 1's namespace, as a user would on the first node
of a cluster; the other hosts are reached only over ssh on the namespaces' private subnet.
"""
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
NETNS = pathlib.Path(os.environ.get("KRUG_NETNS_HOSTS", REPO / "scripts" / "netns-hosts"))
KRUGRUN = os.environ.get("KRUGRUN", str(REPO / "build" / "krugrun"))
BUILD = pathlib.Path(KRUGRUN).parent
# The ranks run the interpreter of the harness: the one the torch binding was built for (ctest
# runs pytest with it).
PYTHON = sys.executable


def _check_environment():
    result = subprocess.run([str(NETNS), "check"], capture_output=True, text=True)
    why = (result.stdout + result.stderr).strip()
    if result.returncode == 77:
        pytest.skip("multi-host tests need network namespaces and sshd: " + why)
    if result.returncode != 0:  # a broken check, or KRUG_TEST_NO_SKIP=1 (CI)
        pytest.fail("netns-hosts check failed: " + why)


class Hosts:
    """N simulated hosts; addresses[i] is host i+1."""

    def __init__(self, name, count, subnet, rate=None):
        self.name = name
        self.state = pathlib.Path(tempfile.mkdtemp(prefix=f"krug-{name}-"))
        shutil.rmtree(self.state)  # netns-hosts creates it
        self.addresses = [f"{subnet}.{i}" for i in range(1, count + 1)]
        cmd = [str(NETNS), "up", "--name", name, "--hosts", str(count), "--subnet", subnet,
               "--state", str(self.state)]
        if rate:
            cmd += ["--rate", rate]
        subprocess.run(cmd, check=True)

    @property
    def ssh_config(self):
        return str(self.state / "ssh_config")

    def down(self):
        subprocess.run([str(NETNS), "down", "--name", self.name, "--state", str(self.state)],
                       check=False)

    def link(self, host_index, state):
        subprocess.run([str(NETNS), "link", "--name", self.name, "--host", str(host_index),
                        state], check=True)

    def command(self, args, ssh_config=None):
        """krugrun inside host 1, with the simulated hosts' ssh configuration."""
        return ["ip", "netns", "exec", f"{self.name}-h1", KRUGRUN, "--ssh-config-file",
                ssh_config or self.ssh_config] + list(args)

    def krugrun(self, args, **popen):
        return subprocess.Popen(self.command(args), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=popen.pop("cwd", REPO),
                                **popen)

    def run(self, args, timeout=300, **popen):
        proc = self.krugrun(args, **popen)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"krugrun {args} did not finish in {timeout} s\n{out}\n{err}")
        return proc.returncode, out, err


@pytest.fixture(scope="session")
def hosts():
    _check_environment()
    h = Hosts(f"km{os.getpid() % 10000}", 3, f"10.213.{os.getpid() % 200 + 20}")
    try:
        yield h
    finally:
        h.down()


def processes_with(marker):
    """PIDs of live processes whose environment contains `marker` (every namespace shares the
    process table, so remote ranks are visible here too)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def wait_until(predicate, timeout, interval=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def unique_marker():
    return f"krugmh{os.getpid()}x{time.monotonic_ns()}"
