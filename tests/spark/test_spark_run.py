"""krug.spark.run on a local Spark cluster of two executor processes."""

import io
import threading
import time

import pytest

import krug.spark
from conftest import assert_no_stray_processes, by_value

by_value(__name__)


def ranks_and_allreduce(scale):
    import os

    import torch

    import krug.torch as hvd

    hvd.init()
    try:
        total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, name="sum")
        print("rank %d of %d says hello" % (hvd.rank(), hvd.size()))
        return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
                "local_size": hvd.local_size(), "cross_size": hvd.cross_size(),
                "sum": float(total[0]) * scale, "extra": os.environ.get("KRUG_TEST_EXTRA"),
                "pid": os.getpid()}
    finally:
        hvd.shutdown()


def test_results_in_rank_order_with_local_ranks_and_output(spark):
    out = io.StringIO()
    results = krug.spark.run(ranks_and_allreduce, args=(2,), num_proc=2,
                             env={"KRUG_TEST_EXTRA": "yes"}, stdout=out, start_timeout=120)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 for r in results)
    # Both executors run on this machine: one host, two local ranks (shared memory).
    assert sorted(r["local_rank"] for r in results) == [0, 1]
    assert all(r["local_size"] == 2 and r["cross_size"] == 1 for r in results)
    assert all(r["sum"] == 6.0 for r in results)  # (1 + 2) * 2
    assert all(r["extra"] == "yes" for r in results)
    assert results[0]["pid"] != results[1]["pid"]
    text = out.getvalue()
    assert "[0]<stdout>:rank 0 of 2 says hello" in text
    assert "[1]<stdout>:rank 1 of 2 says hello" in text
    assert_no_stray_processes()


def encrypted_allreduce():
    import os

    import torch

    import krug.torch as hvd

    hvd.init()
    try:
        total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, name="sum")
        return {"sum": float(total[0]), "encrypt": os.environ.get("KRUG_ENCRYPT")}
    finally:
        hvd.shutdown()


def test_krug_encrypt_on_the_driver_encrypts_the_whole_job(spark, monkeypatch):
    # The driver's KRUG_ENCRYPT reaches every rank (through the job, not the executors'
    # environment), its rendezvous server and its driver channel: a rank that did not match
    # would be refused at the handshake.
    monkeypatch.setenv("KRUG_ENCRYPT", "1")
    results = krug.spark.run(encrypted_allreduce, num_proc=2, start_timeout=120)
    assert results == [{"sum": 3.0, "encrypt": "1"}] * 2
    assert_no_stray_processes()


def test_without_barrier_mode_tasks_learn_the_hosts_from_the_driver(spark, monkeypatch):
    # What runs under dynamic allocation, where Spark refuses barrier stages.
    from krug.spark._driver import barrier_mode, dynamic_allocation

    assert not dynamic_allocation(spark.sparkContext) and barrier_mode(spark.sparkContext)
    monkeypatch.setenv("KRUG_SPARK_BARRIER", "0")
    assert not barrier_mode(spark.sparkContext)
    out = io.StringIO()
    results = krug.spark.run(ranks_and_allreduce, args=(2,), num_proc=2, stdout=out,
                             start_timeout=120)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["local_size"] == 2 and r["cross_size"] == 1 and r["sum"] == 6.0
               for r in results)
    assert "[1]<stdout>:rank 1 of 2 says hello" in out.getvalue()
    with pytest.raises(RuntimeError) as info:
        krug.spark.run(failing_on_rank_one, num_proc=2, start_timeout=120)
    assert "ValueError: rank one cannot go on" in str(info.value)
    assert_no_stray_processes()
    monkeypatch.setenv("KRUG_SPARK_BARRIER", "maybe")
    with pytest.raises(ValueError, match="KRUG_SPARK_BARRIER"):
        krug.spark.run(lambda: None, num_proc=2)


def interface_and_interpreter():
    import os
    import sys

    print("hello")
    return os.environ.get("KRUG_GLOO_IFACE"), os.environ.get("NCCL_SOCKET_IFNAME"), sys.executable


def test_horovods_other_arguments(spark):
    import re
    import sys

    out = io.StringIO()
    results = krug.spark.run(interface_and_interpreter, num_proc=2, start_timeout=120,
                             nics=["lo", "eth9"], prefix_output_with_timestamp=True,
                             executable=sys.executable, use_gloo=True, stdout=out)
    assert results == [("eth9", "eth9,lo", sys.executable)] * 2
    assert re.search(r"^\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4}\[1\]<stdout>:hello$",
                     out.getvalue(), re.M), out.getvalue()
    with pytest.raises(ValueError, match="use_mpi=True"):
        krug.spark.run(lambda: None, num_proc=2, use_mpi=True)
    with pytest.raises(ValueError, match="extra_mpi_args"):
        krug.spark.run(lambda: None, num_proc=2, extra_mpi_args="-mca btl tcp")


def test_default_num_proc_is_the_default_parallelism(spark):
    results = krug.spark.run(lambda: "ok", start_timeout=120)
    assert results == ["ok"] * spark.sparkContext.defaultParallelism


def failing_on_rank_one():
    import os

    import torch

    import krug.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank one cannot go on")
    # Rank 0 would wait for rank 1 here forever without the driver cancelling the job.
    hvd.allreduce(torch.ones(1), name="never_completes")
    return os.getpid()


def test_failing_rank_fails_the_call_naming_rank_and_host(spark):
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        krug.spark.run(failing_on_rank_one, num_proc=2, start_timeout=120)
    message = str(info.value)
    assert "krug.spark.run: rank 1 on host " in message
    assert "ValueError: rank one cannot go on" in message
    assert time.monotonic() - t0 < 300
    assert_no_stray_processes()
    # The cluster is usable again: the failed stage was cancelled, not left running.
    assert krug.spark.run(lambda: 7, num_proc=2, start_timeout=120) == [7, 7]


def killing_its_task_on_rank_one():
    import os
    import signal

    import torch

    import krug.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        # The Spark task's Python worker, as when an executor is lost; the rank dies with it.
        os.kill(os.getppid(), signal.SIGKILL)
        signal.pause()
    hvd.allreduce(torch.ones(1), name="never_completes")


def test_a_lost_task_fails_the_call_naming_its_rank(spark):
    # Spark would otherwise rerun the whole barrier stage against a job that is gone.
    with pytest.raises(RuntimeError, match=r"the Spark task of rank 1 on host \S+ ended "
                                           r"without a result"):
        krug.spark.run(killing_its_task_on_rank_one, num_proc=2, start_timeout=120)
    assert_no_stray_processes()
    assert krug.spark.run(lambda: 7, num_proc=2, start_timeout=120) == [7, 7]


def test_more_ranks_than_slots_fails_before_starting_naming_missing_slots(spark):
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"waiting for 3 task slots: the cluster has 2, 1 "
                                           r"missing"):
        krug.spark.run(lambda: None, num_proc=3, start_timeout=2)
    assert time.monotonic() - t0 < 60


def test_unpicklable_fn_fails_before_starting(spark):
    lock = threading.Lock()
    with pytest.raises(TypeError, match="fn and its arguments must be picklable"):
        krug.spark.run(lambda: lock.locked(), num_proc=2)
    assert krug_spark_jobs(spark) == 0


def krug_spark_jobs(spark):
    return len(spark.sparkContext.statusTracker().getActiveJobsIds())


def available_devices():
    from krug.spark.task import get_available_devices

    return get_available_devices()


def test_the_gpus_spark_assigned_reach_the_rank(spark, monkeypatch):
    from krug.spark.task import assigned_gpus_environment, device_index, get_available_devices

    class Gpus:
        addresses = ["2", "3"]

    class Context:
        def resources(self):
            return {"gpu": Gpus()}

    # What a task hands its rank, and what the rank makes of it.
    env = assigned_gpus_environment(Context())
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert get_available_devices() == ["2", "3"] and device_index(0) == 2
    for name in env:
        monkeypatch.delenv(name)
    assert get_available_devices() == [] and device_index(1) == 1
    # This cluster assigns no GPUs: every rank hears so.
    assert krug.spark.run(available_devices, num_proc=2, start_timeout=120) == [[], []]
