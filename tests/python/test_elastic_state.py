"""krug.common.elastic and krug.torch.elastic: ElasticSampler, TorchState, ObjectState and
the recovery loop, without an elastic driver. Run inside ranks:
    build/krugrun -np N /usr/bin/python3 -m pytest -q tests/python/test_elastic_state.py
The core's elastic functions are replaced where a test needs elastic mode; state syncs and
host-update broadcasts use real collectives.
"""

import pytest
import torch

import krug.torch as hvd
from krug.common import elastic as common
from krug.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt, WorkerRemoved
from krug.torch.elastic import _core_bridge
from krug.torch.elastic import sampler as sampler_module

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
BRIDGE = {name: getattr(_core_bridge, name)  # the real functions, before any test replaces them
          for name in ("elastic_enabled", "elastic_round", "elastic_host_update")}


@pytest.fixture(autouse=True)
def fixed_job(monkeypatch):
    """The core's elastic functions as outside elastic mode (tests that need elastic mode
    replace them again), so the tests also run on a core built without them."""
    monkeypatch.setattr(_core_bridge, "elastic_enabled", lambda: False)
    monkeypatch.setattr(_core_bridge, "elastic_round", lambda: (0, False))
    monkeypatch.setattr(_core_bridge, "elastic_host_update", lambda: (False, False))


# ------------------------------------------------------------------------------ helpers


def samplers_for(monkeypatch, dataset, n, epoch=0, state=None, seed=3):
    """One ElasticSampler per rank of an n-rank job, laid out in this process."""
    result = []
    for r in range(n):
        monkeypatch.setattr(sampler_module, "_topology", lambda r=r: (r, n))
        s = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=seed)
        s.set_epoch(epoch)
        if state is not None:
            s.load_state_dict(state)
        result.append(s)
    return result


def global_batch(samplers, j, b):
    return sorted(i for s in samplers for i in s.get_indices(j, b))


def assert_same_on_all_ranks(tensors, tag):
    for i, t in enumerate(tensors):
        t = t.detach().reshape(1, -1).to(torch.float64).contiguous()
        rows = hvd.allgather(t, name="%s.%d" % (tag, i))
        for r in range(SIZE):
            assert torch.equal(rows[r], rows[0]), (tag, i, r)


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))


def local_step(model, optimizer, seed):
    g = torch.Generator().manual_seed(seed)
    optimizer.zero_grad()
    model(torch.randn(5, 4, generator=g)).pow(2).mean().backward()
    optimizer.step()


def snapshot(model, optimizer):
    params = [p.detach().clone() for p in model.parameters()]
    momenta = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    return params, momenta


def assert_snapshot(model, optimizer, expected):
    params, momenta = snapshot(model, optimizer)
    for got, want in zip(params + momenta, expected[0] + expected[1]):
        assert torch.equal(got, want)


# ------------------------------------------------------------------------------ ElasticSampler


def test_sampler_split_pads_by_wrapping(monkeypatch):
    data = list(range(10))
    samplers = samplers_for(monkeypatch, data, 4)
    order = samplers[0].remaining_indices
    assert sorted(order) == data
    assert all(len(s) == 3 and len(s.indices) == 3 for s in samplers)
    padded = order + order[:2]
    for r, s in enumerate(samplers):
        assert s.indices == padded[r::4]
        assert list(iter(s)) == s.indices
    # Fewer remaining than ranks: wraps more than once.
    one = samplers_for(monkeypatch, [0], 3)
    assert [s.indices for s in one] == [[0], [0], [0]]


def test_sampler_same_order_on_every_rank_and_epoch_reshuffles(monkeypatch):
    a, b = samplers_for(monkeypatch, list(range(40)), 2, epoch=5)
    assert a.remaining_indices == b.remaining_indices
    c = samplers_for(monkeypatch, list(range(40)), 1, epoch=6)[0]
    assert c.remaining_indices != a.remaining_indices
    assert sorted(c.remaining_indices) == list(range(40))
    # The order is the same across processes too (only seed and epoch matter).
    rows = hvd.allgather(torch.tensor([a.remaining_indices]), name="elastic.sampler_order")
    assert all(torch.equal(rows[r], rows[0]) for r in range(SIZE))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_sampler_global_batches_are_contiguous(monkeypatch, n):
    G, length = 12, 50
    b = G // n
    samplers = samplers_for(monkeypatch, list(range(length)), n)
    order = samplers[0].remaining_indices
    padded = [order[i % length] for i in range(-(-length // n) * n)]
    steps = -(-len(samplers[0]) // b)
    for j in range(steps):
        assert global_batch(samplers, j, b) == sorted(padded[j * G:(j + 1) * G]), (n, j)


def run_epoch_with_resets(monkeypatch, length, G, layout):
    """Trains through one epoch, changing the number of ranks after the given numbers of
    steps (layout: [(n, steps), ..., (n_last, None)]); returns the global batches."""
    batches, state = [], None
    for n, steps in layout:
        samplers = samplers_for(monkeypatch, list(range(length)), n, state=state)
        b = G // n
        total = -(-len(samplers[0]) // b)
        for j in range(total if steps is None else steps):
            batches.append(global_batch(samplers, j, b))
            for s in samplers:
                s.record_batch(j, b)
        # Every rank recorded the whole global batch: their records are the same.
        assert all(s.state_dict() == samplers[0].state_dict() for s in samplers)
        state = samplers[0].state_dict()
    return batches


def test_sampler_resume_with_other_number_of_ranks(monkeypatch):
    length, G = 60, 12
    plain = run_epoch_with_resets(monkeypatch, length, G, [(1, None)])
    assert len(plain) == 5
    for layout in ([(3, 2), (2, None)], [(4, 1), (2, 1), (3, 1), (1, None)],
                   [(2, 0), (6, 3), (4, None)]):
        assert run_epoch_with_resets(monkeypatch, length, G, layout) == plain, layout


def test_sampler_resume_continues_after_processed(monkeypatch):
    three = samplers_for(monkeypatch, list(range(30)), 3)
    order = three[0].remaining_indices
    for s in three:
        s.record_batch(0, 2)  # positions 0..5
        s.record_batch(1, 2)  # positions 6..11
    two = samplers_for(monkeypatch, list(range(30)), 2, state=three[0].state_dict())
    assert two[0].remaining_indices == order[12:]
    assert global_batch(two, 0, 3) == sorted(order[12:18])
    assert len(two[0]) == 9


def test_sampler_state_dict_round_trip_and_set_epoch(monkeypatch):
    s = samplers_for(monkeypatch, list(range(20)), 2, epoch=3)[1]
    s.record_batch(0, 4)
    s.record_indices([s.indices[5]])
    saved = s.state_dict()
    assert saved["epoch"] == 3 and len(saved["processed_indices"]) == 9
    other = samplers_for(monkeypatch, list(range(20)), 2)[1]
    other.load_state_dict(saved)
    assert other.state_dict() == saved
    s.reset()
    assert other.remaining_indices == s.remaining_indices and other.indices == s.indices
    assert len(s.remaining_indices) == 11
    s.set_epoch(4)
    assert s.epoch == 4 and s.processed_indices == set() and len(s.remaining_indices) == 20


def test_sampler_record_past_the_end_is_harmless(monkeypatch):
    s = samplers_for(monkeypatch, list(range(7)), 2)[0]
    assert s.get_indices(1, 4) == []
    s.record_batch(0, 4)
    s.record_batch(1, 4)
    assert s.processed_indices == set(range(7))
    s.reset()
    assert len(s) == 0 and list(s) == []


# ------------------------------------------------------------------------------ TorchState


def test_torch_state_restore_rolls_back_model_and_optimizer():
    model = make_model(1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    local_step(model, optimizer, 10)
    state = hvd.elastic.TorchState(model, optimizer, epoch=2)
    local_step(model, optimizer, 11)
    state.commit()
    committed = snapshot(model, optimizer)
    for seed in (12, 13):
        local_step(model, optimizer, seed)
    state.epoch = 3
    assert not torch.equal(model[0].weight, committed[0][0])
    state.restore()
    assert_snapshot(model, optimizer, committed)
    assert state.epoch == 2
    # The saved state is not aliased: training after a restore leaves it unchanged.
    local_step(model, optimizer, 14)
    state.restore()
    assert_snapshot(model, optimizer, committed)


def test_torch_state_tracks_every_module_and_optimizer_and_reassignments():
    # Horovod's TorchState: a GAN's second model and optimizer are rolled back in place like
    # the first, and an attribute given a new module tracks the new one.
    model, disc = make_model(3), make_model(4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    disc_opt = torch.optim.SGD(disc.parameters(), lr=0.2, momentum=0.9)
    state = hvd.elastic.TorchState(model, optimizer, disc=disc, disc_opt=disc_opt, epoch=0)
    local_step(disc, disc_opt, 40)
    state.commit()
    committed = snapshot(disc, disc_opt)
    local_step(disc, disc_opt, 41)
    state.restore()
    assert state.disc is disc and state.disc_opt is disc_opt
    assert_snapshot(disc, disc_opt, committed)
    replacement = make_model(5)
    state.model = replacement
    state.commit()
    kept = [t.clone() for t in replacement.state_dict().values()]
    with torch.no_grad():
        for p in replacement.parameters():
            p.add_(1.0)
    state.restore()
    assert state.model is replacement
    for got, want in zip(replacement.state_dict().values(), kept):
        assert torch.equal(got, want)


def test_torch_state_restore_with_distributed_optimizer():
    model = make_model(2)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer)
    state.sync()  # rank 0's parameters everywhere
    local_step(model, optimizer, 20)  # allreduced gradients: the same step everywhere
    state.commit()
    committed = snapshot(model, optimizer)
    local_step(model, optimizer, 21)
    state.restore()
    assert_snapshot(model, optimizer, committed)
    local_step(model, optimizer, 21)  # still trains (hooks and handles intact)
    assert_same_on_all_ranks(list(model.parameters()), "elastic.dist_opt")


def test_torch_state_sync_makes_every_rank_equal_to_rank_0(monkeypatch):
    monkeypatch.setattr(sampler_module, "_topology", lambda: (RANK, SIZE))
    model = make_model(100 + RANK)  # different on every rank
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 + RANK, momentum=0.9)
    local_step(model, optimizer, 30 + RANK)
    sampler = hvd.elastic.ElasticSampler(list(range(40)), seed=5)
    sampler.set_epoch(1 + (RANK > 0))  # a newcomer's epoch differs from rank 0's
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=RANK,
                                   history=[RANK])
    sampler.record_batch(0, 2)
    sampler.record_indices([sampler.indices[3]])  # this rank only
    state.commits = 7 if RANK == 0 else 0
    state.sync()
    assert_same_on_all_ranks(list(model.state_dict().values()), "elastic.sync_params")
    assert_same_on_all_ranks([optimizer.state[p]["momentum_buffer"]
                              for p in model.parameters()], "elastic.sync_momentum")
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)
    assert state.epoch == 0 and state.history == [0] and state.commits == 7
    assert sampler.epoch == 1
    # Ranks at rank 0's epoch and commit add their records (here only rank 0 is).
    assert len(sampler.processed_indices) == 2 * SIZE + 1
    rows = hvd.allgather_object(sampler.state_dict(), name="elastic.sync_sampler")
    assert all(row == rows[0] for row in rows)
    assert len(sampler) == -(-(40 - len(sampler.processed_indices)) // SIZE)
    # sync() saved: a restore now returns to the synced state.
    state.epoch = 99
    state.restore()
    assert state.epoch == 0 and state.commits == 7


def test_torch_state_sampler_union_of_local_records(monkeypatch):
    monkeypatch.setattr(sampler_module, "_topology", lambda: (RANK, SIZE))
    sampler = hvd.elastic.ElasticSampler(list(range(30)), seed=1)
    state = hvd.elastic.TorchState(sampler=sampler)
    sampler.record_indices(sampler.indices[:2])
    state.sync()
    assert len(sampler.processed_indices) == 2 * SIZE
    # A rank one commit ahead of rank 0 (a failure hit between the ranks' commits) does not
    # make the others skip a batch rank 0 has not trained on.
    before = sampler.state_dict()
    if RANK == SIZE - 1 and SIZE > 1:
        sampler.record_batch(0, 2)
        state.commit()
    state.sync()
    assert sampler.state_dict() == before


def test_object_state_save_restore_sync():
    state = hvd.elastic.ObjectState(epoch=RANK, seen={"a": [RANK]})
    state.sync()
    assert state.epoch == 0 and state.seen == {"a": [0]}
    state.seen["a"].append(1)  # mutated in place: the saved copy must not change
    state.epoch = 5
    state.commit()
    state.seen["a"].append(2)
    state.epoch = 6
    state.restore()
    assert state.epoch == 5 and state.seen == {"a": [0, 1]}


def test_commit_counter_rolls_back():
    state = hvd.elastic.ObjectState(x=0)
    for _ in range(3):
        state.commit()
    assert state.commits == 3
    state.x = 1
    state.commits = 10
    state.restore()
    assert state.commits == 3 and state.x == 0


def test_check_host_updates_without_elastic_mode_raises_nothing():
    state = hvd.elastic.ObjectState(x=1)
    state.check_host_updates()
    state.commit()


@pytest.mark.parametrize("update,skip", [((True, True), True), ((True, False), False),
                                          ((False, False), None)])
def test_check_host_updates_broadcasts_rank_0s_answer(monkeypatch, update, skip):
    monkeypatch.setattr(_core_bridge, "elastic_enabled", lambda: True)
    asked = []

    def host_update():
        asked.append(RANK)
        # Only rank 0's answer counts: the others would say something else.
        return update if RANK == 0 else (not update[0], False)

    monkeypatch.setattr(_core_bridge, "elastic_host_update", host_update)
    state = hvd.elastic.ObjectState(x=1)
    if skip is None:
        state.commit()
    else:
        with pytest.raises(HostsUpdatedInterrupt) as info:
            state.commit()
        assert info.value.skip_sync is skip
    assert asked == ([0] if RANK == 0 else [])
    assert state.commits == 1  # saved before the check


def test_bridge_outside_elastic_mode():
    # Every build of the core has the elastic functions: no skip, a build without them fails.
    assert BRIDGE["elastic_enabled"]() is False
    assert BRIDGE["elastic_round"]() == (0, False)
    assert BRIDGE["elastic_host_update"]() == (False, False)


def test_bridge_names_a_missing_core_function(monkeypatch):
    for name in BRIDGE:
        monkeypatch.delattr(_core_bridge._core, name, raising=False)
    monkeypatch.delenv("KRUG_ELASTIC", raising=False)
    assert BRIDGE["elastic_enabled"]() is False  # a fixed job runs on an old core
    with pytest.raises(RuntimeError, match="elastic_round"):
        BRIDGE["elastic_round"]()
    monkeypatch.setenv("KRUG_ELASTIC", "1")
    with pytest.raises(RuntimeError, match="elastic_enabled"):
        BRIDGE["elastic_enabled"]()


# ------------------------------------------------------------------------------ run_fn


class RecordingState(common.State):
    def __init__(self, events):
        super().__init__(bcast_object=lambda obj: obj, get_rank=lambda: RANK)
        self.events = events

    def save(self):
        self.events.append("save")
        super().save()

    def restore(self):
        self.events.append("restore")
        super().restore()

    def sync(self):
        self.events.append("sync")
        super().sync()

    def on_reset(self):
        self.events.append("on_reset")
        super().on_reset()


def scripted(events, outcomes):
    """A training function that commits once, then raises (or returns) the next outcome."""
    def train(state, tag):
        events.append("func")
        state.commit()
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return (tag, outcome)
    return train


def test_run_fn_restores_on_error_and_keeps_state_on_host_update(capsys):
    events = []
    rounds = iter([(1, False), (2, False)])
    callbacks = []
    state = RecordingState(events)
    state.register_reset_callbacks([lambda: callbacks.append(len(events))])
    train = common.run_fn(
        scripted(events, [HorovodInternalError("rank 2 disconnected\nmore detail"),
                          HostsUpdatedInterrupt(skip_sync=True), 42]),
        reset=lambda: events.append("reset"), elastic_round=lambda: next(rounds),
        topology=lambda: (RANK, SIZE))
    assert train(state, "t") == ("t", 42)
    assert events == ["sync", "func", "save", "restore", "reset", "on_reset",
                      "sync", "func", "save", "reset", "on_reset",
                      "func", "save"]
    assert callbacks == [6, 11]
    assert state.commits == 3
    err = capsys.readouterr().err
    assert ("krug.elastic: rank %d: HorovodInternalError: rank 2 disconnected; "
            "rolling back to commit 1" % RANK) in err
    assert "krug.elastic: round 1: now rank %d of %d (was rank %d of %d)" % (
        RANK, SIZE, RANK, SIZE) in err
    assert "hosts changed (only removed); keeping commit 2" in err


def test_run_fn_syncs_when_new_workers_joined():
    events = []
    state = RecordingState(events)
    train = common.run_fn(scripted(events, [HostsUpdatedInterrupt(skip_sync=True), "done"]),
                          reset=lambda: events.append("reset"),
                          elastic_round=lambda: (1, True))
    assert train(state, "t") == ("t", "done")
    assert events == ["sync", "func", "save", "reset", "on_reset", "sync", "func", "save"]


def test_run_fn_removed_worker_exits_with_status_0(capsys):
    def reset():
        raise WorkerRemoved("host 127.0.0.3 left the discovery output")

    state = RecordingState([])
    train = common.run_fn(scripted([], [HostsUpdatedInterrupt()]), reset=reset)
    with pytest.raises(SystemExit) as info:
        train(state, "t")
    assert info.value.code == 0
    assert "removed from the job by the elastic driver" in capsys.readouterr().err


def test_run_fn_propagates_without_elastic_driver():
    state = RecordingState([])
    train = common.run_fn(scripted([], [HorovodInternalError("boom")]),
                          reset=lambda: pytest.fail("no reset without a driver"),
                          elastic_enabled=lambda: False)
    with pytest.raises(HorovodInternalError):
        train(state, "t")


def train_steps(state, optimizer, steps, fail_after=None):
    """Trains from state.step with allreduced gradients, committing every step; raises
    HorovodInternalError on every rank right after step ``fail_after`` (uncommitted)."""
    while state.step < steps:
        local_step(state.model, optimizer, 1000 + 10 * state.step + RANK)
        if state.step == fail_after:
            raise HorovodInternalError("injected failure")
        state.step += 1
        state.commit()
    return state.step


def test_torch_run_recovers_to_the_undisturbed_result(monkeypatch):
    monkeypatch.setattr(_core_bridge, "elastic_enabled", lambda: True)
    monkeypatch.setattr(_core_bridge, "elastic_host_update", lambda: (False, False))
    monkeypatch.setattr(_core_bridge, "elastic_round", lambda: (1, False))
    resets = []
    monkeypatch.setattr(hvd.elastic, "_reset", lambda: resets.append(1))

    def job(fail_after):
        model = make_model(7 + RANK)  # synced from rank 0 on the first call
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
            named_parameters=model.named_parameters())
        state = hvd.elastic.TorchState(model, optimizer, step=0)
        failures = []

        @hvd.elastic.run
        def train(state):
            # Fails once: the reset callback counts the failures outside the state.
            return train_steps(state, optimizer, 6,
                               fail_after=None if failures else fail_after)

        state.register_reset_callbacks([lambda: failures.append(1)])
        assert train(state) == 6
        return model, state

    clean, _ = job(None)
    assert resets == []
    recovered, state = job(3)
    assert resets == [1]
    assert state.commits == 6
    for a, b in zip(clean.parameters(), recovered.parameters()):
        assert torch.equal(a, b)
    assert_same_on_all_ranks(list(recovered.parameters()), "elastic.recovered")


def test_torch_run_without_elastic_driver_runs_once():
    calls = []

    @hvd.elastic.run
    def train(state, x):
        calls.append(x)
        state.commit()
        return x + 1

    state = hvd.elastic.ObjectState(value=RANK)
    assert train(state, 1) == 2
    assert calls == [1] and state.value == 0 and state.commits == 1
