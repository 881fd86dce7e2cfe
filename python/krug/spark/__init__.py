"""Run krug jobs on Apache Spark: Horovod's ``horovod.spark`` API.

``krug.spark.run(fn, ...)`` runs ``fn`` as ``num_proc`` krug ranks in Spark tasks that are
scheduled together (barrier execution mode) and returns its return values in rank order.
The driver hosts krug's rendezvous server; tasks on one executor host get local ranks and
use shared memory between them. See docs/spark.md."""

from krug.spark._driver import check_no_mpi as _check_no_mpi
from krug.spark._driver import run as _run
from krug.spark._driver import run_elastic as _run_elastic


def run(fn, args=(), kwargs={}, num_proc=None, start_timeout=None, env=None, stdout=None,  # noqa: B006
        stderr=None, verbose=1, nics=None, prefix_output_with_timestamp=False, executable=None,
        use_mpi=None, use_gloo=None, extra_mpi_args=None):
    """Runs ``fn(*args, **kwargs)`` on ``num_proc`` ranks (default: the Spark context's
    default parallelism), each in a Spark task; returns the ranks' return values in rank order.

    ``start_timeout``: seconds to wait for the cluster's task slots and for every task to start
    (default: HOROVOD_SPARK_START_TIMEOUT, else 600); ``env``: extra environment variables of
    the ranks; ``stdout`` / ``stderr``: streams the ranks' output lines go to, prefixed
    ``[rank]<stdout>:`` (default: this process's); ``verbose``: 2 also reports the job's
    layout. Raises RuntimeError naming the rank and executor host of the first rank that
    fails (the other tasks are cancelled), and TypeError before anything starts when fn or its
    arguments cannot be pickled.

    Horovod's other arguments: ``nics`` (network interfaces: krug's planes use the first,
    sorted, NCCL all of them), ``prefix_output_with_timestamp``, ``executable`` (the ranks'
    Python interpreter on the executors; default the tasks'), ``use_gloo`` (what krug uses
    anyway); ``use_mpi=True`` and ``extra_mpi_args`` are a ValueError: no mpirun runs here.
    Pass them by keyword: Horovod's releases order them differently."""
    del use_gloo
    _check_no_mpi(use_mpi, extra_mpi_args, "krug.spark.run")
    return _run(fn, args, kwargs, num_proc, start_timeout, env, stdout, stderr, verbose,
                horovod_options={"nics": nics,
                                 "prefix_output_with_timestamp": prefix_output_with_timestamp,
                                 "executable": executable})


def run_elastic(fn, args=(), kwargs={}, num_proc=None, min_num_proc=None,  # noqa: B006
                max_num_proc=None, start_timeout=None, elastic_timeout=None, reset_limit=None,
                env=None, stdout=None, stderr=None, verbose=1, min_np=None, max_np=None,
                nics=None, prefix_output_with_timestamp=False):
    """Runs ``fn`` as an elastic krug job (docs/elastic.md) in Spark tasks: up to
    ``max_num_proc`` workers (default num_proc, default the default parallelism), training
    once ``min_num_proc`` (default num_proc) are up. fn uses krug's elastic API
    (``hvd.elastic.run`` with a state). A worker whose task dies is dropped; the others roll
    back to their last commit and go on; a task Spark retries (or one that starts late) joins at
    the next commit. ``elastic_timeout`` (default: HOROVOD_ELASTIC_TIMEOUT, else 600 s)
    bounds the waits for workers, ``reset_limit`` the number of resets. ``nics`` and
    ``prefix_output_with_timestamp`` as for run. Returns the return values of the workers that
    finished, by rank."""
    return _run_elastic(fn, args, kwargs, num_proc,
                        min_np if min_num_proc is None else min_num_proc,
                        max_np if max_num_proc is None else max_num_proc, start_timeout,
                        elastic_timeout, reset_limit, env, stdout, stderr, verbose,
                        horovod_options={"nics": nics, "prefix_output_with_timestamp":
                                         prefix_output_with_timestamp})


__all__ = ["run", "run_elastic"]
