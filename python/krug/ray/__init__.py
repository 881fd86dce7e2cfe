"""Run krug jobs on Ray: Horovod's ``horovod.ray`` API. See docs/ray.md."""

from krug.ray._elastic_executor import ElasticRayExecutor
from krug.ray._executor import RayExecutor

__all__ = ["RayExecutor", "ElasticRayExecutor"]
