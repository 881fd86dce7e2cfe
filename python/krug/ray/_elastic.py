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
        from ray.exceptions import RayTaskError

        addr = ray.util.get_node_ip_address()
        placing, running = {}, {}
        results, failures, finished = [], [], False
        deadline = time.monotonic() + self.ex.settings.placement_group_timeout_s
        started = 0
        none_running_since = None
        for _ in range(self.limits["max_np"]):
            worker, ref = self._new_actor()
            placing[ref] = worker
        while running or (placing and not finished and not results):
            self._events(failures)
            if started < self.limits["min_np"] and time.monotonic() > deadline:
                raise TimeoutError(
                    "krug.ray: only %d of min_workers=%d workers could be placed within "
                    "placement_group_timeout_s=%s s; resources available now: %s"
                    % (started, self.limits["min_np"], self.ex.settings.placement_group_timeout_s,
                       ray.available_resources()))
            if running:
                none_running_since = None
            elif none_running_since is None:
                none_running_since = time.monotonic()
            elif time.monotonic() - none_running_since > self.limits["elastic_timeout"]:
                # No survivor waits in a round whose timeout would end the job: bound it here.
                raise TimeoutError(
                    "krug.ray: every worker was lost and no replacement could be placed within "
                    "elastic_timeout=%s s (%s); resources available now: %s"
                    % (self.limits["elastic_timeout"], "; ".join(failures[-3:]),
                       ray.available_resources()))
            ready, _ = ray.wait(list(placing) + list(running), num_returns=1, timeout=0.2)
            for ref in ready:
                if ref in placing:
                    worker = placing.pop(ref)
                    try:
                        ip, node_id, _ = ray.get(ref)
                    except Exception as e:  # noqa: B902 - the actor died before it started
                        failures.append("worker %s died before starting: %s" % (worker, e))
                        continue
                    host = "%s/%s" % (ip, node_id[:8])
                    env = elastic_worker_environment(worker, host, addr, self.rdv.port,
                                                     self.rdv.secret, self.rdv.job_id)
                    env.update(self.ex._settings_env())
                    env.update(self.extra_env)
                    actor = self.actors[worker]
                    try:
                        ray.get([actor.update_env_vars.remote(env),
                                 actor.start_executable.remote(*self.executable)])
                    except RayTaskError as e:
                        raise RuntimeError("krug.ray: executable_cls failed on worker %s (host "
                                           "%s):\n%s" % (worker, host, e)) from None
                    except Exception as e:  # noqa: B902 - the actor died while starting
                        failures.append("worker %s died while starting: %s" % (worker, e))
                        ray.kill(self.actors.pop(worker), no_restart=True)
                        new_worker, new_ref = self._new_actor()
                        placing[new_ref] = new_worker
                        continue
                    self.rdv.add(worker, host)
                    started += 1
                    self.log.append("started %s on %s" % (worker, host))
                    running[actor.run_elastic.remote(fn, args, kwargs)] = (worker, host)
                    continue
                worker, host = running.pop(ref)
                try:
                    tag, value, rank = ray.get(ref)
                except RayTaskError as e:  # fn raised: a replacement would only repeat it
                    self.rdv.exited(worker, 1)
                    raise RuntimeError("krug.ray: the training function raised on worker %s "
                                       "(host %s); the job stops:\n%s"
                                       % (worker, host, e)) from None
                except Exception as e:  # noqa: B902 - the actor died (killed, node lost)
                    self.rdv.exited(worker, 1)
                    failures.append("worker %s on host %s failed: %s" % (worker, host, e))
                    self.log.append("lost %s" % worker)
                    ray.kill(self.actors.pop(worker), no_restart=True)
                    if not finished and not results:
                        new_worker, new_ref = self._new_actor()
                        placing[new_ref] = new_worker
                        self.log.append("replacing %s with %s" % (worker, new_worker))
                    continue
                self.rdv.exited(worker, 0)
                if tag == "ok":
                    finished = True
                    results.append((rank if rank is not None else len(results), value))
        for ref, worker in placing.items():  # never placed before the job ended
            ray.kill(self.actors.pop(worker), no_restart=True)
        if results:
            return [value for _, value in sorted(results, key=lambda r: r[0])]
        raise RuntimeError("krug.ray: no elastic worker finished training: %s"
                           % ("; ".join(failures) or "no worker could be placed"))

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
