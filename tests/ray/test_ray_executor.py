"""krug.ray.RayExecutor on a local Ray cluster with two simulated nodes."""

import os
import signal
import sys

import pytest
from ray import cloudpickle as ray_cloudpickle

from krug.ray import RayExecutor

# Ray pickles functions of importable modules by reference; the actors cannot import this one.
ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])


def allreduce_info(scale):
    import os

    import ray
    import torch

    import krug.torch as hvd

    hvd.init()
    try:
        total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, name="sum")
        return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
                "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
                "cross_size": hvd.cross_size(), "sum": float(total[0]) * scale,
                "node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "extra": os.environ.get("KRUG_TEST_EXTRA")}
    finally:
        hvd.shutdown()


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def wait_until_gone(pids, deadline_s=60):
    import time

    end = time.monotonic() + deadline_s  # a hang guard, not a synchronisation
    while any(pid_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.2)
    return [p for p in pids if pid_alive(p)]


class Counter:
    def __init__(self, start):
        self.value = start

    def bump(self):
        import krug.torch as hvd

        self.value += 1
        return (self.value, os.environ["KRUG_RANK"])


def test_hosts_strategy_places_ranks_by_node_and_runs_collectives(ray_cluster):
    settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=120)
    ex = RayExecutor(settings, num_hosts=2, num_workers_per_host=2, cpus_per_worker=1)
    ex.start(executable_cls=Counter, executable_args=[10],
             extra_env_vars={"KRUG_TEST_EXTRA": "yes"})
    try:
        results = ex.run(allreduce_info, args=[2])
        assert [r["rank"] for r in results] == [0, 1, 2, 3]
        assert all(r["size"] == 4 and r["sum"] == 20.0 for r in results)  # (1+2+3+4) * 2
        assert all(r["local_size"] == 2 and r["cross_size"] == 2 for r in results)
        assert [r["local_rank"] for r in results] == [0, 1, 0, 1]
        assert [r["cross_rank"] for r in results] == [0, 0, 1, 1]
        # STRICT_SPREAD: one node per host, the two local ranks of a host on the same node.
        assert results[0]["node"] == results[1]["node"] != results[2]["node"] == results[3]["node"]
        assert all(r["extra"] == "yes" for r in results)
        # The executable object lives in each actor; execute_single reaches rank 0 only.
        assert ex.execute(lambda c: c.bump()) == [(11, "0"), (11, "1"), (11, "2"), (11, "3")]
        assert ex.execute_single(lambda c: c.bump()) == (12, "0")
        import ray

        refs = ex.run_remote(lambda a, b=0: a + b, args=[1], kwargs={"b": 2})
        assert ray.get(refs) == [3, 3, 3, 3]
        pids = [r["pid"] for r in results]
    finally:
        ex.shutdown()
    assert wait_until_gone(pids) == []


def fails_on_rank_two():
    import os

    if os.environ["KRUG_RANK"] == "2":
        raise ValueError("rank two cannot go on")
    return os.environ["KRUG_RANK"]


def test_pack_strategy_and_a_failing_worker_names_its_rank(ray_cluster):
    settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=120)
    ex = RayExecutor(settings, num_workers=3)
    ex.start()
    try:
        assert ex.run(lambda: int(os.environ["KRUG_SIZE"])) == [3, 3, 3]
        with pytest.raises(RuntimeError, match=r"(?s)krug.ray: rank 2 on host \S+ failed:.*rank two "
                                               r"cannot go on"):
            ex.run(fails_on_rank_two)
        # A killed actor is reported with its rank too.
        pid = ex.execute_single(lambda _: os.getpid())
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match=r"krug.ray: rank 0 on host \S+ failed"):
            ex.run(lambda: 1)
    finally:
        ex.shutdown()


def test_bad_input_and_too_few_resources_fail_clearly(ray_cluster):
    with pytest.raises(ValueError, match="use_gpu"):
        RayExecutor(None, num_workers=1, gpus_per_worker=1)
    with pytest.raises(ValueError, match="num_workers"):
        RayExecutor(None)
    ex = RayExecutor(RayExecutor.create_settings(placement_group_timeout_s=3), num_workers=20)
    with pytest.raises(TimeoutError, match=r"could not place 20 bundle"):
        ex.start()
    with pytest.raises(RuntimeError, match=r"start\(\) must be called first"):
        ex.run(lambda: 1)


def placement_group_and_sum():
    import ray

    info = allreduce_info(1)
    return ray.util.get_current_placement_group().id.hex(), info["sum"]


def executor_inside_a_placement_group():
    ex = RayExecutor(RayExecutor.create_settings(placement_group_timeout_s=60), num_workers=2,
                     cpus_per_worker=1)
    ex.start()
    try:
        return ex.run(placement_group_and_sum)
    finally:
        ex.shutdown()


def test_workers_use_the_current_placement_group(ray_cluster):
    # As under a Ray Tune trial: the job's resources are reserved in the trial's group, and the
    # executor places its workers there rather than asking for as many again.
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="PACK")
    ray.get(pg.ready(), timeout=60)
    try:
        strategy = PlacementGroupSchedulingStrategy(placement_group=pg,
                                                    placement_group_capture_child_tasks=True)
        driver = ray.remote(num_cpus=0)(executor_inside_a_placement_group)
        results = ray.get(driver.options(scheduling_strategy=strategy).remote(), timeout=300)
    finally:
        remove_placement_group(pg)
    assert results == [(pg.id.hex(), 3.0)] * 2


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
    # The committed steps: a rollback rewinds the ledger with the model, so a step lost or
    # applied twice shows in it.
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
            if state.step == kill_after and me == "a1":
                os.kill(os.getpid(), signal.SIGKILL)  # the actor dies
        return state.ledger, state.sizes, me

    return train(state)


def test_elastic_mode_recovers_from_a_killed_actor(ray_cluster):
    settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=120)
    ex = RayExecutor(settings, min_workers=1, max_workers=3, cpus_per_worker=1,
                     elastic_timeout=120)
    ex.start()
    try:
        results = ex.run(train_with_a_ledger, args=[60, 10])
        log = list(ex._elastic_job.log)
    finally:
        ex.shutdown()
    assert results, log
    for ledger, sizes, worker in results:
        assert ledger == list(range(60)), (worker, ledger, log)
        assert worker != "a1"
    assert "lost a1" in log and "replacing a1 with a3" in log, log
    assert any(line.startswith("round 1:") for line in log), log


def train_with_a_bug():
    import krug.torch as hvd

    hvd.init()
    state = hvd.elastic.ObjectState(step=0)

    @hvd.elastic.run
    def train(state):
        raise ValueError("a bug in the training code")

    return train(state)


def test_elastic_mode_stops_on_an_exception_of_the_training_function(ray_cluster):
    # A replacement worker would raise the same: the job ends with the error instead of
    # replacing workers for ever (reset_limit is unlimited by default).
    ex = RayExecutor(RayExecutor.create_settings(placement_group_timeout_s=120), min_workers=1,
                     max_workers=2, cpus_per_worker=1, elastic_timeout=120)
    ex.start()
    try:
        with pytest.raises(RuntimeError, match="(?s)training function raised.*a bug in the "
                                               "training code"):
            ex.run(train_with_a_bug)
        assert ex._elastic_job.actors == {}, "the other worker must not train on alone"
        assert not any(line.startswith("replacing") for line in ex._elastic_job.log)
    finally:
        ex.shutdown()


def test_horovods_elastic_ray_executor(ray_cluster):
    import functools

    from krug.ray import ElasticRayExecutor

    settings = ElasticRayExecutor.create_settings(min_np=1, max_np=2, elastic_timeout=120,
                                                  placement_group_timeout_s=120)
    ex = ElasticRayExecutor(settings, cpus_per_slot=1, env_vars={"KRUG_TEST_EXTRA": "x"})
    ex.start()
    try:
        results = ex.run(functools.partial(train_with_a_ledger, 20, 0))  # nobody is killed
    finally:
        ex.shutdown()
    assert len(results) == 2
    for ledger, sizes, _ in results:
        assert ledger == list(range(20))


def test_elastic_limits_are_checked(ray_cluster):
    with pytest.raises(ValueError, match="min_workers <= max_workers"):
        RayExecutor(None, min_workers=3, max_workers=2)
    ex = RayExecutor(RayExecutor.create_settings(), min_workers=1, max_workers=2)
    ex.start()
    try:
        with pytest.raises(RuntimeError, match="only run"):
            ex.execute(lambda w: None)
    finally:
        ex.shutdown()


def test_digits_example_trains_to_95_percent_on_two_nodes(ray_cluster):
    import importlib

    examples = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
    sys.path.insert(0, examples)
    try:
        example = importlib.import_module("ray_torch_digits")
    finally:
        sys.path.remove(examples)
    ray_cloudpickle.register_pickle_by_value(example)
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=120),
                     num_hosts=2, num_workers_per_host=1)
    ex.start()
    try:
        accuracies = ex.run(example.train_digits, kwargs={"epochs": 30})
    finally:
        ex.shutdown()
    assert len(accuracies) == 2 and accuracies[0] == accuracies[1]
    assert accuracies[0] >= 0.95, accuracies
