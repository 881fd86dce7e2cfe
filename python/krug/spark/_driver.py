"""The driver side of krug.spark.run: checks, rendezvous, one stage of ranks, results."""

import os
import queue
import sys
import threading
import time
import uuid

try:
    import cloudpickle
except ImportError:  # pragma: no cover - PySpark ships a copy
    from pyspark import cloudpickle

from krug.common.messages import MessageServer
from krug.common.rendezvous import ElasticRendezvous, RendezvousServer, interface_environment
from krug.spark._task import barrier_task, elastic_task, gang_task

_DEFAULT_START_TIMEOUT = 600.0


def start_timeout_or_default(start_timeout):
    """Horovod's rule: the argument, else HOROVOD_SPARK_START_TIMEOUT (or krug's
    KRUG_SPARK_START_TIMEOUT), else 600 s."""
    if start_timeout is not None:
        return float(start_timeout)
    for name in ("KRUG_SPARK_START_TIMEOUT", "HOROVOD_SPARK_START_TIMEOUT"):
        if os.environ.get(name):
            return float(os.environ[name])
    return _DEFAULT_START_TIMEOUT


def active_context():
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError("krug.spark: no active SparkContext; create a SparkSession (or "
                           "SparkContext) before calling krug.spark.run")
    return sc


def task_slots(sc):
    """How many tasks the cluster can run at once now (what a barrier stage needs)."""
    jsc = sc._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    return int(jsc.maxNumConcurrentTasks(profile))


def wait_for_slots(sc, num_proc, start_timeout, what):
    """Waits until the cluster has num_proc task slots (executors may still be registering);
    raises naming the missing slots after start_timeout."""
    deadline = time.monotonic() + start_timeout
    while True:
        slots = task_slots(sc)
        if slots >= num_proc:
            return slots
        if time.monotonic() >= deadline:
            raise RuntimeError(
                "%s: timed out after %.0f s waiting for %d task slots: the cluster has %d, %d "
                "missing. Every krug rank runs in a Spark task and all run at once (barrier "
                "mode): lower num_proc, add executors or cores, or raise start_timeout if "
                "executors are allocated on demand" % (what, start_timeout, num_proc, slots,
                                                       num_proc - slots))
        time.sleep(0.2)


def dynamic_allocation(sc):
    """Whether Spark allocates executors on demand here (its own rule: not in local mode)."""
    conf = sc.getConf()
    enabled = conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true"
    master = sc.master or ""
    local = master == "local" or master.startswith("local[")
    testing = conf.get("spark.dynamicAllocation.testing", "false").lower() == "true"
    return enabled and (not local or testing)


def barrier_mode(sc):
    """Whether krug.spark.run's ranks run as a barrier stage: yes unless dynamic allocation is
    on (Spark refuses barrier stages then) or KRUG_SPARK_BARRIER=0; KRUG_SPARK_BARRIER=1 forces
    it."""
    choice = os.environ.get("KRUG_SPARK_BARRIER", "").strip().lower()
    if choice in ("0", "false", "no"):
        return False
    if choice in ("1", "true", "yes"):
        return True
    if choice:
        raise ValueError("KRUG_SPARK_BARRIER=%r: use 1 (barrier stage), 0 (tasks that learn "
                         "each other's hosts from the driver) or leave it unset" % choice)
    return not dynamic_allocation(sc)


def pickled_payload(fn, args, kwargs, what):
    try:
        return cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
    except Exception as e:  # noqa: B902 - cloudpickle raises many types
        raise TypeError("%s: fn and its arguments must be picklable (cloudpickle) to reach the "
                        "Spark tasks, but pickling failed: %s: %s" % (what, type(e).__name__, e))


def driver_addresses(sc):
    """(address the tasks dial, address to bind) for the driver's servers."""
    master = sc.master or ""
    if master.startswith("local"):  # local and local-cluster: every executor is on this machine
        return "127.0.0.1", "127.0.0.1"
    return sc.getConf().get("spark.driver.host"), "0.0.0.0"


def _status(code):
    """A child's Popen return code as a shell exit status (128 + signal when killed)."""
    return 128 - code if code < 0 else code


class _Job:
    """One Spark stage of krug ranks, and the driver's view of it: a barrier stage of num_proc
    ranks (run), or max_np elastic workers (run_elastic, ``elastic`` = its limits)."""

    def __init__(self, sc, num_proc, payload, env, start_timeout, stdout, stderr, verbose, what,
                 elastic=None, barrier=True):
        self.sc, self.num_proc, self.what = sc, num_proc, what
        self.start_timeout, self.verbose = start_timeout, verbose
        self.stdout = stdout if stdout is not None else sys.stdout
        self.stderr = stderr if stderr is not None else sys.stderr
        self.payload, self.env = payload, dict(env or {})
        self.timestamps, self.executable = False, None  # see with_horovod_options()
        self.elastic, self.barrier = elastic, barrier
        self.group = "krug-spark-" + uuid.uuid4().hex[:12]
        self.stage_error = None

    def _run_stage(self, job):
        try:
            self.sc.setJobGroup(self.group, "%s: %d krug ranks" % (self.what, self.num_proc),
                                interruptOnCancel=True)
            rdd = self.sc.parallelize(range(self.num_proc), self.num_proc)
            if self.elastic is not None:
                rdd.mapPartitions(elastic_task(job)).collect()
            elif self.barrier:
                rdd.barrier().mapPartitions(barrier_task(job)).collect()
            else:
                rdd.mapPartitions(gang_task(job)).collect()
        except Exception as e:  # noqa: B902 - reported by the driver loop
            self.stage_error = e

    def run(self):
        addr, bind = driver_addresses(self.sc)
        if self.elastic is None:
            server = RendezvousServer(bind)
        else:
            server = ElasticRendezvous(bind, **self.elastic)
        with server as rdv:
            messages = MessageServer(rdv.secret, bind, encrypt=rdv.encrypt)
            try:
                return self._supervise(addr, rdv, messages)
            finally:
                messages.close()

    def _supervise(self, addr, rdv, messages):
        job = {"payload": self.payload, "env": self.env, "driver_addr": addr,
               "message_port": messages.port, "rendezvous_addr": addr,
               "rendezvous_port": rdv.port, "secret": rdv.secret, "job_id": rdv.job_id,
               "encrypt": rdv.encrypt,
               "start_timeout": self.start_timeout, "executable": self.executable}
        if self.verbose >= 2:
            print("%s: %d ranks, rendezvous server on %s:%d" % (self.what, self.num_proc, addr,
                                                               rdv.port), file=self.stderr)
        stage = threading.Thread(target=self._run_stage, args=(job,), daemon=True)
        stage.start()
        finished = False
        try:
            if self.elastic is None:
                results = self._collect(messages, stage)
            else:
                results = self._collect_elastic(messages.queue, stage, rdv)
            finished = True
            return results
        finally:
            if not finished:
                self.sc.cancelJobGroup(self.group)
            stage.join(60)

    def with_horovod_options(self, nics=None, prefix_output_with_timestamp=False,
                             executable=None):
        """Horovod's run arguments that krug takes: ``nics`` (interfaces: krug's planes use the
        first, sorted; NCCL all), ``prefix_output_with_timestamp``, ``executable`` (the Python
        interpreter of the ranks on the executors)."""
        for name, value in interface_environment(nics).items():
            self.env.setdefault(name, value)
        self.timestamps, self.executable = bool(prefix_output_with_timestamp), executable
        return self

    def _output(self, msg):
        _, tag, name, line = msg
        stream = self.stdout if name == "stdout" else self.stderr
        stamp = time.strftime("%a %b %d %H:%M:%S %Y") if self.timestamps else ""
        stream.write("%s[%s]<%s>:%s" % (stamp, tag, name, line))
        stream.flush()

    def _next(self, inbox, stage, started, expected):
        """The next message, or None after a quiet 0.2 s; raises when the stage ended early or
        fewer than ``expected`` tasks started within start_timeout."""
        try:
            return inbox.get(timeout=0.2)
        except queue.Empty:
            pass
        if not stage.is_alive() and inbox.empty():
            return "stage-ended"
        if len(started) < expected and time.monotonic() > self.start_deadline:
            raise RuntimeError(
                "%s: only %d of %d tasks started within start_timeout=%.0f s (%d task "
                "slot(s) missing); check that the cluster has enough free slots, or raise "
                "start_timeout" % (self.what, len(started), expected, self.start_timeout,
                                   expected - len(started)))
        return None

    def _collect(self, messages, stage):
        inbox = messages.queue
        started, results, reported, hosts = {}, {}, set(), {}
        self.start_deadline = time.monotonic() + self.start_timeout
        # A rank whose collective failed because a peer died reports a HorovodInternalError
        # about that peer; the peer's own error is the root cause, and it usually comes first.
        # If not, it is waited for a moment.
        consequence, consequence_deadline = None, None
        while len(results) < self.num_proc:
            if consequence and time.monotonic() > consequence_deadline:
                raise RuntimeError(consequence)
            msg = self._next(inbox, stage, started, self.num_proc)
            if msg == "stage-ended":
                if consequence:
                    raise RuntimeError(consequence)
                raise RuntimeError("%s: the Spark stage ended before every rank reported a "
                                   "result: %s" % (self.what, self.stage_error or
                                                   "no error from Spark"))
            if msg is None:
                continue
            if msg[0] == "closed":
                if msg[1] not in reported:
                    # Left alone, Spark would rerun the whole barrier stage: every rank's fn
                    # again, against a job whose other ranks are gone.
                    raise RuntimeError(
                        "%s: the Spark task of rank %d on host %s ended without a result: its "
                        "executor or Python worker was lost" % (self.what, msg[1],
                                                                started.get(msg[1])))
                continue
            if msg[0] == "hello":  # a task outside a barrier stage: it waits for every host
                hosts[msg[1]] = msg[2]
                if len(hosts) == self.num_proc:
                    everyone = [hosts[p] for p in range(self.num_proc)]
                    for p in range(self.num_proc):
                        messages.reply(p, "hosts", everyone)
            elif msg[0] == "started":
                started[msg[1]] = msg[2]
            elif msg[0] == "out":
                self._output(msg)
            elif msg[0] == "done":
                _, rank, host, code, data = msg
                reported.add(rank)
                tag, value, _ = cloudpickle.loads(data) if isinstance(data, bytes) else \
                    ("error", data, None)
                if tag != "ok":
                    error = "%s: rank %d on host %s failed:\n%s" % (self.what, rank, host,
                                                                   str(value).rstrip())
                    if "HorovodInternalError" not in str(value):
                        raise RuntimeError(error)
                    if consequence is None:
                        consequence, consequence_deadline = error, time.monotonic() + 2.0
                    continue
                results[rank] = value
        return [results[r] for r in range(self.num_proc)]

    def _collect_elastic(self, inbox, stage, rdv):
        started, done, results, failures = {}, set(), [], []
        self.start_deadline = time.monotonic() + self.start_timeout
        min_np = self.elastic["min_np"]
        while True:
            self._elastic_events(rdv, failures)
            msg = self._next(inbox, stage, started, min_np)
            if msg == "stage-ended":
                break
            if msg is None:
                continue
            kind = msg[0]
            if kind == "started":
                started[msg[1]] = msg[2]
                rdv.add(msg[1], msg[2])
            elif kind == "out":
                self._output(msg)
            elif kind == "done":
                _, worker, host, code, data = msg
                done.add(worker)
                rdv.exited(worker, _status(code))
                tag, value, rank = cloudpickle.loads(data) if isinstance(data, bytes) else \
                    ("error", data, None)
                if tag == "ok":
                    results.append((rank if rank is not None else len(results), value))
                elif tag == "error":
                    failures.append("worker %s on host %s failed:\n%s"
                                    % (worker, host, str(value).rstrip()))
                    if self.verbose:
                        print("%s: worker %s on host %s failed; the others go on from their "
                              "last commit" % (self.what, worker, host), file=self.stderr)
            elif kind == "closed" and msg[1] not in done:
                # The task died with its worker (Spark retries the task as a new worker).
                done.add(msg[1])
                rdv.exited(msg[1], 137)
                failures.append("worker %s on host %s was lost with its Spark task"
                                % (msg[1], started.get(msg[1])))
                if self.verbose:
                    print("%s: %s" % (self.what, failures[-1]), file=self.stderr)
        if results:
            return [value for _, value in sorted(results, key=lambda r: r[0])]
        raise RuntimeError("%s: no worker finished training: %s" % (
            self.what, "; ".join(failures) or self.stage_error or "no error from Spark"))

    def _elastic_events(self, rdv, failures):
        while True:
            try:
                event = rdv.events.get_nowait()
            except queue.Empty:
                return
            if event[0] == "round" and self.verbose:
                print("%s: elastic %s" % (self.what, event[1]), file=self.stderr)
            elif event[0] == "stop" and event[1] != 0:
                raise RuntimeError("%s: %s%s" % (self.what, event[2], "".join(
                    "; " + f for f in failures[-1:])))


def check_no_mpi(use_mpi, extra_mpi_args, what):
    """krug.spark starts no mpirun: asking for it is an error, not a silent change."""
    if use_mpi:
        raise ValueError("%s: use_mpi=True: krug.spark runs its ranks in the Spark tasks and "
                         "connects them with Gloo and shared memory, not mpirun; drop use_mpi"
                         % what)
    if extra_mpi_args:
        raise ValueError("%s: extra_mpi_args=%r: krug.spark starts no mpirun to pass them to; "
                         "set krug's knobs through env instead (docs/configuration.md)"
                         % (what, extra_mpi_args))


def run(fn, args=(), kwargs=None, num_proc=None, start_timeout=None, env=None, stdout=None,
        stderr=None, verbose=1, what="krug.spark.run", horovod_options=None):
    sc = active_context()
    start_timeout = start_timeout_or_default(start_timeout)
    payload = pickled_payload(fn, args, kwargs or {}, what)
    if num_proc is None:
        num_proc = sc.defaultParallelism
    if num_proc < 1:
        raise ValueError("%s: num_proc must be at least 1, got %d" % (what, num_proc))
    if not dynamic_allocation(sc):  # else Spark requests executors as the tasks wait
        wait_for_slots(sc, num_proc, start_timeout, what)
    return _Job(sc, num_proc, payload, env, start_timeout, stdout, stderr, verbose, what,
                barrier=barrier_mode(sc)).with_horovod_options(**(horovod_options or {})).run()


def run_elastic(fn, args=(), kwargs=None, num_proc=None, min_num_proc=None, max_num_proc=None,
                start_timeout=None, elastic_timeout=None, reset_limit=None, env=None,
                stdout=None, stderr=None, verbose=1, what="krug.spark.run_elastic",
                horovod_options=None):
    sc = active_context()
    start_timeout = start_timeout_or_default(start_timeout)
    payload = pickled_payload(fn, args, kwargs or {}, what)
    num_proc = num_proc if num_proc is not None else sc.defaultParallelism
    min_np = min_num_proc if min_num_proc is not None else num_proc
    max_np = max_num_proc if max_num_proc is not None else num_proc
    if not 1 <= min_np <= max_np:
        raise ValueError("%s: need 1 <= min_num_proc <= max_num_proc, got %d and %d"
                         % (what, min_np, max_np))
    if not dynamic_allocation(sc):
        wait_for_slots(sc, min_np, start_timeout, what)
    if elastic_timeout is None:  # Horovod's fallback
        elastic_timeout = float(os.environ.get("HOROVOD_ELASTIC_TIMEOUT") or 600)
    limits = {"min_np": min_np, "reset_limit": reset_limit,
              "elastic_timeout": float(elastic_timeout)}
    return _Job(sc, max_np, payload, env, start_timeout, stdout, stderr, verbose, what,
                elastic=limits).with_horovod_options(**(horovod_options or {})).run()
