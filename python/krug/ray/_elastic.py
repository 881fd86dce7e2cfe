"""RayExecutor's elastic mode: one krug elastic worker per Ray actor, rounds formed by krugrun's
elastic round logic (``krugrun __elastic-rendezvous``) on the driver.

Up to max_workers actors are requested; each becomes a worker once Ray placed it. An actor that
dies (killed, its node lost) is reported to the round logic: the survivors roll back to their
last commit and re-form without it, and a replacement actor is requested, which joins at the
next commit (hosts-updated interrupt). Once a worker's training function returns the job is
done: workers still asking for a round are told to leave.

An exception raised by the training function (or by ``executable_cls``) is a bug a replacement
would repeat: it ends the job with that exception's traceback instead. Whatever ends run() with
an error also kills the job's actors, so none trains on alone."""

import queue
import time

from krug.common.rendezvous import ElasticRendezvous, elastic_worker_environment


class ElasticJob:
    def __init__(self, executor, executable_cls, executable_args, executable_kwargs,
                 extra_env_vars):
        self.ex = executor
        self.limits = executor._elastic
        self.executable = (executable_cls, executable_args, executable_kwargs)
        self.extra_env = dict(extra_env_vars or {})
        self.rdv = ElasticRendezvous("0.0.0.0", min_np=self.limits["min_np"],
                                     reset_limit=self.limits["reset_limit"],
                                     elastic_timeout=self.limits["elastic_timeout"])
        self.actors = {}  # worker id -> actor handle
        self.next_id = 0
        self.log = []     # what happened, for messages and tests

    def _new_actor(self):
        import ray

        from krug.ray._worker import Worker

        worker = "a%d" % self.next_id
        self.next_id += 1
        actor = ray.remote(Worker).options(num_cpus=self.ex.cpus_per_worker,
                                           num_gpus=self.ex.gpus_per_worker,
                                           max_restarts=0).remote()
        self.actors[worker] = actor
        return worker, actor.node.remote()

    def run(self, fn, args, kwargs):
        try:
            return self._run(fn, args, kwargs)
        except BaseException:
            self._kill_actors()
            raise

    def _run(self, fn, args, kwargs):
        import ray

        self.call = (fn, args, kwargs)
        self.addr = ray.util.get_node_ip_address()
        self.placing = {}  # actor.node() ref -> worker id, until Ray placed the actor
        self.running = {}  # run_elastic() ref -> (worker id, host)
        self.results, self.failures, self.finished = [], [], False
        self.started = 0
        deadline = time.monotonic() + self.ex.settings.placement_group_timeout_s
        none_running_since = None
        for _ in range(self.limits["max_np"]):
            self._request_actor()
        while self.running or (self.placing and not self._done()):
            self._events(self.failures)
            self._check_placement(deadline)
            none_running_since = self._check_survivors(none_running_since)
            ready, _ = ray.wait(list(self.placing) + list(self.running), num_returns=1,
                                timeout=0.2)
            for ref in ready:
                if ref in self.placing:
                    self._start(self.placing.pop(ref), ref)
                else:
                    self._collect(ref)
        for worker in self.placing.values():  # never placed before the job ended
            ray.kill(self.actors.pop(worker), no_restart=True)
        if self.results:
            return [value for _, value in sorted(self.results, key=lambda r: r[0])]
        raise RuntimeError("krug.ray: no elastic worker finished training: %s"
                           % ("; ".join(self.failures) or "no worker could be placed"))

    def _done(self):
        """Whether a worker's training function has returned: the job is over."""
        return self.finished or bool(self.results)

    def _request_actor(self):
        worker, ref = self._new_actor()
        self.placing[ref] = worker
        return worker

    def _check_placement(self, deadline):
        import ray

        if self.started < self.limits["min_np"] and time.monotonic() > deadline:
            raise TimeoutError(
                "krug.ray: only %d of min_workers=%d workers could be placed within "
                "placement_group_timeout_s=%s s; resources available now: %s"
                % (self.started, self.limits["min_np"],
                   self.ex.settings.placement_group_timeout_s, ray.available_resources()))

    def _check_survivors(self, none_running_since):
        """Since when no worker has been running (None: one is), raising once that is longer
        than elastic_timeout: no survivor waits in a round whose timeout would end the job."""
        import ray

        if self.running:
            return None
        if none_running_since is None:
            return time.monotonic()
        if time.monotonic() - none_running_since > self.limits["elastic_timeout"]:
            raise TimeoutError(
                "krug.ray: every worker was lost and no replacement could be placed within "
                "elastic_timeout=%s s (%s); resources available now: %s"
                % (self.limits["elastic_timeout"], "; ".join(self.failures[-3:]),
                   ray.available_resources()))
        return none_running_since

    def _environment(self, worker, host):
        env = elastic_worker_environment(worker, host, self.addr, self.rdv.port,
                                         self.rdv.secret, self.rdv.job_id,
                                         encrypt=self.rdv.encrypt)
        env.update(self.ex._settings_env())
        env.update(self.extra_env)
        return env

    def _start(self, worker, ref):
        """Makes the placed actor of `worker` (`ref`: its node()) an elastic worker: its
        environment, the executable, then the training function."""
        import ray
        from ray.exceptions import RayTaskError

        try:
            ip, node_id, _ = ray.get(ref)
        except Exception as e:  # noqa: B902 - the actor died before it started
            self.failures.append("worker %s died before starting: %s" % (worker, e))
            return
        host = "%s/%s" % (ip, node_id[:8])
        actor = self.actors[worker]
        try:
            ray.get([actor.update_env_vars.remote(self._environment(worker, host)),
                     actor.start_executable.remote(*self.executable)])
        except RayTaskError as e:
            raise RuntimeError("krug.ray: executable_cls failed on worker %s (host "
                               "%s):\n%s" % (worker, host, e)) from None
        except Exception as e:  # noqa: B902 - the actor died while starting
            self.failures.append("worker %s died while starting: %s" % (worker, e))
            ray.kill(self.actors.pop(worker), no_restart=True)
            self._request_actor()
            return
        self.rdv.add(worker, host)
        self.started += 1
        self.log.append("started %s on %s" % (worker, host))
        self.running[actor.run_elastic.remote(*self.call)] = (worker, host)

    def _collect(self, ref):
        """A worker's training function returned, raised, or its actor died."""
        import ray
        from ray.exceptions import RayTaskError

        worker, host = self.running.pop(ref)
        try:
            tag, value, rank = ray.get(ref)
        except RayTaskError as e:  # fn raised: a replacement would only repeat it
            self.rdv.exited(worker, 1)
            raise RuntimeError("krug.ray: the training function raised on worker %s "
                               "(host %s); the job stops:\n%s" % (worker, host, e)) from None
        except Exception as e:  # noqa: B902 - the actor died (killed, node lost)
            self.rdv.exited(worker, 1)
            self._lost(worker, host, e)
            return
        self.rdv.exited(worker, 0)
        if tag == "ok":
            self.finished = True
            self.results.append((rank if rank is not None else len(self.results), value))

    def _lost(self, worker, host, error):
        """Forgets the dead actor of `worker` and, while the job goes on, asks for another."""
        import ray

        self.failures.append("worker %s on host %s failed: %s" % (worker, host, error))
        self.log.append("lost %s" % worker)
        ray.kill(self.actors.pop(worker), no_restart=True)
        if not self._done():
            new_worker = self._request_actor()
            self.log.append("replacing %s with %s" % (worker, new_worker))

    def _events(self, failures):
        while True:
            try:
                event = self.rdv.events.get_nowait()
            except queue.Empty:
                return
            if event[0] == "round":
                self.log.append(event[1])
                if self.ex.settings.verbose:
                    print("krug.ray: elastic %s" % event[1], flush=True)
            elif event[0] == "stop" and event[1] != 0:
                raise RuntimeError("krug.ray: %s%s" % (event[2], "".join(
                    "; " + f for f in failures[-1:])))

    def _kill_actors(self):
        import ray

        for actor in self.actors.values():
            ray.kill(actor, no_restart=True)
        self.actors = {}

    def shutdown(self):
        self._kill_actors()
        self.rdv.stop()
