"""A hostile third host attacks every port a 2-host job listens on (docs/security.md, "Tested
against a hostile host").

The job (attack_train.py: an MLP on seeded synthetic data, DistributedOptimizer, one rank on
each of hosts 1 and 2) runs undisturbed once, then under attack. While it runs under attack the
harness lists, every 0.1 s, the TCP ports krugrun and the two ranks listen on in hosts 1 and 2
(ss in their namespaces): krugrun's rendezvous server, rank 0's control plane (open only until
every rank connected to it: rank 1 is held back a few seconds so that the window is wide) and
both ranks' TCP data-plane listeners. Once a rank has started the harness reads the job secret
from its environment (/proc/PID/environ, which the threat model grants the job's own user, not
the network) to make one legitimate client handshake with the rendezvous server whose client
bytes it records: the "captured handshake". The attacker (attacker.py, in host 3's namespace,
without the secret) gets the capture and each listener as soon as it appears, and throws at it
garbage, a truncated frame, huge length prefixes, the replay and a one-byte-a-second trickle;
once all four are up, 1,000 connections at once.

test_hostile_host_cannot_disturb_a_training_job asserts: the job exits 0 and its final
parameters are bitwise those of the undisturbed run; the attacker reached all four listeners;
every hostile connection was refused, closed by the job (at the latest by its handshake
deadline) or was a trickler's at the job's end, and got nothing but the server's nonce and at
most a rejection; the replay was rejected; peak RSS of the ranks and of krugrun grew by at most
64 MiB; krugrun's output names host 3 in a rejection line of each listener.

test_a_flood_while_a_rank_joins times the 1,000 connections instead for the moment rank 1
joins: spread over the rendezvous server and rank 0's control plane, whose 64 handshake slots
they fill. The job must still finish, bitwise as before: a rank closed unheard by a full
listener dials again until its deadline (net::dial_authenticated). This run is encrypted
(krugrun --encrypt), which must not change a bit of the results either.
"""
import json
import pathlib
import re
import subprocess
import threading
import time

import pytest

from conftest import PYTHON, processes_with, unique_marker

HERE = pathlib.Path(__file__).resolve().parent
TRAIN = HERE / "attack_train.py"
ATTACKER = HERE / "attacker.py"
CAPTURE = HERE / "capture_handshake.py"

STEPS = 8000        # about 14 s of training for two ranks on an idle 2-core machine
HOLD = 5.0          # seconds rank 1 waits before init(): rank 0's control plane listens as long
FLOOD = 1000        # connections at once
FLOOD_HOLD = 3.0    # seconds they stay open
FLOOD_DELAY = 1.0   # seconds after the last listener appeared
PHASE_WAIT = 20.0   # how long a phase waits for the job to close its connection
HANDSHAKE_DEADLINE = 10.0  # the longest of the listeners' (tcp_device.h; the rendezvous's is 5)
SLACK = 5.0
RSS_MARGIN_KIB = 64 * 1024
JOB_TIMEOUT = 180
PHASES = ["garbage", "huge_1gib", "huge_ffffffff", "replay", "truncated", "truncated_hold"]
ALLOWED_ENDS = {"refused", "closed_by_server", "reset_by_server", "closed_by_attacker"}

RESULT = re.compile(r"\[(\d+)\]<stdout>:RESULT rank=(\d+) sha256=([0-9a-f]{64}) "
                    r"maxrss_kib=(\d+) train_s=([0-9.]+)")
SS_LINE = re.compile(r"^\S+\s+\d+\s+\d+\s+(\S+):(\d+)\s+\S+\s+users:\((.*)\)\s*$")


def listeners(hosts, index):
    """[(address, port, pids)] of the TCP listeners in host `index`'s namespace."""
    out = subprocess.run(["ip", "netns", "exec", f"{hosts.name}-h{index}", "ss", "-ltnpH"],
                         capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        m = SS_LINE.match(line.strip())
        if m:
            address = m.group(1).strip("[]")
            if address in ("0.0.0.0", "*", "::"):
                address = hosts.addresses[index - 1]
            found.append((address, int(m.group(2)), {int(p) for p in
                                                     re.findall(r"pid=(\d+)", m.group(3))}))
    return found


def rank_pids(marker):
    """{rank: (pid, secret)} of the job's Python ranks (every namespace shares /proc)."""
    ranks = {}
    for pid in processes_with(marker):
        try:
            # The rank itself, not krugrun's ssh to its host (which carries its environment).
            argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if argv[1:2] != [str(TRAIN).encode()]:
                continue
            env = dict(v.split(b"=", 1) for v in
                       pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if b"KRUG_RANK" in env and b"KRUG_SECRET" in env:
            ranks[int(env[b"KRUG_RANK"])] = (pid, env[b"KRUG_SECRET"].decode())
    return ranks


def peak_rss_kib(pid):
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class Job:
    """One run of the job. plan: None (undisturbed), "training" (attack every listener as it
    appears, flood once all are up) or "joining" (as "training", but the flood fills the
    rendezvous server's and the control plane's handshake slots just before rank 1 joins)."""

    def __init__(self, hosts, tmp_path, plan=None, encrypt=False):
        self.hosts = hosts
        self.plan = plan
        self.encrypt = encrypt
        self.tmp = tmp_path / (plan or "undisturbed")
        self.tmp.mkdir()
        self.marker = unique_marker()
        self.release = self.tmp / "release"
        self.ports = {}  # (host index, port) -> {name, owner, address, port, first, last}
        self.krugrun_hwm = 0
        self.attacker = None
        self.attacker_lines = []
        self.sent = set()
        self.flood_at = None
        self.flooded = False
        self.out_lines = []

    def args(self):
        h1, h2 = self.hosts.addresses[:2]
        hold = (["--release-file", str(self.release)] if self.plan == "joining"
                else ["--hold-workers", str(HOLD)])
        return (["-np", "2", "-H", f"{h1}:1,{h2}:1", "-x", f"ATTACK_MARKER={self.marker}"] +
                (["--encrypt"] if self.encrypt else []) +
                [PYTHON, str(TRAIN), "--steps", str(STEPS)] + hold)

    def run(self):
        started = time.monotonic()
        proc = self.hosts.krugrun(self.args())
        err = []
        readers = [threading.Thread(target=lambda: self.out_lines.extend(proc.stdout)),
                   threading.Thread(target=lambda: err.extend(proc.stderr))]
        for t in readers:
            t.start()
        ranks = {}
        try:
            while proc.poll() is None:
                if time.monotonic() - started > JOB_TIMEOUT:
                    proc.kill()
                    pytest.fail(f"the job did not finish in {JOB_TIMEOUT} s")
                self.krugrun_hwm = max(self.krugrun_hwm, peak_rss_kib(proc.pid) or 0)
                if self.plan:
                    if len(ranks) < 2:
                        ranks.update(rank_pids(self.marker))
                    self.watch(proc.pid, ranks, started)
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for t in readers:
                t.join()
            if self.attacker is not None:
                self.stop_attacker()
        self.seconds = time.monotonic() - started
        self.code, self.out, self.err = proc.returncode, "".join(self.out_lines), "".join(err)
        (self.tmp / "krugrun.out").write_text(self.out)
        (self.tmp / "krugrun.err").write_text(self.err)
        return self

    # --- under attack -------------------------------------------------------------------------

    def watch(self, krugrun_pid, ranks, started):
        owners = {krugrun_pid: "krugrun"}
        owners.update({pid: f"rank{r}" for r, (pid, _) in ranks.items()})
        now = time.monotonic() - started
        for index in (1, 2):
            for address, port, pids in listeners(self.hosts, index):
                owner = next((owners[p] for p in pids if p in owners), None)
                if owner is None:
                    continue  # sshd, or another process of the namespace
                key = (index, port)
                if key not in self.ports:
                    n = sum(p["owner"] == owner for p in self.ports.values()) + 1
                    name = "rendezvous" if owner == "krugrun" else f"{owner}-{n}"
                    self.ports[key] = dict(name=name, owner=owner, address=address, port=port,
                                           first=round(now, 2), last=now)
                self.ports[key]["last"] = now
        rendezvous = next((p for p in self.ports.values() if p["owner"] == "krugrun"), None)
        if self.attacker is None and rendezvous and ranks:
            self.start_attacker(rendezvous, next(iter(ranks.values()))[1])
        if self.attacker is None:
            return
        for p in self.ports.values():
            if p["name"] not in self.sent:
                self.command(f"target {p['name']} {p['address']}:{p['port']}")
                self.sent.add(p["name"])
        if self.plan == "training":
            self.flood_when_all_are_up(now)
        else:
            self.flood_before_rank1_joins()

    def flood_when_all_are_up(self, now):
        owners = [p["owner"] for p in self.ports.values()]
        if self.flood_at is None and owners.count("rank0") >= 2 and "rank1" in owners:
            self.flood_at = now + FLOOD_DELAY
        if not self.flooded and self.flood_at is not None and now >= self.flood_at:
            live = [p["name"] for p in self.ports.values() if p["last"] == now]
            self.command(f"flood {FLOOD} {FLOOD_HOLD} {','.join(live)}")
            self.flooded = True

    def flood_before_rank1_joins(self):
        control = next((p for p in self.ports.values() if p["owner"] == "rank0"), None)
        waiting = any("[1]<stdout>:waiting for release" in line for line in self.out_lines)
        if self.flooded or control is None or not waiting:
            return
        self.command(f"flood {FLOOD} {FLOOD_HOLD} rendezvous,{control['name']}")
        self.flooded = True
        deadline = time.monotonic() + 30
        while not any(line.startswith("flood-open") for line in self.attacker_lines):
            assert time.monotonic() < deadline, "the flood did not open"
            time.sleep(0.05)
        self.release.touch()  # rank 1 joins now, while the handshake slots are full

    def start_attacker(self, rendezvous, secret):
        # The captured handshake: a legitimate client's bytes, from host 1.
        capture = subprocess.run(
            ["ip", "netns", "exec", f"{self.hosts.name}-h1", PYTHON, str(CAPTURE),
             rendezvous["address"], str(rendezvous["port"])] +
            (["--encrypt"] if self.encrypt else []),
            input=secret, capture_output=True, text=True, timeout=30)
        assert capture.returncode == 0, capture.stderr
        self.capture = json.loads(capture.stdout)
        assert self.capture["accepted"] and self.capture["server_proved"], (
            "capture_handshake.py no longer speaks src/net/handshake.cc's exchange "
            f"(update its answer()): the server said {self.capture['verdict']!r}")
        self.attacker_out = self.tmp / "attacker.json"
        self.attacker_log = open(self.tmp / "attacker.log", "w")
        self.attacker = subprocess.Popen(
            ["ip", "netns", "exec", f"{self.hosts.name}-h3", PYTHON, str(ATTACKER), "--out",
             str(self.attacker_out), "--wait", str(PHASE_WAIT)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.attacker_log, text=True)
        self.attacker_reader = threading.Thread(
            target=lambda: self.attacker_lines.extend(self.attacker.stdout))
        self.attacker_reader.start()
        self.command("replay " + self.capture["client_bytes"])

    def command(self, line):
        self.attacker.stdin.write(line + "\n")
        self.attacker.stdin.flush()

    def stop_attacker(self):
        try:
            self.command("stop")
            self.attacker.stdin.close()
        except OSError:
            pass
        try:
            self.attacker.wait(PHASE_WAIT + 20)
        except subprocess.TimeoutExpired:
            self.attacker.kill()
            self.attacker.wait()
        self.attacker_reader.join()
        self.attacker_log.close()

    def attack_report(self):
        assert self.attacker_out.exists(), (self.tmp / "attacker.log").read_text()[-4000:]
        report = json.loads(self.attacker_out.read_text())
        # Rank 0's listener that closed while the other stayed is its control plane (open only
        # until every rank connected); the one that stayed is its data plane.
        end = max(p["last"] for p in self.ports.values() if p["owner"] == "rank0")
        kinds = {}
        for p in self.ports.values():
            if p["owner"] == "krugrun":
                kind = "rendezvous"
            elif p["owner"] == "rank0":
                kind = "control_plane" if p["last"] < end - 1.0 else "data_plane_rank0"
            else:
                kind = f"data_plane_{p['owner']}"
            kinds[p["name"]] = kind
        return report, kinds


def results(out):
    found = {}
    for m in RESULT.finditer(out):
        found[int(m.group(2))] = dict(sha256=m.group(3), maxrss_kib=int(m.group(4)),
                                      train_s=float(m.group(5)))
    return found


def assert_ok(job):
    assert job.code == 0, (f"krugrun exited {job.code}\n--- stdout\n{job.out[-6000:]}\n"
                           f"--- stderr\n{job.err[-6000:]}")


@pytest.fixture(scope="module")
def undisturbed(hosts, tmp_path_factory):
    job = Job(hosts, tmp_path_factory.mktemp("attack")).run()
    assert_ok(job)
    found = results(job.out)
    assert sorted(found) == [0, 1], job.out[-3000:]
    # Data parallel: both ranks end with the same parameters.
    assert found[0]["sha256"] == found[1]["sha256"]
    job.results = found
    return job


def summarize(quiet, attacked, report, kinds):
    attacked_results = results(attacked.out)
    summary = {"undisturbed_s": round(quiet.seconds, 1), "attacked_s": round(attacked.seconds, 1),
               "krugrun_hwm_kib": (quiet.krugrun_hwm, attacked.krugrun_hwm),
               "ports": {p["name"]: (kinds[p["name"]], p["first"], round(p["last"], 2))
                         for p in attacked.ports.values()}}
    # Rank 0's first step holds the first collectives, which make the data plane's connections.
    first_step = [re.search(r"\[0\]<stdout>:step 0 .* t=([0-9.]+)", job.out)
                  for job in (quiet, attacked)]
    summary["first_step_s"] = [m and float(m.group(1)) for m in first_step]
    for r in (0, 1):
        summary[f"rank{r}"] = dict(
            train_s=(quiet.results[r]["train_s"], attacked_results.get(r, {}).get("train_s")),
            maxrss_kib=(quiet.results[r]["maxrss_kib"],
                        attacked_results.get(r, {}).get("maxrss_kib")))
    summary["phases"] = {n: {rec["phase"]: (rec["ended"], rec.get("seconds"),
                                            rec.get("server_bytes"))
                             for rec in t["phases"]}
                         for n, t in report["targets"].items()}
    summary["trickle"] = {n: [(rec["ended"], rec.get("seconds"), rec.get("bytes_sent"))
                              for rec in t["trickle"]] for n, t in report["targets"].items()}
    summary["floods"] = report["floods"]
    summary["attacker"] = {"cpu_s": report["cpu_s"], "maxrss_kib": report["maxrss_kib"]}
    summary["rejection_lines"] = {
        "krugrun": sum("rejected" in line for line in attacked.err.splitlines()
                       if line.startswith("krugrun: rendezvous:")),
        "rank0": sum("rejected" in line or "refused" in line
                     for line in attacked.err.splitlines() if line.startswith("[0]<stderr>:")),
        "rank1": sum("rejected" in line or "refused" in line
                     for line in attacked.err.splitlines() if line.startswith("[1]<stderr>:"))}
    (attacked.tmp / "summary.json").write_text(json.dumps(summary, indent=1))
    print("ATTACK SUMMARY", json.dumps(summary))
    return attacked_results


def assert_same_training(quiet, attacked_results, attacked):
    assert sorted(attacked_results) == [0, 1], attacked.out[-3000:]
    for r in (0, 1):
        assert attacked_results[r]["sha256"] == quiet.results[r]["sha256"], f"rank {r}"


def test_hostile_host_cannot_disturb_a_training_job(hosts, undisturbed, tmp_path):
    quiet = undisturbed
    attacked = Job(hosts, tmp_path, plan="training").run()
    assert_ok(attacked)
    report, kinds = attacked.attack_report()
    attacked_results = summarize(quiet, attacked, report, kinds)
    assert_same_training(quiet, attacked_results, attacked)

    # The attacker reached every listener of the job.
    assert sorted(kinds.values()) == ["control_plane", "data_plane_rank0", "data_plane_rank1",
                                      "rendezvous"], kinds
    assert set(report["targets"]) == set(kinds)
    assert report["unfinished_threads"] == 0

    for name, target in report["targets"].items():
        phases = {rec["phase"]: rec for rec in target["phases"]}
        assert sorted(phases) == PHASES, name
        for rec in phases.values():
            # Every phase reached a live listener (they start as soon as it appears) ...
            assert rec["ended"] != "refused" and "connect" not in rec["ended"], (name, rec)
            # ... which refused or closed it, by its handshake deadline at the latest, and sent
            # nothing beyond its nonce and a rejection.
            assert rec["ended"] in ALLOWED_ENDS, (name, rec)
            assert rec["server_bytes_ok"], (name, rec)
            assert rec["seconds"] <= HANDSHAKE_DEADLINE + SLACK, (name, rec)
        # The replayed handshake was read and rejected: the server's nonce was new.
        assert "rejection" in phases["replay"]["server_bytes"], (name, phases["replay"])
        # The trickler's connections end by the handshake deadline (or with the job).
        assert target["trickle"], name
        for rec in target["trickle"]:
            assert rec["ended"] in ALLOWED_ENDS | {"still_open"}, (name, rec)
            assert rec["server_bytes_ok"], (name, rec)
            assert rec["seconds"] <= HANDSHAKE_DEADLINE + SLACK, (name, rec)

    # The flood: 1,000 connections over the listeners then open (the control plane has closed),
    # none of which got anything but a nonce.
    assert len(report["floods"]) == 1, report["floods"]
    per = report["floods"][0]["targets"]
    assert sum(t["attempted"] for t in per.values()) == FLOOD
    assert sorted(kinds[n] for n in per) == ["data_plane_rank0", "data_plane_rank1",
                                             "rendezvous"], per
    for name, t in per.items():
        assert t["server_bytes_violations"] == 0, (name, t)
        assert t["connected"] > 0, (name, t)

    # Bounded memory: peak RSS of the ranks and of krugrun (the rendezvous server).
    for r in (0, 1):
        assert attacked_results[r]["maxrss_kib"] <= \
            quiet.results[r]["maxrss_kib"] + RSS_MARGIN_KIB, r
    assert attacked.krugrun_hwm <= quiet.krugrun_hwm + RSS_MARGIN_KIB

    # Each listener logged a rejection naming host 3.
    h3 = hosts.addresses[2]
    stream = {"rendezvous": "krugrun: rendezvous:", "control_plane": "[0]<stderr>:",
              "data_plane_rank0": "[0]<stderr>:", "data_plane_rank1": "[1]<stderr>:"}
    words = {"rendezvous": "rendezvous", "control_plane": "control plane",
             "data_plane_rank0": "data plane", "data_plane_rank1": "data plane"}
    lines = attacked.err.splitlines()
    for p in attacked.ports.values():
        kind = kinds[p["name"]]
        mine = [line for line in lines if line.startswith(stream[kind]) and "rejected" in line
                and f"{h3}:" in line and (words[kind] in line or
                                          f"{p['address']}:{p['port']}" in line)]
        assert mine, (kind, attacked.err[-4000:])


def test_a_flood_while_a_rank_joins(hosts, undisturbed, tmp_path):
    quiet = undisturbed
    # Encrypted (krugrun --encrypt): the same bits as the undisturbed run, which is not.
    attacked = Job(hosts, tmp_path, plan="joining", encrypt=True).run()
    assert_ok(attacked)
    report, kinds = attacked.attack_report()
    attacked_results = summarize(quiet, attacked, report, kinds)
    assert_same_training(quiet, attacked_results, attacked)
    per = report["floods"][0]["targets"]
    assert sorted(kinds[n] for n in per) == ["control_plane", "rendezvous"], per
    for name, t in per.items():
        assert t["server_bytes_violations"] == 0, (name, t)
