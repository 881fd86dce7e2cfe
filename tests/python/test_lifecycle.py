"""krug.torch lifecycle: shutdown() then init() again (elastic restarts rely on it), calls
before init, init(process_sets=...), an unnamed op sequence that restarts its names, and the
timeline started and stopped at run time."""

import os
import tempfile

import pytest
import torch

import krug.torch as hvd
from krug.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from krug.common.timeline import read_timeline


def test_exception_classes():
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    assert hvd.HorovodInternalError is HorovodInternalError
    assert issubclass(hvd.HostsUpdatedInterrupt, RuntimeError)
    assert hvd.HostsUpdatedInterrupt(skip_sync=True).skip_sync
    assert HostsUpdatedInterrupt is hvd.HostsUpdatedInterrupt


def test_shutdown_then_init_again():
    n = hvd.size()
    before = hvd.allreduce(torch.ones(2), op=hvd.Sum)  # unnamed: allreduce.noname.0
    hvd.shutdown()
    assert not hvd.is_initialized()
    hvd.shutdown()  # a second shutdown does nothing
    for call in (hvd.size, hvd.rank, hvd.local_rank, hvd.local_size, hvd.cross_rank,
                 hvd.cross_size, hvd.barrier, hvd.stop_timeline,
                 lambda: hvd.start_timeline("/tmp/krug-never-written.json")):
        with pytest.raises(ValueError, match="not been initialized"):
            call()
    with pytest.raises(HorovodInternalError, match="not initialized"):
        hvd.allreduce(torch.ones(1), name="life.uninit")

    hvd.init()
    assert hvd.is_initialized() and hvd.size() == n
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), before)
    assert torch.equal(hvd.allgather(torch.tensor([hvd.rank()]), name="life.ag"),
                       torch.arange(n))


def test_unnamed_op_names_restart_at_init():
    # A name shows in an error only, so the ranks disagree on purpose: the first unnamed
    # allreduce after init() must fail as "allreduce.noname.0", whatever ran before it.
    if hvd.size() == 1:
        pytest.skip("a lone rank has no one to disagree with")
    for _ in range(3):  # the counter is past 0 (and past anything a stale counter could hold)
        hvd.allreduce(torch.ones(2), op=hvd.Sum)
    hvd.shutdown()
    hvd.init()
    with pytest.raises(hvd.HorovodInternalError, match=r"Mismatched .*'allreduce\.noname\.0'"):
        hvd.allreduce(torch.ones(1 if hvd.rank() == 0 else 2), op=hvd.Sum)
    with pytest.raises(hvd.HorovodInternalError, match=r"Mismatched .*'allreduce\.noname\.1'"):
        hvd.allreduce(torch.ones(1 if hvd.rank() == 0 else 2), op=hvd.Sum)


def test_init_registers_process_sets_and_shutdown_invalidates_them():
    n = hvd.size()
    if n == 1:
        pytest.skip("needs a process set other than the global one")
    first = hvd.ProcessSet([0])
    rest = hvd.ProcessSet(list(range(1, n)))
    hvd.shutdown()
    hvd.init(process_sets=[first, rest])
    assert first.process_set_id is not None and rest.process_set_id is not None
    assert first.process_set_id != rest.process_set_id
    mine = first if hvd.rank() == 0 else rest
    y = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="life.ps", process_set=mine)
    assert torch.equal(y, torch.full((3,), float(mine.size())))
    hvd.barrier()
    hvd.shutdown()
    assert first.process_set_id is None and rest.process_set_id is None
    hvd.init(process_sets="dynamic")
    assert hvd.is_initialized()


def test_init_rejects_mpi_communicators():
    with pytest.raises(ValueError, match="comm"):
        hvd.init(comm=[0, 1, 2, 3, 4, 5, 6, 7, 8])
    hvd.init(comm=list(range(hvd.size())))  # every rank: fine


def test_start_timeline_records_named_ops_and_starts_again_to_a_second_file():
    with tempfile.TemporaryDirectory() as tmp:
        first, second = os.path.join(tmp, "first.json"), os.path.join(tmp, "second.json")
        hvd.start_timeline(first, mark_cycles=True)
        hvd.allreduce(torch.ones(3), name="tl.reduce")
        hvd.allgather(torch.ones(hvd.rank() + 1), name="tl.gather")
        hvd.broadcast(torch.ones(2), root_rank=0, name="tl.bcast")
        hvd.stop_timeline()
        hvd.stop_timeline()  # none runs: nothing to do
        hvd.start_timeline(second)
        hvd.allreduce(torch.ones(3), name="tl.second")
        hvd.stop_timeline()
        if hvd.rank() != 0:
            # Only rank 0 writes a timeline.
            assert not os.path.exists(first) and not os.path.exists(second)
            return
        phases = read_timeline(first)  # the whole file must parse
        assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= phases["tl.reduce"], phases
        assert {"NEGOTIATE_ALLGATHER", "ALLGATHER"} <= phases["tl.gather"], phases
        assert {"NEGOTIATE_BROADCAST", "BROADCAST"} <= phases["tl.bcast"], phases
        assert "tl.second" not in phases and phases["cycles"] == {"CYCLE_START"}
        phases = read_timeline(second)
        assert "ALLREDUCE" in phases["tl.second"] and "tl.reduce" not in phases, phases
        assert "cycles" not in phases


def test_start_timeline_on_an_unwritable_path_is_a_value_error_on_rank_0():
    bad = "/nonexistent-krug-dir/trace.json"
    if hvd.rank() == 0:
        with pytest.raises(ValueError, match="nonexistent-krug-dir"):
            hvd.start_timeline(bad)
    else:
        hvd.start_timeline(bad)  # not rank 0: nothing is opened
    with pytest.raises(ValueError, match="empty"):
        hvd.start_timeline("")  # on every rank
