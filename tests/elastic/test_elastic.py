"""Fault injection for elastic training (issue: workers come and go, committed state is never
lost): krugrun's driver with the elastic digits example on four "hosts" of this machine
(127.0.0.1..4). Run by ctest as elastic.*; each test starts real jobs."""
import json
import os
import random
import re
import signal
import sys
import time

import pytest

from elastic_job import ElasticJob

HOSTS = ["127.0.0.%d:1" % i for i in range(1, 5)]
EPOCHS = int(os.environ.get("KRUG_ELASTIC_TEST_EPOCHS", "10"))
MIN_ACCURACY = 0.9
EXAMPLE_ARGS = ["--epochs", str(EPOCHS), "--min-accuracy", str(MIN_ACCURACY)]
TRAIN_SAMPLES = 1438  # 80 % of the 1,797 digits (the example's split)
TRIALS = int(os.environ.get("KRUG_ELASTIC_TEST_TRIALS", "10"))
SEED = int(os.environ.get("KRUG_ELASTIC_TEST_SEED", "20261124"))
CPP_WORKER = os.environ.get("KRUG_ELASTIC_CPP_WORKER",
                            os.path.join(os.path.dirname(__file__), "..", "..", "build", "tests",
                                         "elastic", "elastic_cpp_worker"))


def result(job):
    with open(job.result_file) as f:
        return json.load(f)


def first_difference(got, expected):
    """The first committed step whose global batch differs from the undisturbed run's."""
    for step, (a, b) in enumerate(zip(got, expected), 1):
        if a != b:
            return "step %d: %s, undisturbed %s" % (step, a, b)
    return "%d steps, undisturbed %d" % (len(got), len(expected))


def test_killed_worker_costs_no_committed_work(tmp_path):
    base = ElasticJob(tmp_path / "undisturbed", HOSTS, ["--min-np", "2"], EXAMPLE_ARGS)
    assert base.finish() == 0, base.text()[-4000:]
    base_accuracy = base.final_accuracy()
    base_result = result(base)
    base_steps = base_result["steps"]
    # Every epoch's samples, each once: the ledger's batches partition the training set.
    for epoch in range(EPOCHS):
        assert sum(e[1] for e in base_result["ledger"] if e[0] == epoch) == TRAIN_SAMPLES
    rng = random.Random(SEED)
    recoveries = []
    for trial in range(TRIALS):
        job = ElasticJob(tmp_path / ("trial%d" % trial), HOSTS,
                         ["--min-np", "2", "--blacklist-cooldown-range", "1", "2"], EXAMPLE_ARGS)
        kill_step = rng.randint(3, int(base_steps * 0.6))
        index, _, _ = job.wait_for(r"step %d committed" % kill_step)
        workers = job.worker_pids()
        victim = rng.choice(sorted(workers))
        host, pid = workers[victim]
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        job.wait_for(r"%s .*killed by signal 9" % victim, after=index)
        job.wait_for(r"rolling back to commit \d+", after=index)
        round_line, _, _ = job.wait_for(r"krugrun: elastic: round \d+: ", after=index)
        _, resumed_at, _ = job.wait_for(r"step \d+ committed", after=round_line)
        recoveries.append(resumed_at - killed_at)
        code = job.finish()
        assert code == 0, "trial %d (killed %s at step %d):\n%s" % (
            trial, victim, kill_step, job.text()[-6000:])
        # What the design guarantees. Constant global batch + ElasticSampler + rollback to the
        # last commit: the committed history is the undisturbed run's, global batch for global
        # batch (none lost, none applied twice, same order), whatever the rank count was.
        got = result(job)
        assert got["steps"] == base_steps and got["epochs"] == EPOCHS, (trial, got, base_steps)
        assert got["ledger"] == base_result["ledger"], (trial, first_difference(
            got["ledger"], base_result["ledger"]))
        # The weights themselves differ by float association (sums over 4 or 3 ranks), which
        # SGD amplifies: accuracies of runs that differ only so spread by a few test samples
        # (0.972 vs 0.983 was seen), so only the example's own bar is a bound they all meet.
        assert job.final_accuracy() >= MIN_ACCURACY, (trial, job.final_accuracy(),
                                                      base_accuracy)
    print("recovery from SIGKILL to the next committed step (s): %s; median %.2f" % (
        ", ".join("%.2f" % r for r in recoveries), sorted(recoveries)[len(recoveries) // 2]))
    out = os.environ.get("KRUG_ELASTIC_RECOVERY_FILE")
    if out:
        with open(out, "w") as f:
            json.dump({"recovery_seconds": recoveries, "base_accuracy": base_accuracy}, f)


def test_host_removed_and_added_again(tmp_path):
    # Host 127.0.0.1's worker, there throughout, sleeps 80 ms a step, so that the 300 steps take
    # 24 s at least: the re-added host's worker must start (a Python process importing torch)
    # and join while the job still trains. Unslowed, the steps took 5 ms each, and one CI run
    # finished training before that worker had started.
    hosts = HOSTS[:3]
    job = ElasticJob(tmp_path, hosts, ["--min-np", "2"], EXAMPLE_ARGS,
                     env={"KRUG_EXAMPLE_SLEEP_HOST": "127.0.0.1",
                          "KRUG_EXAMPLE_SLEEP_SECONDS": "0.08"})
    index, _, _ = job.wait_for(r"step 10 committed")
    job.set_hosts(hosts[:2])
    index, _, _ = job.wait_for(r"host 127\.0\.0\.3 left the discovery script's output", after=index)
    index, _, _ = job.wait_for(r"round \d+: 2 worker\(s\)", after=index)
    index, _, _ = job.wait_for(r"step \d+ committed", after=index)
    job.set_hosts(hosts)
    index, _, _ = job.wait_for(r"worker w3 on host 127\.0\.0\.3: pid \d+ started", after=index)
    index, _, _ = job.wait_for(r"round \d+: 3 worker\(s\): .*w3 rank 2 \(new\)", after=index)
    job.wait_for(r"step \d+ committed", after=index)
    assert job.finish() == 0, job.text()[-6000:]
    assert job.final_accuracy() >= 0.9
    assert "was removed from the job" in job.text()  # w2 was told, and exited 0


def steps_per_second(job, start, end):
    """Committed steps per second between output lines start and end."""
    times = [t for t, line in job.lines[start:end] if re.search(r"step \d+ committed", line)]
    assert len(times) >= 5, job.text()[-4000:]
    return (len(times) - 1) / (times[-1] - times[0])


def test_straggler_is_evicted_and_throughput_recovers(tmp_path):
    # --min-np 1: once the straggler is gone, the two workers left run 50 ms steps, and on a
    # loaded machine one of them can look 2x slower for a while and be evicted too (seen:
    # "2.4x slower ... wait 0.030 s per step"); the job must then go on with one worker
    # instead of waiting for a second that never comes.
    job = ElasticJob(tmp_path, HOSTS[:3],
                     ["--min-np", "1", "--straggler-factor", "2", "--straggler-window", "10"],
                     EXAMPLE_ARGS, env={"KRUG_EXAMPLE_SLEEP_HOST": "127.0.0.3",
                                        "KRUG_EXAMPLE_SLEEP_SECONDS": "1.0"})
    first, _, _ = job.wait_for(r"step 1 committed")
    evicted, _, _ = job.wait_for(r"worker w2 \(rank 2\) on host 127\.0\.0\.3 is [0-9.]+x slower",
                                 after=first)
    resumed, _, _ = job.wait_for(r"round 1: 2 worker\(s\)", after=evicted)
    assert job.finish() == 0, job.text()[-6000:]
    before = steps_per_second(job, first, evicted)
    after = steps_per_second(job, resumed, len(job.lines))
    # The straggler sleeps 1 s per step, so every step took over 1 s before the eviction;
    # without it a step takes a few tens of ms (a few hundred on a loaded machine). The bound
    # leaves room for a machine 10 times slower than idle: load must not decide it.
    assert after > 1.5 * before, (before, after)


def test_reset_limit_stops_the_job(tmp_path):
    job = ElasticJob(tmp_path, HOSTS[:3], ["--min-np", "2", "--reset-limit", "0"], EXAMPLE_ARGS)
    index, _, _ = job.wait_for(r"step 3 committed")
    os.kill(job.worker_pids()["w1"][1], signal.SIGKILL)
    job.wait_for(r"reset limit reached \(1 resets, --reset-limit 0\)", after=index)
    assert job.finish() == 1


def test_too_few_slots_for_min_np_times_out(tmp_path):
    job = ElasticJob(tmp_path, HOSTS[:1], ["--min-np", "2", "--elastic-timeout", "3"], EXAMPLE_ARGS)
    job.wait_for(r"only 1 worker\(s\) available after 3 s, fewer than --min-np 2")
    assert job.finish(60) == 1


def test_cpp_worker_killed_and_host_added(tmp_path):
    """The framework-free C++ API: a killed worker, then its host back after the cooldown; the
    final value proves no step was lost or applied twice (elastic_cpp_worker.cc checks it)."""
    job = ElasticJob(tmp_path, HOSTS[:3], ["--min-np", "2", "--blacklist-cooldown-range", "1", "1"],
                     command=[CPP_WORKER, "150", "20"])
    index, _, _ = job.wait_for(r"step 20 committed")
    os.kill(job.worker_pids()["w1"][1], signal.SIGKILL)
    index, _, _ = job.wait_for(r"rolling back to commit \d+", after=index)
    index, _, _ = job.wait_for(r"round 1: 2 worker\(s\)", after=index)
    index, _, _ = job.wait_for(r"worker w3 on host 127\.0\.0\.2: pid \d+ started", after=index)
    job.wait_for(r"round 2: 3 worker\(s\): .*w3 rank 2 \(new\)", after=index)
    assert job.finish() == 0, job.text()[-6000:]
    assert "final value: 11325.0 (3 ranks)" in job.text(), job.text()[-3000:]


def test_fixed_hosts_go_on_without_a_failed_one(tmp_path):
    """horovodrun's elastic job on fixed hosts (--min-np with -H): a killed worker's host leaves
    and the job goes on with the others, losing no committed step."""
    job = ElasticJob(tmp_path, HOSTS[:3], ["--min-np", "2"], fixed_hosts=True,
                     command=[CPP_WORKER, "150", "20"])
    index, _, _ = job.wait_for(r"step 20 committed")
    os.kill(job.worker_pids()["w1"][1], signal.SIGKILL)
    job.wait_for(r"round 1: 2 worker\(s\)", after=index)
    assert job.finish() == 0, job.text()[-6000:]
    assert "final value: 11325.0 (2 ranks)" in job.text(), job.text()[-3000:]


def test_torch_cpp_worker_killed_matches_undisturbed(tmp_path):
    """The LibTorch API (krug::torch::elastic::TorchState): a run with a killed worker ends with
    the undisturbed run's weights, up to float association."""
    worker = os.environ.get("KRUG_ELASTIC_TORCH_WORKER",
                            os.path.join(os.path.dirname(__file__), "..", "..", "build", "tests",
                                         "elastic", "elastic_torch_worker"))
    final = r"final weight sum: (-?[0-9.]+) after 120 steps"
    base = ElasticJob(tmp_path / "undisturbed", HOSTS[:3], ["--min-np", "2"],
                      command=[worker, "120", "10"])
    assert base.finish() == 0, base.text()[-4000:]
    expected = float(base.wait_for(final)[2].group(1))
    job = ElasticJob(tmp_path / "killed", HOSTS[:3], ["--min-np", "2"], command=[worker, "120", "10"])
    index, _, _ = job.wait_for(r"step 30 committed")
    os.kill(job.worker_pids()["w2"][1], signal.SIGKILL)
    job.wait_for(r"rolling back to commit \d+", after=index)
    job.wait_for(r"round 1: 2 worker\(s\)", after=index)
    assert job.finish() == 0, job.text()[-6000:]
    got = float(job.wait_for(final)[2].group(1))
    assert abs(got - expected) <= 1e-4 * max(1.0, abs(expected)), (got, expected)


def test_torch_cpp_unnamed_ops_agree_after_a_worker_is_added(tmp_path):
    """The LibTorch API's unnamed operations across a round that adds a worker: every step makes
    unnamed calls (elastic_torch_worker.cc), whose names restart at every init(), on the
    survivors and the newcomer alike. Counters that carried on over the reset would give the
    newcomer names no survivor uses, and the job would stall instead of finishing. The ranks
    hold after step 10 until the newcomer has joined: 70 steps of 10 ms were once over before
    it did."""
    worker = os.environ.get("KRUG_ELASTIC_TORCH_WORKER",
                            os.path.join(os.path.dirname(__file__), "..", "..", "build", "tests",
                                         "elastic", "elastic_torch_worker"))
    job = ElasticJob(tmp_path, HOSTS[:2], ["--min-np", "2"],
                     command=[worker, "80", "10", "10", "3"])
    index, _, _ = job.wait_for(r"step 10 committed")
    job.set_hosts(HOSTS[:3])
    index, _, _ = job.wait_for(r"worker w2 on host 127\.0\.0\.3: pid \d+ started", after=index)
    index, _, _ = job.wait_for(r"round \d+: 3 worker\(s\): .*w2 rank 2 \(new\)", after=index)
    job.wait_for(r"step \d+ committed", after=index)
    assert job.finish() == 0, job.text()[-6000:]
    assert "unnamed ops: FAIL" not in job.text(), job.text()[-6000:]
    assert re.search(r"final weight sum: -?[0-9.]+ after 80 steps \(3 ranks\)", job.text()), \
        job.text()[-3000:]


def killed_worker_costs_no_committed_work(tmp_path, worker, env):
    """The framework workers' scenario (digits_elastic_loop.py): three workers committing every
    5 steps; a host is added at step 10 (the ranks wait there until its worker has joined and
    synced the state from rank 0), then rank 0's worker is SIGKILLed two steps after a commit.
    The survivors roll those steps back, re-form and finish, with every committed step applied
    exactly once and the model trained. Three workers to start with: the fewest that leave two
    survivors running real collectives."""
    worker = os.path.join(os.path.dirname(__file__), worker)
    epochs, steps_per_epoch = 4, 30
    job = ElasticJob(tmp_path, HOSTS[:3], ["--min-np", "2"],
                     command=[sys.executable, worker, "--epochs", str(epochs), "--commit-every",
                              "5", "--hold-at-step", "10", "--hold-for-workers", "4",
                              "--result-file", os.path.join(str(tmp_path), "result.json")],
                     env=env)
    index, _, _ = job.wait_for(r"step 5 committed", timeout=240)
    job.set_hosts(HOSTS)
    # The ranks wait after step 10 until the new worker has joined (--hold-at-step).
    index, _, _ = job.wait_for(r"round 1: 4 worker\(s\): .*w3 rank 3 \(new\)", timeout=240,
                               after=index)
    index, _, m = job.wait_for(r"step (\d*[27]) trained", after=index)  # 2 steps after a commit
    os.kill(job.worker_pids()["w0"][1], signal.SIGKILL)
    job.wait_for(r"w0 .*killed by signal 9", after=index)
    job.wait_for(r"rolling back to commit \d+", after=index)
    job.wait_for(r"round 2: 3 worker\(s\)", after=index)
    assert job.finish() == 0, job.text()[-6000:]
    got = result(job)
    assert got["ranks"] == 3 and got["resets"] >= 2, got
    assert got["steps_per_epoch"] == steps_per_epoch
    assert got["ledger"] == [[e, b] for e in range(epochs) for b in range(steps_per_epoch)]
    assert got["seen"] == [float(epochs)] * len(got["seen"]), sorted(set(got["seen"]))
    # ln 10 = 2.30 untrained; these models end near 0.2 whatever the float association.
    assert got["loss"] < 0.5 and got["accuracy"] >= 0.8, got
    print("killed w0 after step %s trained;" % m.group(1),
          job.wait_for(r"rolling back to commit \d+")[2].group(0), "|",
          job.wait_for(r"final loss .*")[2].group(0))


def test_tensorflow_killed_worker_costs_no_committed_work(tmp_path):
    """krug.tensorflow: a GradientTape loop under hvd.elastic.run with TensorFlowKerasState
    (tf_elastic_worker.py), in the framework workers' scenario: the model's and the
    optimizer's variables and the Python values roll back, and the new worker syncs the model
    and the optimizer's state."""
    killed_worker_costs_no_committed_work(
        tmp_path, "tf_elastic_worker.py",
        # TMPDIR: the killed worker cannot remove AutoGraph's generated files.
        {"TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
         "TF_NUM_INTRAOP_THREADS": "1", "TMPDIR": str(tmp_path)})


def test_jax_killed_worker_costs_no_committed_work(tmp_path):
    """krug.jax: a jitted optax step under hvd.elastic.run with JaxState
    (jax_elastic_worker.py), in the framework workers' scenario: the parameters, the optimizer
    state and the counts roll back as arrays, the survivors retrace their step for the new job,
    and the new worker syncs the arrays from rank 0."""
    killed_worker_costs_no_committed_work(
        tmp_path, "jax_elastic_worker.py", {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"})
