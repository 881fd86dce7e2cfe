"""krug.ray.RayExecutor: krug ranks in Ray actors, placed by a placement group, meeting at a
rendezvous server on the driver (Horovod's horovod.ray.RayExecutor)."""

import dataclasses
import secrets
from typing import Optional

from krug.common.rendezvous import (RendezvousServer, interface_environment, layout,
                                    rank_environment)


@dataclasses.dataclass
class Settings:
    """What RayExecutor.create_settings makes (Horovod's MiniSettings)."""
    timeout_s: float = 30
    placement_group_timeout_s: float = 100
    ssh_identity_file: Optional[str] = None
    nics: Optional[set] = None
    verbose: int = 1
    key: str = dataclasses.field(default_factory=lambda: secrets.token_hex(32))


def _raise_worker_error(what, slots, index, error):
    slot = slots[index]
    raise RuntimeError("%s: rank %d on host %s failed: %s" % (what, slot.rank, slot.host,
                                                             error)) from error


class RayExecutor:
    """Runs krug ranks in Ray actors.

    ``num_workers`` actors packed onto the cluster (placement strategy PACK), or
    ``num_hosts`` x ``num_workers_per_host`` actors, the same number on each of num_hosts
    distinct nodes (STRICT_SPREAD). Each actor gets ``cpus_per_worker`` CPUs and, with
    ``use_gpu``, ``gpus_per_worker`` GPUs (default 1). Actors on one node are local ranks of
    one host (shared memory). ``min_workers`` / ``max_workers`` make the job elastic (see
    :mod:`krug.ray._elastic` and docs/ray.md)."""

    @classmethod
    def create_settings(cls, timeout_s=30, ssh_identity_file=None, ssh_str=None,
                        placement_group_timeout_s=100, nics=None):
        """Settings for a RayExecutor: ``timeout_s`` bounds the ranks' rendezvous,
        ``placement_group_timeout_s`` the wait for the cluster's resources, ``nics`` (names of
        network interfaces) picks the one krug's planes use (the first, sorted) and those of
        NCCL. ssh options are accepted for Horovod compatibility; krug does not use ssh on
        Ray."""
        del ssh_str
        return Settings(timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s,
                        ssh_identity_file=ssh_identity_file, nics=nics)

    def __init__(self, settings, num_workers=None, num_hosts=None, num_workers_per_host=1,
                 cpus_per_worker=1, use_gpu=False, gpus_per_worker=None,
                 use_current_placement_group=True, min_workers=None, max_workers=None,
                 reset_limit=None, cooldown_range=None, elastic_timeout=1200,
                 override_discovery=True, cpus_per_slot=None, gpus_per_slot=None):
        if gpus_per_worker and not use_gpu:
            raise ValueError("krug.ray: gpus_per_worker is set but use_gpu is False; set "
                             "use_gpu=True to give the workers GPUs")
        if use_gpu and gpus_per_worker is not None and gpus_per_worker < 1:
            raise ValueError("krug.ray: gpus_per_worker must be at least 1, got %r"
                             % gpus_per_worker)
        self._elastic = None
        if min_workers is not None or max_workers is not None:
            if num_hosts is not None:
                raise ValueError("krug.ray: elastic mode (min_workers / max_workers) places "
                                 "workers one by one: give num_workers, not num_hosts")
            low = min_workers if min_workers is not None else (num_workers or 1)
            high = max_workers if max_workers is not None else max(num_workers or low, low)
            if not 1 <= low <= high:
                raise ValueError("krug.ray: need 1 <= min_workers <= max_workers, got %r and %r"
                                 % (min_workers, max_workers))
            self._elastic = {"min_np": low, "max_np": high, "reset_limit": reset_limit,
                             "elastic_timeout": float(elastic_timeout)}
            num_workers = high
        if num_workers is None and num_hosts is None:
            raise ValueError("krug.ray: give num_workers, or num_hosts and num_workers_per_host")
        if num_workers is not None and num_hosts is not None:
            raise ValueError("krug.ray: give num_workers or num_hosts, not both")
        count = num_workers if num_workers is not None else num_hosts * num_workers_per_host
        if count < 1:
            raise ValueError("krug.ray: the job needs at least one worker, got %d" % count)
        self.settings = settings or Settings()
        self.num_workers = count
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.cpus_per_worker = cpus_per_slot if cpus_per_slot is not None else cpus_per_worker
        self.use_gpu = use_gpu
        gpus = gpus_per_slot if gpus_per_slot is not None else gpus_per_worker
        self.gpus_per_worker = (gpus or 1) if use_gpu else 0
        self.use_current_placement_group = use_current_placement_group
        self.workers = []
        self.slots = []
        self._placement_group = None  # the one this executor made (and removes)
        self._any_bundle = False      # workers go to any bundle of a group that is not ours
        self._rendezvous = None

    # -- placement ---------------------------------------------------------------------------

    def _bundles(self):
        if self.num_hosts is None:
            per = {"CPU": self.cpus_per_worker}
            if self.gpus_per_worker:
                per["GPU"] = self.gpus_per_worker
            return [per] * self.num_workers, "PACK"
        per = {"CPU": self.cpus_per_worker * self.num_workers_per_host}
        if self.gpus_per_worker:
            per["GPU"] = self.gpus_per_worker * self.num_workers_per_host
        return [per] * self.num_hosts, "STRICT_SPREAD"

    def _create_placement_group(self):
        import ray
        from ray.util.placement_group import get_current_placement_group, placement_group

        current = get_current_placement_group() if self.use_current_placement_group else None
        if current is not None:
            # Inside a placement group already (a Ray Tune trial's): its resources were reserved
            # for this job, and a second group would wait for as many again.
            self._any_bundle = True
            return current
        bundles, strategy = self._bundles()
        pg = placement_group(bundles, strategy=strategy)
        self._placement_group = pg
        ready, _ = ray.wait([pg.ready()], timeout=self.settings.placement_group_timeout_s)
        if not ready:
            raise TimeoutError(
                "krug.ray: the cluster could not place %d bundle(s) %s (strategy %s) within "
                "placement_group_timeout_s=%s s; resources available now: %s. Lower num_workers "
                "or cpus_per_worker, add nodes, or raise the timeout on an autoscaling cluster"
                % (len(bundles), bundles[0], strategy, self.settings.placement_group_timeout_s,
                   ray.available_resources()))
        return pg

    def _create_workers(self, pg):
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from krug.ray._worker import Worker

        remote = ray.remote(Worker)
        workers = []
        per_bundle = 1 if self.num_hosts is None else self.num_workers_per_host
        for index in range(self.num_workers):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=pg,
                placement_group_bundle_index=-1 if self._any_bundle else index // per_bundle)
            workers.append(remote.options(num_cpus=self.cpus_per_worker,
                                          num_gpus=self.gpus_per_worker,
                                          scheduling_strategy=strategy).remote())
        return workers

    # -- public API --------------------------------------------------------------------------

    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None,
              extra_env_vars=None):
        """Places the actors, gives each its rank (actors of one node are consecutive local
        ranks), starts the rendezvous server on this driver and creates ``executable_cls(
        *executable_args, **executable_kwargs)`` in every actor."""
        import ray

        if self._elastic is not None:
            from krug.ray._elastic import ElasticJob

            self._elastic_job = ElasticJob(self, executable_cls, executable_args,
                                           executable_kwargs, extra_env_vars)
            return
        try:
            pg = self._create_placement_group()
            workers = self._create_workers(pg)
            try:
                nodes = ray.get([w.node.remote() for w in workers],
                                timeout=self.settings.placement_group_timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(
                    "krug.ray: %d worker(s) of %s CPU(s)%s each could not all start within "
                    "placement_group_timeout_s=%s s in %s; resources available now: %s"
                    % (self.num_workers, self.cpus_per_worker,
                       " and %s GPU(s)" % self.gpus_per_worker if self.gpus_per_worker else "",
                       self.settings.placement_group_timeout_s,
                       "the current placement group" if self._any_bundle else
                       "the placement group", ray.available_resources())) from None
            # Simulated nodes of one machine share an IP: the node id tells them apart.
            hosts = ["%s/%s" % (ip, node_id[:8]) for ip, node_id, _ in nodes]
            slots = layout(hosts)
            order = sorted(range(len(workers)), key=lambda i: slots[i].rank)
            self.workers = [workers[i] for i in order]
            self.slots = [slots[i] for i in order]
            self._nodes = [nodes[i] for i in order]
            self._rendezvous = RendezvousServer("0.0.0.0")
            addr = ray.util.get_node_ip_address()
            envs = []
            for slot in self.slots:
                env = rank_environment(slot, addr, self._rendezvous.port, self._rendezvous.secret,
                                       self._rendezvous.job_id, encrypt=self._rendezvous.encrypt)
                env.update(self._settings_env())
                env.update(extra_env_vars or {})
                envs.append(env)
            if self.gpus_per_worker:
                self._share_visible_gpus(envs)
            ray.get([w.update_env_vars.remote(e) for w, e in zip(self.workers, envs)])
            ray.get([w.start_executable.remote(executable_cls, executable_args, executable_kwargs)
                     for w in self.workers])
        except BaseException:
            self.shutdown()
            raise

    def _settings_env(self):
        """The variables every worker gets from the settings, static or elastic."""
        env = {"KRUG_TIMEOUT_SECONDS": str(self.settings.timeout_s)}
        env.update(interface_environment(self.settings.nics))
        return env

    def _share_visible_gpus(self, envs):
        # Every actor of a node sees all the node's GPUs of the job (peer access between them),
        # and picks its own with its local rank, as under krugrun.
        import ray

        ids = ray.get([w.gpu_ids.remote() for w in self.workers])
        by_host = {}
        for slot, gpu in zip(self.slots, ids):
            by_host.setdefault(slot.host, []).extend(gpu)
        for slot, env in zip(self.slots, envs):
            env["CUDA_VISIBLE_DEVICES"] = ",".join(by_host[slot.host])

    def _gather(self, refs):
        import ray

        results = [None] * len(refs)
        pending = {ref: i for i, ref in enumerate(refs)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                index = pending.pop(ref)
                try:
                    results[index] = ray.get(ref)
                except Exception as e:  # noqa: B902 - a task error or a dead actor
                    _raise_worker_error("krug.ray", self.slots, index, e)
        return results

    def execute(self, fn, callbacks=None):
        """``fn(executable)`` on every worker; the results in rank order."""
        self._check_started()
        return self._gather([w.execute.remote(fn) for w in self.workers])

    def run(self, fn, args=None, kwargs=None, callbacks=None):
        """``fn(*args, **kwargs)`` on every worker; the results in rank order. Raises
        RuntimeError naming the rank and node of the first worker that fails. In elastic mode,
        fn uses krug's elastic API; a worker that dies is replaced (resources permitting) and
        joins at the next commit; the results are those of the workers that finished."""
        if self._elastic is not None:
            if getattr(self, "_elastic_job", None) is None:
                raise RuntimeError("krug.ray: RayExecutor.start() must be called first")
            return self._elastic_job.run(fn, list(args or []), dict(kwargs or {}))
        return self._gather(self.run_remote(fn, args, kwargs))

    def run_remote(self, fn, args=None, kwargs=None):
        """Like run, without waiting: the ObjectRefs (rank order) to ray.get."""
        self._check_started()
        args, kwargs = list(args or []), dict(kwargs or {})
        return [w.run.remote(fn, args, kwargs) for w in self.workers]

    def execute_single(self, fn):
        """``fn(executable)`` on the rank 0 worker only."""
        self._check_started()
        return self._gather([self.workers[0].execute.remote(fn)])[0]

    def shutdown(self):
        """Kills the actors, frees the placement group and stops the rendezvous server."""
        import ray

        if getattr(self, "_elastic_job", None) is not None:
            self._elastic_job.shutdown()
            self._elastic_job = None
        for w in self.workers:
            ray.kill(w, no_restart=True)
        self.workers, self.slots = [], []
        if self._placement_group is not None:
            ray.util.remove_placement_group(self._placement_group)
            self._placement_group = None
        if self._rendezvous is not None:
            self._rendezvous.stop()
            self._rendezvous = None

    def _check_started(self):
        if self._elastic is not None:
            raise RuntimeError("krug.ray: in elastic mode only run() is available (workers come "
                               "and go; there is no fixed set to execute on)")
        if not self.workers:
            raise RuntimeError("krug.ray: RayExecutor.start() must be called first (or the "
                               "executor was shut down)")
