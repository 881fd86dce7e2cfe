"""The rendezvous server of a job whose ranks another engine starts (Spark tasks, Ray actors).

krugrun runs the server inside itself; krug.spark and krug.ray run ``krugrun
__rendezvous-server`` (the same C++ server) on their driver instead, and hand every rank the
environment a krugrun rank gets (:func:`rank_environment`)."""

import os
import secrets
import select
import subprocess
import time


def encryption_requested():
    """Whether KRUG_ENCRYPT in this (driver) process's environment asks for encrypted
    connections (docs/security.md): the job's server, its ranks and its driver channel then all
    encrypt."""
    return os.environ.get("KRUG_ENCRYPT", "").strip().lower() in ("1", "true", "yes", "on")


class RendezvousServer:
    """krug's rendezvous server in a child process of this (driver) process.

    ``bind``: the address to listen on ("0.0.0.0" for ranks on other machines). The server
    exits when this object is stopped or this process dies (its stdin is a pipe we hold), and
    then removes this host's shared-memory segments of the job."""

    def __init__(self, bind="127.0.0.1", start_timeout=30.0, mode="__rendezvous-server",
                 extra_args=()):
        from krug._launcher import krugrun_path

        self.secret = secrets.token_hex(32)
        self.job_id = secrets.token_hex(4)
        self.encrypt = encryption_requested()
        env = dict(os.environ, KRUG_SECRET=self.secret, KRUG_JOB_ID=self.job_id,
                   KRUG_ENCRYPT="1" if self.encrypt else "0")
        self._proc = subprocess.Popen(
            [krugrun_path(), mode, "--bind", bind] + list(extra_args), env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        try:
            self.port = self._read_port(start_timeout)
        except BaseException:
            self.stop()
            raise

    def _read_port(self, timeout):
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._proc.stdout], [], [], max(left, 0))
            if not ready:
                raise RuntimeError("krug: the rendezvous server (krugrun __rendezvous-server) "
                                   "did not report its port within %.0f s" % timeout)
            chunk = os.read(self._proc.stdout.fileno(), 256)
            if not chunk:
                raise RuntimeError("krug: the rendezvous server (krugrun __rendezvous-server) "
                                   "exited with status %s before listening; see its message "
                                   "above" % self._proc.wait())
            line += chunk
        key, _, value = line.decode().strip().partition("=")
        if key != "KRUG_RENDEZVOUS_PORT":
            raise RuntimeError("krug: unexpected output of the rendezvous server: %r" % line)
        return int(value)

    def stop(self, timeout=10.0):
        """Stops the server (idempotent) and waits for it to exit."""
        if self._proc.poll() is None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for f in (self._proc.stdin, self._proc.stdout):
            if f is not None and not f.closed:
                f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class ElasticRendezvous(RendezvousServer):
    """The rendezvous server with krugrun's elastic round forming (``krugrun
    __elastic-rendezvous``) for workers this process starts elsewhere: tell it of each worker
    (:meth:`add`) and of its end (:meth:`exited`); it gives the workers' init() calls their
    ranks round by round. ``events`` receives ("round", text) and ("stop", code, message)."""

    def __init__(self, bind="127.0.0.1", min_np=1, reset_limit=None, elastic_timeout=600.0,
                 start_timeout=30.0):
        import queue
        import threading

        args = ["--min-np", str(min_np), "--elastic-timeout", str(elastic_timeout)]
        if reset_limit is not None:
            args += ["--reset-limit", str(reset_limit)]
        super().__init__(bind, start_timeout, mode="__elastic-rendezvous", extra_args=args)
        self.events = queue.Queue()
        self._lock = threading.Lock()
        threading.Thread(target=self._read_events, daemon=True,
                         name="krug-elastic-events").start()

    def _read_events(self):
        for raw in iter(self._proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            kind, _, rest = line.partition(" ")
            if kind == "round":
                self.events.put(("round", rest))
            elif kind == "stop":
                code, _, message = rest.partition(" ")
                self.events.put(("stop", int(code), message))

    def _command(self, line):
        with self._lock:
            try:
                self._proc.stdin.write((line + "\n").encode())
                self._proc.stdin.flush()
            except (OSError, ValueError):
                pass  # stopped: nothing to tell any more

    def add(self, worker_id, host):
        """A worker with KRUG_ELASTIC_WORKER_ID=worker_id started on host."""
        self._command("add %s %s" % (worker_id, host))

    def exited(self, worker_id, status):
        """Its process ended with this status (0: its training function returned)."""
        self._command("exit %s %d" % (worker_id, status))


def elastic_worker_environment(worker_id, host, addr, port, secret, job_id, timeout=7 * 24 * 3600,
                               encrypt=False):
    """What an elastic worker needs (src/run/launch/rank_env.cc, elastic_worker_environment): no
    rank; init() asks the elastic rendezvous for one every round."""
    env = {
        "KRUG_ELASTIC": "1", "HOROVOD_ELASTIC": "1", "KRUG_ELASTIC_WORKER_ID": worker_id,
        "KRUG_ELASTIC_TIMEOUT": str(timeout), "KRUG_HOSTNAME": host, "HOROVOD_HOSTNAME": host,
        "KRUG_RENDEZVOUS_ADDR": addr, "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr,
        "KRUG_RENDEZVOUS_PORT": str(port), "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "KRUG_SECRET": secret, "KRUG_JOB_ID": job_id, "HOROVOD_CONTROLLER": "gloo",
    }
    if encrypt:
        env["KRUG_ENCRYPT"] = "1"
    return env


class Slot:
    """One rank's place in a job, as krugrun lays ranks out (docs/krugrun.md)."""

    def __init__(self, rank, size, local_rank, local_size, cross_rank, cross_size, host):
        self.rank, self.size = rank, size
        self.local_rank, self.local_size = local_rank, local_size
        self.cross_rank, self.cross_size = cross_rank, cross_size
        self.host = host

    def __repr__(self):
        return "Slot(rank=%d, size=%d, local=%d/%d, cross=%d/%d, host=%r)" % (
            self.rank, self.size, self.local_rank, self.local_size, self.cross_rank,
            self.cross_size, self.host)


def layout(hosts):
    """Ranks for workers on ``hosts`` (one entry per worker, its host). Returns one Slot per
    worker, in the order given: a host's workers get consecutive ranks (hosts in order of first
    appearance) and local ranks in the order given, so that workers of one host share memory
    and the cross ranks pair up as in a krugrun job."""
    order = []
    for h in hosts:
        if h not in order:
            order.append(h)
    counts = {h: hosts.count(h) for h in order}
    first_rank, next_rank = {}, 0
    for h in order:
        first_rank[h], next_rank = next_rank, next_rank + counts[h]
    seen = {h: 0 for h in order}
    slots = []
    for h in hosts:
        local_rank = seen[h]
        seen[h] += 1
        # Hosts that have a worker with this local rank, in host order.
        with_local = [o for o in order if counts[o] > local_rank]
        slots.append(Slot(first_rank[h] + local_rank, len(hosts), local_rank, counts[h],
                          with_local.index(h), len(with_local), h))
    return slots


def interface_environment(nics):
    """The variables for Horovod's ``nics`` (interface names): krug's planes use the first,
    sorted (KRUG_GLOO_IFACE), NCCL all of them (NCCL_SOCKET_IFNAME); none without nics."""
    if not nics:
        return {}
    nics = sorted(nics)
    return {"KRUG_GLOO_IFACE": nics[0], "NCCL_SOCKET_IFNAME": ",".join(nics)}


def rank_environment(slot, addr, port, secret, job_id, encrypt=False):
    """The environment variables krugrun gives a rank (src/run/launch/rank_env.cc), for ``slot``
    of a job whose rendezvous server listens on addr:port (``encrypt``: the server's
    :attr:`RendezvousServer.encrypt`, which every rank must match)."""
    env = {}
    for name, value in (("RANK", slot.rank), ("SIZE", slot.size),
                        ("LOCAL_RANK", slot.local_rank), ("LOCAL_SIZE", slot.local_size),
                        ("CROSS_RANK", slot.cross_rank), ("CROSS_SIZE", slot.cross_size),
                        ("HOSTNAME", slot.host)):
        env["KRUG_" + name] = env["HOROVOD_" + name] = str(value)
    env["KRUG_RENDEZVOUS_ADDR"] = env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] = addr
    env["KRUG_RENDEZVOUS_PORT"] = env["HOROVOD_GLOO_RENDEZVOUS_PORT"] = str(port)
    env["KRUG_SECRET"] = secret
    env["KRUG_JOB_ID"] = job_id
    env["HOROVOD_CONTROLLER"] = "gloo"
    if encrypt:
        env["KRUG_ENCRYPT"] = "1"
    return env
