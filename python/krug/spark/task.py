"""What a rank of a krug.spark job can ask about the Spark task it runs in (Horovod's
``horovod.spark.task``)."""

import os

# Set by the task for its rank (a child process, where Spark's TaskContext is not available).
_GPUS_VARIABLE = "KRUG_SPARK_TASK_GPUS"


def get_available_devices():
    """The addresses (strings, e.g. ``["1"]``) of the GPUs Spark assigned to this rank's task
    (``spark.task.resource.gpu.amount``), or ``[]`` when it assigned none. On a cluster that
    assigns GPUs, a rank uses these rather than its local rank to pick its device."""
    value = os.environ.get(_GPUS_VARIABLE, "")
    return [a for a in value.split(",") if a]


def device_index(default):
    """The CUDA device index a rank should use: the first GPU Spark assigned to its task, else
    ``default`` (its local rank)."""
    assigned = get_available_devices()
    return int(assigned[0]) if assigned else default


def assigned_gpus_environment(task_context):
    """The variable a task hands its rank: the GPU addresses Spark assigned to the task."""
    resources = task_context.resources() if task_context is not None else {}
    gpu = resources.get("gpu")
    return {_GPUS_VARIABLE: ",".join(gpu.addresses)} if gpu is not None else {}


__all__ = ["get_available_devices"]
