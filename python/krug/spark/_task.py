"""What every Spark task of a krug.spark job runs (on an executor).

The task learns where all tasks of the stage run (BarrierTaskContext.getTaskInfos in a barrier
stage; from the driver, which every task tells its host, in a stage without barrier mode, which
Spark requires under dynamic allocation), derives its rank as krugrun would lay ranks out on
those hosts (tasks of one executor host get consecutive local ranks and share memory), starts
the rank as a child process with a krugrun rank's environment, forwards its output lines and its
result to the driver, and returns. It never raises for the rank's own failure: the driver
cancels the job instead, so Spark does not retry the stage."""

import ctypes
import os
import select
import signal
import subprocess
import sys

import krug
from krug.common.messages import MessageClient
from krug.common.rendezvous import elastic_worker_environment, layout, rank_environment

_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    # Runs in the child between fork and exec: the rank is killed when the task's worker dies
    # (Spark kills the Python workers of a cancelled stage).
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _host_of(address):
    # "host:port", IPv6 hosts in brackets.
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") else host


class _Lines:
    """One output pipe of the rank: bytes read from it, sent to the driver a line at a time."""

    def __init__(self, fd, name, client, tag):
        self.fd, self.name, self.client, self.tag = fd, name, client, tag
        self.partial = b""

    def read(self):
        """Forwards what one read returns; False at end of file (after the last partial line).
        Raises BlockingIOError when the (non-blocking) pipe is empty."""
        chunk = os.read(self.fd, 65536)
        if not chunk:
            if self.partial:
                self._send(self.partial)
                self.partial = b""
            return False
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        for line in lines:
            self._send(line + b"\n")
        return True

    def _send(self, line):
        self.client.send("out", self.tag, self.name, line.decode(errors="replace"))


def _forward_output(proc, ready_fd, client, tag, on_ready):
    """Forwards the rank's output lines until both its pipes close. When the rank says its
    outcome is written (a byte on ``ready_fd``, or its end of file), first forwards what the
    pipes hold, which is everything it printed before (it flushed first), then calls
    ``on_ready(written)`` (``written``: the rank said so, it did not die first): one thread
    reads both the output and the signal, so a line the rank printed before returning can
    never reach the driver after its result."""
    streams = {s.fileno(): _Lines(s.fileno(), n, client, tag)
               for s, n in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))}
    poller = select.poll()  # not select(): an executor may have descriptors above 1023
    for fd in [*streams, ready_fd]:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    waiting_for_ready = True
    while streams or waiting_for_ready:
        events = {fd for fd, _ in poller.poll()}
        for fd in events & streams.keys():
            _forward_available(streams, fd, poller, all_of_it=False)
        if waiting_for_ready and ready_fd in events:
            for fd in list(streams):
                _forward_available(streams, fd, poller, all_of_it=True)
            written = os.read(ready_fd, 1) == b"r"  # b"" when the rank died before that
            poller.unregister(ready_fd)
            waiting_for_ready = False
            on_ready(written)
    for s in (proc.stdout, proc.stderr):
        s.close()


def _forward_available(streams, fd, poller, all_of_it):
    """Forwards one read from pipe ``fd``, or (``all_of_it``) reads until it is empty; at its
    end of file the pipe leaves ``streams``."""
    try:
        while streams[fd].read():
            if not all_of_it:
                return
    except BlockingIOError:
        return
    del streams[fd]
    poller.unregister(fd)


def _child_environment(job, krug_env):
    env = dict(os.environ)
    env.update(job["env"])
    env.update(krug_env)
    # The rank imports this task's krug; the rest of its path is the task's (not all of
    # sys.path: site directories there would shadow the interpreter's own packages).
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(krug.__file__)))
    paths = [package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def run_rank(job, env, tag, client, report, early):
    """Runs one rank (``env``: its krug environment) to its end; its output lines go to the
    driver under ``tag``. Calls ``report(exit status, result)`` once: result is the pickled
    outcome the rank wrote, or the text saying how it died without one. ``early``: report as
    soon as the outcome is written (status 0 then), before the rank's process has exited."""
    # The payload and the outcome travel in anonymous memory files, not in a directory: Spark
    # kills the task's worker when it cancels a stage (as the driver does on any failure), and
    # a killed worker would leave a directory with the pickled function on the executor.
    with _Descriptors() as fds:
        payload_fd = fds.own(_memory_file("krug-spark-payload", job["payload"]))
        result_fd = fds.own(_memory_file("krug-spark-result", b""))
        ready_r, ready_w = (fds.own(fd) for fd in os.pipe())
        proc = subprocess.Popen(
            [job.get("executable") or sys.executable, "-m", "krug.spark._rank", str(payload_fd),
             str(result_fd),
             str(ready_w)],
            env=_child_environment(job, env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent, pass_fds=(payload_fd, result_fd, ready_w))
        # Only the rank holds these now: its death ends the ready pipe, and the payload's
        # memory goes once the rank has read it.
        fds.close(ready_w)
        fds.close(payload_fd)
        data = None

        def on_ready(written):
            nonlocal data
            if written:
                data = _read_memory_file(result_fd)
            if early and data is not None:
                report(0, data)

        _forward_output(proc, ready_r, client, tag, on_ready)
    code = proc.wait()
    if not (early and data is not None):
        how = ("was killed by signal %d" % -code) if code < 0 else \
            ("exited with status %d" % code)
        report(code, data if data is not None else
               "the rank's process %s before returning a result" % how)


class _Descriptors:
    """File descriptors owned by one call: close() closes one early, leaving the block closes
    the rest, whatever ended it (a task's worker lives on for the next task)."""

    def __init__(self):
        self._open = []

    def own(self, fd):
        self._open.append(fd)
        return fd

    def close(self, fd):
        self._open.remove(fd)
        os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        while self._open:
            os.close(self._open.pop())


def _memory_file(name, data):
    """A file descriptor of an anonymous in-memory file holding ``data``; it is gone once the
    last process holding it closes it or dies."""
    fd = os.memfd_create(name)
    try:
        with open(fd, "wb", closefd=False) as f:
            f.write(data)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_memory_file(fd):
    # The child wrote through its own copy of the descriptor, which shares this one's offset.
    with open(fd, "rb", closefd=False) as f:
        f.seek(0)
        return f.read()


def _assigned_gpus():
    from pyspark import TaskContext

    from krug.spark.task import assigned_gpus_environment

    return assigned_gpus_environment(TaskContext.get())


def _run_slot(job, slot, client):
    """Runs the rank of ``slot`` to its end, reporting to the driver through ``client``."""
    env = rank_environment(slot, job["rendezvous_addr"], job["rendezvous_port"], job["secret"],
                           job["job_id"], encrypt=job["encrypt"])
    env.update(_assigned_gpus())
    client.send("started", slot.rank, slot.host)
    run_rank(job, env, slot.rank, client,
             lambda code, data: client.send("done", slot.rank, slot.host, code, data),
             early=True)


def barrier_task(job):
    """The mapPartitions function of krug.spark.run's barrier stage (``job``: the driver's
    dict)."""

    def task(_):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        hosts = [_host_of(info.address) for info in ctx.getTaskInfos()]
        slot = layout(hosts)[ctx.partitionId()]
        client = MessageClient(job["driver_addr"], job["message_port"], job["secret"],
                               encrypt=job["encrypt"])
        try:
            _run_slot(job, slot, client)
        finally:
            client.close()
        return iter([slot.rank])

    return task


def gang_task(job):
    """The mapPartitions function of krug.spark.run's stage without barrier mode: the task tells
    the driver its host and waits (up to the start timeout) for every task's, which the driver
    sends once all tasks run. A retried task (its first attempt was lost, which fails the job)
    runs nothing."""

    def task(_):
        import socket

        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx.attemptNumber() > 0:
            return iter([])
        partition = ctx.partitionId()
        client = MessageClient(job["driver_addr"], job["message_port"], job["secret"],
                               encrypt=job["encrypt"])
        try:
            client.send("hello", partition, socket.gethostname())
            try:
                _, hosts = client.receive(job["start_timeout"])
            except (TimeoutError, ConnectionError):
                return iter([])  # the driver reports what went wrong
            _run_slot(job, layout(hosts)[partition], client)
        finally:
            client.close()
        return iter([partition])

    return task


def elastic_task(job):
    """The mapPartitions function of krug.spark.run_elastic's stage: every task attempt is an
    elastic worker of its own id; a retried task is a new worker that joins the next round."""

    def task(_):
        import socket

        from pyspark import TaskContext

        ctx = TaskContext.get()
        worker = "p%da%d" % (ctx.partitionId(), ctx.attemptNumber())
        host = socket.gethostname()
        env = elastic_worker_environment(worker, host, job["rendezvous_addr"],
                                         job["rendezvous_port"], job["secret"], job["job_id"],
                                         encrypt=job["encrypt"])
        env.update(_assigned_gpus())
        client = MessageClient(job["driver_addr"], job["message_port"], job["secret"],
                               encrypt=job["encrypt"])
        try:
            client.send("started", worker, host)
            run_rank(job, env, worker, client,
                     lambda code, data: client.send("done", worker, host, code, data),
                     early=False)
        finally:
            client.close()
        return iter([worker])

    return task
