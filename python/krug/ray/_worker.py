"""The actor class every krug.ray worker runs (one krug rank per actor)."""

import os


class Worker:
    """A krug rank in a Ray actor. The executor sets its environment (a krugrun rank's), may
    create an ``executable_cls`` object in it, and runs functions in it; the functions call
    ``hvd.init()`` themselves, as under krugrun."""

    def __init__(self):
        self.executable = None

    def node(self):
        import ray

        ctx = ray.get_runtime_context()
        return ray.util.get_node_ip_address(), ctx.get_node_id(), os.getpid()

    def gpu_ids(self):
        import ray

        return [str(i) for i in ray.get_gpu_ids()]

    def update_env_vars(self, env):
        os.environ.update({k: str(v) for k, v in env.items()})

    def env_vars(self):
        return dict(os.environ)

    def start_executable(self, executable_cls=None, executable_args=None,
                         executable_kwargs=None):
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or []),
                                             **(executable_kwargs or {}))

    def execute(self, fn):
        """fn(executable) in this actor."""
        return fn(self.executable)

    def run(self, fn, args, kwargs):
        return fn(*args, **kwargs)

    def run_elastic(self, fn, args, kwargs):
        """fn(*args, **kwargs) as an elastic worker: returns ("ok", value, final rank), or
        ("removed", None, None) when the job no longer needed this worker."""
        import sys

        from krug.common.elastic import call_worker

        try:
            finished, value = call_worker(fn, args, kwargs)
        except SystemExit as e:
            raise RuntimeError("the worker exited with status %s" % e.code) from None
        if not finished:
            return ("removed", None, None)
        rank = None
        torch_api = sys.modules.get("krug.torch")
        if torch_api is not None and torch_api.is_initialized():
            rank = torch_api.rank()
        return ("ok", value, rank)
