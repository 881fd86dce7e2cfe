"""One local Spark cluster for every test of this folder: two executors that are separate JVM
processes with one core each (local-cluster[2,1,1024]). A JVM and its executors take a minute
to start on a loaded machine, so the tests share them; they stop with the session, and each
test that starts ranks checks that none is left."""

import os
import subprocess
import sys
import tempfile
import time

import pytest
# torch and triton before TensorFlow (the Keras tests import it): triton and TensorFlow each
# carry LLVM, and whichever registers its options second aborts the process; torch imports
# triton lazily, long after TensorFlow would be in.
import torch  # noqa: F401

try:
    import triton  # noqa: F401
except ImportError:  # a torch without triton has nothing to clash
    pass

try:
    import cloudpickle
except ImportError:  # pragma: no cover
    from pyspark import cloudpickle


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    # The executors' Python must be this one (the same packages as the driver's); PySpark
    # takes it from PYSPARK_PYTHON, else the first python3 on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (SparkSession.builder.master("local-cluster[2,1,1024]")
               .appName("krug-spark-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.memory", "1g")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
               .config("spark.executorEnv.OMP_NUM_THREADS", "1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


def by_value(module_name):
    """Test functions travel to the executors by value (their module is not importable there):
    in krug.spark's payloads (cloudpickle) and in Spark's own UDFs (PySpark's copy of it)."""
    from pyspark import cloudpickle as spark_cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[module_name])
    spark_cloudpickle.register_pickle_by_value(sys.modules[module_name])


def krug_rank_processes():
    """Pids of rank processes (krug.spark._rank) and rendezvous servers still running."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if "krug.spark._rank" in args or "__rendezvous-server" in args:
            found.append((int(pid), args))
    return [p for p in found if p[0] != os.getpid()]


def krug_spark_temp_entries():
    """The names in the temporary directory that krug.spark's tasks would have made (tests of
    other packages running beside these make their own "krug-..." entries)."""
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith("krug-spark")}


def assert_no_stray_processes(deadline_s=60):
    """Every rank and server of finished jobs is gone (killing them is asynchronous: poll with a
    generous deadline, a hang guard only)."""
    end = time.monotonic() + deadline_s
    while krug_rank_processes() and time.monotonic() < end:
        time.sleep(0.2)
    assert krug_rank_processes() == []
