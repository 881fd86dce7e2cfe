"""krug.ray.ElasticRayExecutor: Horovod's first elastic entry point on Ray, kept for the scripts
written against it, over RayExecutor's elastic mode (min_workers / max_workers)."""

import dataclasses

from krug.ray._executor import RayExecutor


@dataclasses.dataclass
class ElasticSettings:
    """What ElasticRayExecutor.create_settings makes."""
    executor_settings: object
    min_np: int = 1
    max_np: int = None
    reset_limit: int = None
    elastic_timeout: float = 600


class ElasticRayExecutor:
    """Horovod's ``ElasticRayExecutor``: ``create_settings(min_np, max_np, ...)``, then
    ``ElasticRayExecutor(settings, use_gpu, cpus_per_slot, gpus_per_slot, env_vars)``,
    ``start()``, ``run(worker_fn)`` (``worker_fn()`` trains with krug's elastic API and returns
    its result) and ``shutdown()``. Workers are placed one by one as Ray has room for them,
    a dead one is replaced (docs/ray.md, Elastic mode)."""

    @staticmethod
    def create_settings(min_np=1, max_np=None, reset_limit=None, elastic_timeout=600,
                        timeout_s=30, ssh_identity_file=None, nics=None,
                        placement_group_timeout_s=100, **kwargs):
        """``max_np`` None: as many workers as the cluster's CPUs hold when start() runs.
        Other keyword arguments of Horovod's (discovery settings) are accepted and unused:
        Ray itself says where workers fit."""
        del kwargs
        settings = RayExecutor.create_settings(timeout_s=timeout_s,
                                               ssh_identity_file=ssh_identity_file,
                                               placement_group_timeout_s=placement_group_timeout_s,
                                               nics=nics)
        return ElasticSettings(settings, min_np, max_np, reset_limit, elastic_timeout)

    def __init__(self, settings, use_gpu=False, cpus_per_slot=1, gpus_per_slot=None,
                 env_vars=None, override_discovery=True):
        del override_discovery
        if not isinstance(settings, ElasticSettings):
            raise TypeError("krug.ray: ElasticRayExecutor takes the settings of "
                            "ElasticRayExecutor.create_settings(min_np=..., max_np=...)")
        self.settings = settings
        self.use_gpu, self.cpus_per_slot, self.gpus_per_slot = use_gpu, cpus_per_slot, gpus_per_slot
        self.env_vars = dict(env_vars or {})
        self._executor = None

    def _max_np(self):
        if self.settings.max_np is not None:
            return self.settings.max_np
        import ray

        fit = int(ray.cluster_resources().get("CPU", 0) // max(self.cpus_per_slot, 1e-9))
        return max(fit, self.settings.min_np)

    def start(self):
        self._executor = RayExecutor(
            self.settings.executor_settings, cpus_per_worker=self.cpus_per_slot,
            use_gpu=self.use_gpu, gpus_per_worker=self.gpus_per_slot if self.use_gpu else None,
            min_workers=self.settings.min_np, max_workers=self._max_np(),
            reset_limit=self.settings.reset_limit,
            elastic_timeout=self.settings.elastic_timeout)
        self._executor.start(extra_env_vars=self.env_vars)

    def run(self, worker_fn, callbacks=None):
        """``worker_fn()`` on every worker; the results of the workers that finished."""
        del callbacks
        if self._executor is None:
            raise RuntimeError("krug.ray: ElasticRayExecutor.start() must be called first")
        return self._executor.run(worker_fn)

    def shutdown(self):
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None
