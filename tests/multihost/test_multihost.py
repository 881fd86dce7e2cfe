"""krugrun across simulated hosts (network namespaces + sshd): collectives, training, flags, and
failures that must end the job naming the host and leave nothing running anywhere."""
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

from conftest import BUILD, PYTHON, REPO, processes_with, unique_marker, wait_until

TEST_OPS = str(REPO / "tests" / "python" / "test_ops.py")
LOOP = str(pathlib.Path(__file__).with_name("loop_worker.py"))


def hosts_arg(hosts, slots):
    return ",".join(f"{a}:{s}" for a, s in zip(hosts.addresses, slots))


def assert_ok(code, out, err):
    assert code == 0, f"krugrun exited {code}\n--- stdout\n{out[-6000:]}\n--- stderr\n{err[-6000:]}"


@pytest.mark.parametrize("slots", [(2, 2), (1, 1, 1)], ids=["2x2", "3x1"])
def test_every_collective_across_hosts(hosts, slots):
    np = sum(slots)
    code, out, err = hosts.run(["-np", str(np), "-H", hosts_arg(hosts, slots), PYTHON, "-m",
                                "pytest", "-q", "-x", "-p", "no:cacheprovider", TEST_OPS])
    assert_ok(code, out, err)
    for r in range(np):
        assert re.search(rf"\[{r}\]<stdout>:\d+ passed", out), out[-3000:]


@pytest.mark.parametrize("slots", [(2, 2), (1, 1, 1)], ids=["2x2", "3x1"])
def test_digits_training_across_hosts(hosts, slots):
    np = sum(slots)
    code, out, err = hosts.run(["-np", str(np), "-H", hosts_arg(hosts, slots), PYTHON,
                                str(REPO / "examples" / "torch_digits.py"), "--epochs", "15",
                                "--min-accuracy", "0.93"], timeout=600)
    assert_ok(code, out, err)
    assert "accuracy" in out


def test_cpp_example_and_hostfile(hosts, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# three simulated hosts\n" +
                        "".join(f"{a} slots=1\n" for a in hosts.addresses))
    code, out, err = hosts.run(["-np", "3", "--hostfile", str(hostfile),
                                str(BUILD / "examples" / "krug-example-average")])
    assert_ok(code, out, err)
    assert "[0]<stdout>:OK" in out


# Prints the rank's place, environment and directory, and how many processes (of every namespace:
# they share /proc) show the job secret on their command line: krugrun's ssh and the remote
# wrapper must not.
TOPOLOGY_SCRIPT = """
import os
import krug.torch as hvd
hvd.init()
secret = os.environ["KRUG_SECRET"].encode()
shown = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        shown += secret in open("/proc/%s/cmdline" % pid, "rb").read()
    except OSError:
        pass
print("T", hvd.rank(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size(),
      os.environ.get("FORWARDED"), os.environ.get("SET"), os.environ.get("CARRIED"),
      os.getcwd(), "secret shown", shown, "threads", os.environ.get("OMP_NUM_THREADS"),
      "spins", os.environ.get("GOMP_SPINCOUNT"))
"""


def test_topology_environment_and_working_directory(hosts, tmp_path):
    os.environ["FORWARDED"] = "from-the-launcher"
    os.environ["CARRIED"] = "without-x"  # carried to remote ranks like horovodrun's
    chosen = {name: os.environ.pop(name, None)
              for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    try:
        code, out, err = hosts.run(["-np", "3", "-H", hosts_arg(hosts, (2, 1)), "-x", "FORWARDED",
                                    "-x", "SET=a b", PYTHON, "-c", TOPOLOGY_SCRIPT], cwd=tmp_path)
    finally:
        del os.environ["FORWARDED"], os.environ["CARRIED"]
        os.environ.update({name: value for name, value in chosen.items() if value is not None})
    assert_ok(code, out, err)
    # The remote wrapper shares its host's cores among the host's ranks, and has them spin
    # briefly in OpenMP's waits (one alone keeps all, and OpenMP's own spin).
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    expected = {0: ("0 0 2 0 2", share, 1000), 1: ("1 1 2 0 1", share, 1000),
                2: ("2 0 1 1 2", None, None)}
    for r, (topo, threads, spins) in expected.items():
        assert (f"[{r}]<stdout>:T {topo} from-the-launcher a b without-x {tmp_path} "
                f"secret shown 0 threads {threads} spins {spins}") in out, out


def test_identity_file_and_port_flags(hosts, tmp_path):
    # A configuration without the key: only --ssh-identity-file makes ssh work.
    config = tmp_path / "ssh_config"
    config.write_text("".join(line for line in open(hosts.ssh_config)
                              if "IdentityFile" not in line))
    target = hosts.addresses[1]
    key = str(hosts.state / "id_ed25519")

    def check(*flags):
        # 60 s only guards against a hang: the failing checks fail at once (no key, closed port).
        args = ["--check-hosts", "-H", target, "--start-timeout", "60", *flags]
        return subprocess.run(hosts.command(args, str(config)), capture_output=True, text=True)

    without = check()
    assert without.returncode == 1
    assert f"cannot use host {target}" in without.stderr
    with_key = check("--ssh-identity-file", key, "--ssh-port", "22")
    assert with_key.returncode == 0, with_key.stderr
    assert f"host {target}: ok" in with_key.stdout
    assert check("--ssh-identity-file", key, "--ssh-port", "2").returncode == 1


def test_network_interface(hosts):
    code, out, err = hosts.run(["-np", "2", "-H", hosts_arg(hosts, (1, 1)),
                                "--network-interface", "eth0",
                                str(BUILD / "examples" / "krug-example-average")])
    assert_ok(code, out, err)
    code, out, err = hosts.run(["-np", "2", "-H", hosts_arg(hosts, (1, 1)),
                                "--network-interface", "nosuch0",
                                str(BUILD / "examples" / "krug-example-average")])
    assert code != 0
    assert "nosuch0" in err and "eth0" in err, err


def test_unreachable_host_is_named_before_any_rank_starts(hosts):
    marker = unique_marker()
    dead = hosts.addresses[0].rsplit(".", 1)[0] + ".99"
    started = time.monotonic()
    code, out, err = hosts.run(["-np", "2", "-H", f"{hosts.addresses[0]}:1,{dead}:1",
                                "--start-timeout", "3", "-x", f"MARKER={marker}",
                                "sh", "-c", "echo started"])
    assert code == 1
    assert f"cannot use host {dead}" in err, err
    assert "no rank was started" in err
    assert "started" not in out
    assert time.monotonic() - started < 60  # --start-timeout 3, not ssh's own minutes


def _start_loop(hosts, marker):
    proc = hosts.krugrun(["-np", "4", "-H", hosts_arg(hosts, (2, 2)), "-x", f"MARKER={marker}",
                          PYTHON, LOOP])
    pids = {}
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.match(r"\[(\d)\]<stdout>:rank \d pid (\d+)", line)
        if m:
            pids[int(m.group(1))] = int(m.group(2))
        if len(pids) == 4 and "step 100" in line:
            return proc, pids
    proc.kill()
    pytest.fail("the loop job did not start:\n" + "".join(lines) + proc.stderr.read())


def _finish(proc, timeout):
    try:
        out, err = proc.communicate(timeout=timeout)
    except Exception:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"krugrun did not end within {timeout} s:\n{err[-4000:]}")
    return proc.returncode, out, err


def test_killed_remote_rank_ends_the_job_naming_its_host(hosts):
    marker = unique_marker()
    proc, pids = _start_loop(hosts, marker)
    os.kill(pids[3], signal.SIGKILL)
    code, _, err = _finish(proc, 60)
    assert code == 128 + signal.SIGKILL, err[-3000:]
    assert (f"rank 3 on host {hosts.addresses[1]} was killed by signal 9 (SIGKILL) on its host"
            in err), err[-3000:]
    assert wait_until(lambda: not processes_with(marker), 120), processes_with(marker)


def test_cut_link_ends_the_job_naming_the_host(hosts):
    marker = unique_marker()
    proc, _ = _start_loop(hosts, marker)
    hosts.link(2, "down")
    try:
        started = time.monotonic()
        code, _, err = _finish(proc, 90)
        elapsed = time.monotonic() - started
    finally:
        hosts.link(2, "up")
    assert code != 0
    assert re.search(rf"rank [23] on host {re.escape(hosts.addresses[1])} lost its ssh connection",
                     err), err[-3000:]
    assert elapsed < 60, elapsed
    # The ranks behind the cut link die with their ssh sessions (sshd's keep-alive).
    assert wait_until(lambda: not processes_with(marker), 120), processes_with(marker)


def test_killed_launcher_leaves_no_remote_ranks(hosts):
    marker = unique_marker()
    proc, pids = _start_loop(hosts, marker)
    # krugrun runs under `ip netns exec`, which execs it: proc.pid is krugrun itself.
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert wait_until(lambda: not processes_with(marker), 120), processes_with(marker)
