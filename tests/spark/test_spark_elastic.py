"""krug.spark.run_elastic on the tests' local Spark cluster: a Spark task killed in the middle
of training costs no committed step, Spark's retry of it joins the job again, and the job
finishes with every step applied exactly once."""

import io

import krug.spark
from conftest import assert_no_stray_processes, by_value, krug_spark_temp_entries

by_value(__name__)


def train_with_a_ledger(steps, kill_after):
    import os
    import signal

    import torch

    import krug.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    # The ledger lists the committed steps: a rollback rewinds it with the model, so a step
    # lost or applied twice shows in it.
    state = hvd.elastic.TorchState(model, optimizer, step=0, ledger=[], sizes=[])
    me = os.environ["KRUG_ELASTIC_WORKER_ID"]

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            optimizer.zero_grad()
            model(torch.full((2, 4), float(state.step))).sum().backward()
            optimizer.step()
            state.ledger = state.ledger + [state.step]
            state.sizes = state.sizes + [hvd.size()]
            state.step += 1
            state.commit()
            if state.step == kill_after and me == "p1a0":
                # The Spark task's Python worker, then this rank at once: the parent-death
                # signal reaches the rank only when its parent has exited, a few steps later,
                # and whether the survivor then sees a failed collective or a hosts-changed
                # notice at a commit would depend on timing.
                os.kill(os.getppid(), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)
        return state.ledger, state.sizes, me

    return train(state)


def test_a_killed_task_recovers_without_losing_committed_work(spark):
    temp_before = krug_spark_temp_entries()
    err = io.StringIO()
    results = krug.spark.run_elastic(train_with_a_ledger, args=(60, 10), num_proc=2,
                                     min_num_proc=1, max_num_proc=2, start_timeout=120,
                                     elastic_timeout=120, stderr=err)
    log = err.getvalue()
    assert results, log
    for ledger, sizes, worker in results:
        assert ledger == list(range(60)), (worker, ledger)
        assert worker != "p1a0"
    assert any(worker == "p0a0" for _, _, worker in results), results
    ledger, sizes, _ = results[0]
    assert sizes[:10] == [2] * 10  # both workers until the kill
    # Whether Spark's retry of the task (worker p1a1) joins before the survivor finishes depends
    # on timing; what must hold is that the survivor rolled back to the last commit and went
    # on, and that a retry the finished job no longer needs is not reported as a failure.
    assert "worker p1a0 on host" in log and "lost with its Spark task" in log, log
    assert "rolling back to commit 10" in log, log
    assert "elastic round 1:" in log, log
    assert "failed" not in log, log
    assert_no_stray_processes()
    # The killed task left nothing of the job (its payload) behind on the executor.
    assert krug_spark_temp_entries() - temp_before == set()


def test_elastic_bad_limits_fail_before_starting(spark):
    import pytest

    with pytest.raises(ValueError, match="min_num_proc <= max_num_proc"):
        krug.spark.run_elastic(lambda: None, min_num_proc=3, max_num_proc=2)
