"""krug.torch collectives, run inside every rank of `krugrun -np N python3 -m pytest`.

Expected values are built from rank numbers: rank r contributes 2r+1, so over n ranks
Sum = n^2, Average = n, Min = 1, Max = 2n-1, Product = 1*3*5*..., all exact in every dtype
for n <= 3. Every test uses its own tensor names.
"""

import os
import warnings

import pytest
import torch

import krug.torch as hvd
from krug import info
from krug_testing import contribution, expected_reduction, reduce_ops

# torch 2.3 added the wide unsigned dtypes; the torch 1.13 pass runs without them.
WIDE_UNSIGNED = [getattr(torch, name) for name in ("uint16", "uint32", "uint64")
                 if hasattr(torch, name)]
NUMERIC = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, *WIDE_UNSIGNED,
           torch.float16, torch.bfloat16, torch.float32, torch.float64]
ALL = NUMERIC + [torch.bool]
OPS = reduce_ops(hvd)


def n():
    return hvd.size()


def r():
    return hvd.rank()


def expected(op):
    return expected_reduction(op, n())


def dname(dtype):
    return str(dtype).replace("torch.", "")


# ---- topology and flags ----

def test_topology_matches_the_launcher():
    assert hvd.is_initialized()
    # krugrun sets KRUG_*; a plain mpirun sets only its own OMPI_COMM_WORLD_*. One host unless
    # the launcher said otherwise (the multi-host tests run this file across hosts).
    env = os.environ
    as_int = lambda name, fallback: int(env.get(name, fallback))
    assert hvd.size() == as_int("KRUG_SIZE", env.get("OMPI_COMM_WORLD_SIZE", "1"))
    assert hvd.rank() == as_int("KRUG_RANK", env.get("OMPI_COMM_WORLD_RANK", "0"))
    assert hvd.local_size() == as_int("KRUG_LOCAL_SIZE", hvd.size())
    assert hvd.local_rank() == as_int("KRUG_LOCAL_RANK", hvd.rank())
    assert hvd.cross_size() == as_int("KRUG_CROSS_SIZE", 1)
    assert hvd.cross_rank() == as_int("KRUG_CROSS_RANK", 0)
    assert hvd.global_process_set.process_set_id == 0
    assert hvd.global_process_set.ranks == list(range(n()))
    assert hvd.global_process_set.size() == n()
    assert hvd.global_process_set.rank() == r()
    assert hvd.global_process_set.included()


def test_build_flags():
    # The data plane is MPI when mpirun started the ranks, unless KRUG_CPU_OPERATIONS says gloo.
    on_mpi = ("OMPI_COMM_WORLD_SIZE" in os.environ
              and os.environ.get("KRUG_CPU_OPERATIONS", "mpi").lower() == "mpi")
    assert hvd.gloo_built() is True
    assert hvd.gloo_enabled() == (not on_mpi)
    assert hvd.mpi_enabled() == on_mpi
    if on_mpi:
        # krug asks for MPI_THREAD_MULTIPLE, which Debian's Open MPI provides.
        assert hvd.mpi_threads_supported() is True and hvd.mpi_built() is True
    else:  # Horovod's answer off MPI
        with pytest.raises(ValueError, match="not on MPI"):
            hvd.mpi_threads_supported()
    assert [hvd.ddl_built(), hvd.ccl_built(), hvd.rocm_built()] == [False] * 3
    # CUDA and NCCL are there when the build found them (docs/gpu.md); NCCL only with CUDA.
    assert type(hvd.cuda_built()) is bool and (hvd.cuda_built() or not hvd.nccl_built())


def test_nccl_built_is_horovods_nccl_version_code():
    # 22809 for the NCCL 2.28.9 that krugrun --check-build names, 0 without NCCL.
    assert type(hvd.nccl_built()) is int and hvd.nccl_built() == info.nccl_version_code()
    init_again = hvd.init  # init() while initialized does nothing
    init_again()
    assert hvd.is_initialized()


# ---- allreduce ----

@pytest.mark.parametrize("dtype", NUMERIC, ids=dname)
@pytest.mark.parametrize("op", list(OPS))
def test_allreduce_every_dtype_and_op(dtype, op):
    x = torch.full((3, 5), contribution(r()), dtype=dtype)
    before = x.clone()
    y = hvd.allreduce(x, name="ar.{}.{}".format(dname(dtype), op), op=OPS[op])
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y, torch.full((3, 5), expected(op), dtype=dtype))
    assert torch.equal(x, before)  # out of place


@pytest.mark.parametrize("op,value", [("sum", None), ("max", None), ("min", None),
                                      ("product", None)])
def test_allreduce_bool(op, value):
    # Sum/Max are OR, Min/Product are AND. Rank 0 contributes [T, T, F], others [F, T, F].
    x = torch.tensor([r() == 0, True, False])
    y = hvd.allreduce(x, name="ar.bool." + op, op=OPS[op])
    any_ = torch.tensor([True, True, False])
    all_ = torch.tensor([n() == 1, True, False])
    assert torch.equal(y, any_ if op in ("sum", "max") else all_)


def test_allreduce_in_place_and_async():
    x = torch.full((4,), float(contribution(r())))
    y = hvd.allreduce_(x, name="ar.inplace", op=hvd.Sum)
    assert y is x
    assert torch.equal(x, torch.full((4,), float(n() * n())))

    a = torch.full((2, 2), float(contribution(r())), dtype=torch.float64)
    h1 = hvd.allreduce_async(a, name="ar.async.out")
    b = torch.full((7,), contribution(r()), dtype=torch.int32)
    h2 = hvd.allreduce_async_(b, name="ar.async.in", op=hvd.Max)
    out = hvd.synchronize(h1)
    assert torch.equal(out, torch.full((2, 2), float(n()), dtype=torch.float64))
    assert torch.equal(a, torch.full((2, 2), float(contribution(r())), dtype=torch.float64))
    hvd.synchronize(h2)
    assert torch.equal(b, torch.full((7,), 2 * n() - 1, dtype=torch.int32))


def test_poll_and_synchronize():
    x = torch.ones(1000)
    h = hvd.allreduce_async(x, name="ar.poll", op=hvd.Sum)
    while not hvd.poll(h):
        pass
    assert hvd.poll(h)
    assert torch.equal(hvd.synchronize(h), torch.full((1000,), float(n())))
    with pytest.raises(ValueError):
        hvd.poll(h)  # already synchronized
    assert hvd.synchronize(h) is None


def test_synchronized_handle_stays_unknown_when_its_slot_is_reused():
    # The handle table reuses slots; a finished handle must not name the operation that took
    # its slot, nor may two live handles share an id.
    old = hvd.allreduce_async(torch.ones(4), name="ar.reuse.old", op=hvd.Sum)
    hvd.synchronize(old)
    live = [hvd.allreduce_async(torch.full((4,), float(k)), name="ar.reuse.%d" % k, op=hvd.Sum)
            for k in range(3)]
    assert len(set(live)) == 3 and old not in live
    with pytest.raises(ValueError):
        hvd.poll(old)
    assert hvd.synchronize(old) is None
    for k, h in enumerate(live):
        assert torch.equal(hvd.synchronize(h), torch.full((4,), float(k * n())))


def test_allreduce_scale_factors():
    x = torch.full((3,), float(contribution(r())), dtype=torch.float64)
    y = hvd.allreduce(x, name="ar.scaled", op=hvd.Sum, prescale_factor=2.0,
                      postscale_factor=0.25)
    assert torch.allclose(y, torch.full((3,), n() * n() * 0.5, dtype=torch.float64))
    y = hvd.allreduce(x, name="ar.scaled.avg", op=hvd.Average, postscale_factor=3.0)
    assert torch.allclose(y, torch.full((3,), 3.0 * n(), dtype=torch.float64))


def test_average_argument_is_deprecated():
    x = torch.full((2,), float(contribution(r())))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        y = hvd.allreduce(x, average=False, name="ar.average.false")
        assert any(issubclass(i.category, DeprecationWarning) for i in w)
    assert torch.equal(y, torch.full((2,), float(n() * n())))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = hvd.allreduce(x, average=True, name="ar.average.true")
    assert torch.equal(y, torch.full((2,), float(n())))
    with pytest.raises(ValueError):
        hvd.allreduce(x, average=True, op=hvd.Sum, name="ar.average.both")
    # The default op is Average.
    assert torch.equal(hvd.allreduce(x, name="ar.default"), torch.full((2,), float(n())))


def test_allreduce_non_contiguous_and_odd_shapes():
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (r() + 1)
    view = base.t()  # non-contiguous
    assert not view.is_contiguous()
    total = sum(k + 1 for k in range(n()))
    y = hvd.allreduce(view, name="ar.noncontig", op=hvd.Sum)
    assert torch.equal(y, torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * total)
    hvd.allreduce_(view, name="ar.noncontig.inplace", op=hvd.Sum)
    assert torch.equal(base, torch.arange(12, dtype=torch.float32).reshape(3, 4) * total)

    empty = hvd.allreduce(torch.zeros(0, 3), name="ar.empty", op=hvd.Sum)
    assert empty.shape == (0, 3)
    scalar = hvd.allreduce(torch.tensor(float(contribution(r()))), name="ar.scalar", op=hvd.Sum)
    assert scalar.shape == () and scalar.item() == n() * n()
    big = hvd.allreduce(torch.ones(100003), name="ar.big", op=hvd.Sum)
    assert torch.equal(big, torch.full((100003,), float(n())))


def test_synchronous_allreduces_give_the_same_results_on_the_direct_lane_or_not():
    # A small CPU tensor's synchronous allreduce may run on the direct lane (every rank on one
    # host, nothing else in flight, the same call everywhere); the rest goes through the engine:
    # sizes around the lane's limit (16384 float32 = 64 KiB), in place and out of place, with
    # and without another operation in flight, must all give the engine's results.
    sum_all, mean = float(n() * n()), float(n())
    for i in range(120):
        count = (1, 7, 1000, 16384, 16385)[i % 5]
        t = torch.full((count,), 2.0 * r() + 1)
        pending = None
        if i % 7 == 0:
            pending = hvd.allreduce_async(torch.ones(3), name="lane.pending.%d" % i, op=hvd.Sum)
        if i % 3 == 0:
            out = hvd.allreduce(t, name="lane.out.%d" % i, op=hvd.Average)
            assert torch.equal(out, torch.full((count,), mean)), i
            assert torch.equal(t, torch.full((count,), 2.0 * r() + 1)), i
        else:
            assert hvd.allreduce_(t, name="lane.%d" % (i % 10), op=hvd.Sum) is t
            assert torch.equal(t, torch.full((count,), sum_all)), i
        if pending is not None:
            assert torch.equal(hvd.synchronize(pending), torch.full((3,), float(n()))), i


def test_synchronous_broadcasts_and_allgathers_give_the_same_results_on_the_direct_lane_or_not():
    # Small ones may run on the direct lane, as allreduce's; the rest, an unnamed call, a
    # differentiable broadcast and an allgather whose rows differ between the ranks go through
    # the engine or take the lane: every one must give the engine's result.
    for i in range(60):
        # 12 B, 3.6 KiB, 72 KiB and, every seventh call, 720 KiB of int32 (on the board an
        # allgather of it is beyond the lane at any size, a broadcast at 3 ranks or more; read
        # in place, from 32 KiB, neither), and every eleventh 9.6 MB (beyond the lane)
        rows = 60000 if i % 7 == 3 else 800000 if i % 11 == 5 else (1, 300, 6000)[i % 3]
        root = i % n()
        t = torch.full((rows, 3), 10 * i + r(), dtype=torch.int32)
        if i % 4 == 0:
            out = hvd.broadcast(t, root, name="lane.bcast.out.%d" % i)
            assert torch.equal(out, torch.full((rows, 3), 10 * i + root, dtype=torch.int32)), i
            assert torch.equal(t, torch.full((rows, 3), 10 * i + r(), dtype=torch.int32)), i
        else:
            assert hvd.broadcast_(t, root, name=None if i % 5 == 0 else "lane.bcast") is t
            assert torch.equal(t, torch.full((rows, 3), 10 * i + root, dtype=torch.int32)), i
        mine = rows + (r() if i % 6 == 5 else 0)  # every sixth call: a row more per rank
        g = hvd.allgather(torch.full((mine, 2), float(r())), name="lane.gather.%d" % (i % 4))
        want = torch.cat([torch.full((rows + (k if i % 6 == 5 else 0), 2), float(k))
                          for k in range(n())])
        assert torch.equal(g, want), i


def test_unnamed_synchronous_calls_keep_their_names_in_step_on_the_lane_or_not():
    # An unnamed call's name is made once, in the core, whichever way the call then goes: rank
    # 0, with an operation in flight, takes the engine for every third round while its peers
    # come to the lane; the unnamed calls after must still pair up by name.
    tri = float(n() * (n() + 1) // 2)
    for i in range(30):
        pending = None
        if r() == 0 and i % 3 == 0:
            pending = hvd.allreduce_async(torch.ones(2), name="unnamed.pending.%d" % i)
        t = torch.full((4,), float(r() + 1))
        assert torch.equal(hvd.allreduce(t, op=hvd.Sum), torch.full((4,), tri)), i
        assert torch.equal(hvd.allreduce_(t, op=hvd.Sum), torch.full((4,), tri)), i
        assert torch.equal(hvd.broadcast(torch.full((3,), float(r())), 0), torch.zeros(3)), i
        b = torch.full((2,), float(r()))
        assert hvd.broadcast_(b, n() - 1) is b and torch.equal(b, torch.full((2,), n() - 1.0))
        g = hvd.allgather(torch.full((1, 2), float(r())))
        assert torch.equal(g, torch.arange(n(), dtype=torch.float32).repeat_interleave(2)
                           .reshape(n(), 2)), i
        if r() != 0 and i % 3 == 0:
            pending = hvd.allreduce_async(torch.ones(2), name="unnamed.pending.%d" % i)
        if pending is not None:
            assert torch.equal(hvd.synchronize(pending), torch.ones(2)), i


def test_differentiable_ops_record_a_graph_only_where_autograd_needs_one():
    # Without a tensor that requires grad (or with grad mode off) the ops skip their
    # autograd.Function, which costs more than a small allreduce: the same values, no grad_fn.
    x = torch.full((3,), float(r() + 1), requires_grad=True)
    cases = [("ar", lambda t, k: hvd.allreduce(t, name="graph.ar.%s" % k, op=hvd.Sum),
              torch.full((3,), float(n() * (n() + 1) // 2))),
             ("bc", lambda t, k: hvd.broadcast(t, 0, name="graph.bc.%s" % k),
              torch.ones(3)),
             ("ag", lambda t, k: hvd.allgather(t, name="graph.ag.%s" % k),
              torch.arange(1.0, n() + 1).repeat_interleave(3))]
    for label, op, want in cases:
        recorded = op(x, "grad")
        assert recorded.grad_fn is not None and torch.equal(recorded.detach(), want), label
        with torch.no_grad():
            plain = op(x, "nograd")
        assert plain.grad_fn is None and not plain.requires_grad, label
        assert torch.equal(plain, want), label
        detached = op(x.detach(), "detached")
        assert detached.grad_fn is None and torch.equal(detached, want), label
    assert torch.equal(x.detach(), torch.full((3,), float(r() + 1))), "an input changed"


def test_unnamed_ops_get_the_same_names_on_every_rank():
    for _ in range(3):
        y = hvd.allreduce(torch.ones(2), op=hvd.Sum)
        assert torch.equal(y, torch.full((2,), float(n())))
    handles = [hvd.allreduce_async(torch.ones(3) * k, op=hvd.Sum) for k in range(4)]
    for k, h in enumerate(handles):
        assert torch.equal(hvd.synchronize(h), torch.full((3,), float(k * n())))
    assert torch.equal(hvd.allgather(torch.ones(1)), torch.ones(n()))


def test_adasum_is_explicit():
    # Every build has Adasum (it runs on the communicators' send/recv): no skip, its loss fails.
    # Adasum of equal vectors is that vector; sizes that are not a power of two are refused at
    # the call, as Horovod does.
    x = torch.ones(4)
    if n() & (n() - 1):
        with pytest.raises(NotImplementedError, match="power-of-two number of ranks"):
            hvd.allreduce(x, op=hvd.Adasum, name="ar.adasum")
    else:
        assert torch.equal(hvd.allreduce(x, op=hvd.Adasum, name="ar.adasum"), x)
    with pytest.raises(ValueError):
        hvd.allreduce(x, op=42, name="ar.badop")


# ---- grouped allreduce ----

def test_grouped_allreduce():
    xs = [torch.full((k + 1, 2), contribution(r()), dtype=dtype)
          for k, dtype in enumerate([torch.float32, torch.int64, torch.float16])]
    ys = hvd.grouped_allreduce(xs, name="gar.out", op=hvd.Sum)
    assert isinstance(ys, list) and len(ys) == 3
    for x, y in zip(xs, ys):
        assert y.dtype == x.dtype
        assert torch.equal(y, torch.full(x.shape, n() * n(), dtype=x.dtype))
        assert torch.equal(x, torch.full(x.shape, contribution(r()), dtype=x.dtype))

    zs = hvd.grouped_allreduce_(xs, name="gar.inplace", op=hvd.Min)
    for x, z in zip(xs, zs):
        assert z is x and torch.equal(x, torch.ones(x.shape, dtype=x.dtype))

    h = hvd.grouped_allreduce_async([torch.ones(3), torch.ones(5)], name="gar.async")
    outs = hvd.synchronize(h)
    assert [o.shape[0] for o in outs] == [3, 5] and all(torch.equal(o, torch.ones(o.shape))
                                                        for o in outs)
    ws = [torch.full((2,), float(contribution(r()))) for _ in range(2)]
    h = hvd.grouped_allreduce_async_(ws, name="gar.async.inplace", op=hvd.Max)
    hvd.synchronize(h)
    assert all(torch.equal(w, torch.full((2,), float(2 * n() - 1))) for w in ws)


# ---- allgather ----

@pytest.mark.parametrize("dtype", ALL, ids=dname)
def test_allgather_every_dtype(dtype):
    # Rank k contributes k+1 rows of value k+1 (bool: k+1 is odd).
    def rows(k):
        v = (k + 1) % 2 == 1 if dtype == torch.bool else k + 1
        return torch.full((k + 1, 2, 3), v, dtype=dtype)
    y = hvd.allgather(rows(r()), name="ag." + dname(dtype))
    assert y.dtype == dtype
    assert torch.equal(y, torch.cat([rows(k) for k in range(n())]))


def test_allgather_async_and_grouped():
    h = hvd.allgather_async(torch.full((1,), float(r())), name="ag.async")
    assert torch.equal(hvd.synchronize(h), torch.arange(n(), dtype=torch.float32))
    xs = [torch.full((r() + 1,), r(), dtype=torch.int32), torch.full((2, 2), float(r()))]
    ys = hvd.grouped_allgather(xs, name="ag.grouped")
    assert torch.equal(ys[0], torch.cat([torch.full((k + 1,), k, dtype=torch.int32)
                                         for k in range(n())]))
    assert torch.equal(ys[1], torch.cat([torch.full((2, 2), float(k)) for k in range(n())]))
    h = hvd.grouped_allgather_async([torch.ones(1), torch.zeros(2)], name="ag.grouped.async")
    a, b = hvd.synchronize(h)
    assert a.shape == (n(),) and b.shape == (2 * n(),)
    # Non-contiguous input.
    t = (torch.arange(6.0).reshape(2, 3) + r()).t()
    y = hvd.allgather(t, name="ag.noncontig")
    assert torch.equal(y, torch.cat([(torch.arange(6.0).reshape(2, 3) + k).t()
                                     for k in range(n())]))


# ---- broadcast ----

@pytest.mark.parametrize("dtype", ALL, ids=dname)
def test_broadcast_every_dtype_and_root(dtype):
    for root in range(n()):
        v = (r() == root) if dtype == torch.bool else contribution(r())
        x = torch.full((2, 3), v, dtype=dtype)
        before = x.clone()
        y = hvd.broadcast(x, root_rank=root, name="bc.{}.{}".format(dname(dtype), root))
        want = True if dtype == torch.bool else contribution(root)
        assert torch.equal(y, torch.full((2, 3), want, dtype=dtype))
        assert torch.equal(x, before)  # out of place
        z = hvd.broadcast_(x, root, name="bc_.{}.{}".format(dname(dtype), root))
        assert z is x and torch.equal(x, torch.full((2, 3), want, dtype=dtype))


def test_broadcast_async():
    x = torch.full((5,), float(r()))
    h = hvd.broadcast_async(x, 0, name="bc.async")
    assert torch.equal(hvd.synchronize(h), torch.zeros(5))
    assert torch.equal(x, torch.full((5,), float(r())))
    root = n() - 1
    h = hvd.broadcast_async_(x, root, name="bc.async_")
    assert hvd.synchronize(h) is x and torch.equal(x, torch.full((5,), float(root)))
    base = torch.arange(6.0).reshape(2, 3) * (r() + 1)
    hvd.broadcast_(base.t(), 0, name="bc.noncontig")
    assert torch.equal(base, torch.arange(6.0).reshape(2, 3))


# ---- alltoall ----

@pytest.mark.parametrize("dtype", ALL, ids=dname)
def test_alltoall_even_split(dtype):
    # Rank k sends to rank j two rows of value (k*n + j) (bool: its parity).
    def value(k, j):
        v = k * n() + j
        return v % 2 == 1 if dtype == torch.bool else v
    x = torch.cat([torch.full((2, 3), value(r(), j), dtype=dtype) for j in range(n())])
    y = hvd.alltoall(x, name="a2a." + dname(dtype))
    assert isinstance(y, torch.Tensor)
    want = torch.cat([torch.full((2, 3), value(k, r()), dtype=dtype) for k in range(n())])
    assert torch.equal(y, want)


def test_alltoall_with_splits_and_async():
    # Rank k sends j+1 rows of value 10k+j to rank j; so rank j receives j+1 rows from each.
    splits = [j + 1 for j in range(n())]
    x = torch.cat([torch.full((j + 1,), 10 * r() + j, dtype=torch.int64) for j in range(n())])
    y, received = hvd.alltoall(x, splits=splits, name="a2a.splits")
    assert received.dtype == torch.int32
    assert received.tolist() == [r() + 1] * n()
    assert torch.equal(y, torch.cat([torch.full((r() + 1,), 10 * k + r(), dtype=torch.int64)
                                     for k in range(n())]))
    h = hvd.alltoall_async(x, torch.tensor(splits, dtype=torch.int32), name="a2a.async")
    y2, received2 = hvd.synchronize(h)
    assert torch.equal(y2, y) and torch.equal(received2, received)
    h = hvd.alltoall_async(torch.zeros(n(), 2), name="a2a.async.even")
    y3, received3 = hvd.synchronize(h)
    assert y3.shape == (n(), 2) and received3.tolist() == [1] * n()
    with pytest.raises(ValueError):
        hvd.alltoall(x, splits=[1] * (n() + 1), name="a2a.badsplits")


# ---- reducescatter ----

@pytest.mark.parametrize("dtype", NUMERIC, ids=dname)
@pytest.mark.parametrize("op", ["sum", "average", "min", "max"])
def test_reducescatter_every_dtype(dtype, op):
    rows = 2 * n() + 1  # uneven: rank 0 gets 3 rows, the others 2
    x = torch.full((rows, 2), contribution(r()), dtype=dtype)
    y = hvd.reducescatter(x, name="rs.{}.{}".format(dname(dtype), op), op=OPS[op])
    mine = 3 if r() == 0 else 2
    assert y.dtype == dtype
    assert torch.equal(y, torch.full((mine, 2), expected(op), dtype=dtype))


def test_reducescatter_default_op_async_and_grouped():
    x = torch.arange(2.0 * n()).reshape(n(), 2) * contribution(r())
    y = hvd.reducescatter(x, name="rs.default")  # Average
    assert torch.allclose(y, torch.arange(2.0 * n()).reshape(n(), 2)[r()] * n())
    h = hvd.reducescatter_async(x, name="rs.async", op=hvd.Sum)
    assert torch.allclose(hvd.synchronize(h), torch.arange(2.0 * n()).reshape(n(), 2)[r()]
                          * n() * n())
    xs = [torch.ones(n(), 3), torch.full((2 * n(),), contribution(r()), dtype=torch.int32)]
    ys = hvd.grouped_reducescatter(xs, name="rs.grouped", op=hvd.Sum)
    assert torch.equal(ys[0], torch.full((1, 3), float(n())))
    assert torch.equal(ys[1], torch.full((2,), n() * n(), dtype=torch.int32))
    h = hvd.grouped_reducescatter_async(xs, name="rs.grouped.async", op=hvd.Max)
    zs = hvd.synchronize(h)
    assert torch.equal(zs[1], torch.full((2,), 2 * n() - 1, dtype=torch.int32))
    y = hvd.reducescatter(x, name="rs.scaled", op=hvd.Sum, prescale_factor=0.5,
                          postscale_factor=4.0)
    assert torch.allclose(y, torch.arange(2.0 * n()).reshape(n(), 2)[r()] * n() * n() * 2)


# ---- autograd ----

def weight():
    return float(r() + 1)


def test_allreduce_gradient():
    for op, factor in [(hvd.Sum, 1.0), (hvd.Average, 1.0 / n())]:
        x = torch.full((4,), float(r()), dtype=torch.float64, requires_grad=True)
        y = hvd.allreduce(x, op=op, name="grad.ar.{}".format(op), prescale_factor=2.0)
        (y * weight()).sum().backward()
        # Horovod's rule: grad = allreduce(grad_y) with the same op and scale factors.
        total = sum(k + 1 for k in range(n()))
        assert torch.allclose(x.grad, torch.full((4,), total * factor * 2.0, dtype=torch.float64))


def test_grouped_allreduce_gradient():
    xs = [torch.ones(k + 1, requires_grad=True) for k in range(2)]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum, name="grad.gar")
    sum((y * weight() * (k + 1)).sum() for k, y in enumerate(ys)).backward()
    total = sum(k + 1 for k in range(n()))
    for k, x in enumerate(xs):
        assert torch.allclose(x.grad, torch.full((k + 1,), float(total * (k + 1))))


def test_allgather_gradient():
    x = torch.ones(r() + 1, 2, requires_grad=True)
    y = hvd.allgather(x, name="grad.ag")
    assert y.shape == (n() * (n() + 1) // 2, 2)
    # d loss / d y = rank+1 everywhere; Horovod averages it over ranks and keeps our rows.
    (y * weight()).sum().backward()
    avg = sum(k + 1 for k in range(n())) / n()
    assert torch.allclose(x.grad, torch.full((r() + 1, 2), avg))


def test_grouped_allgather_gradient():
    xs = [torch.ones(r() + 1, requires_grad=True), torch.ones(1, 3, requires_grad=True)]
    ys = hvd.grouped_allgather(xs, name="grad.gag")
    (ys[0].sum() * weight() + ys[1].sum() * 2 * weight()).backward()
    avg = sum(k + 1 for k in range(n())) / n()
    assert torch.allclose(xs[0].grad, torch.full((r() + 1,), avg))
    assert torch.allclose(xs[1].grad, torch.full((1, 3), 2 * avg))


def test_broadcast_gradient():
    root = n() - 1
    x = torch.full((3,), float(r()), requires_grad=True)
    y = hvd.broadcast(x, root, name="grad.bc")
    assert torch.equal(y.detach(), torch.full((3,), float(root)))
    (y * weight()).sum().backward()
    # Horovod's rule: the averaged gradient on the root, zeros elsewhere.
    avg = sum(k + 1 for k in range(n())) / n()
    assert torch.allclose(x.grad, torch.full((3,), avg if r() == root else 0.0))


def test_alltoall_gradient():
    splits = [j + 1 for j in range(n())]
    rows = sum(splits)
    x = torch.ones(rows, 2, requires_grad=True)
    y, received = hvd.alltoall(x, splits=splits, name="grad.a2a")
    (y * weight()).sum().backward()
    # The rows sent to rank j come back with j's weight.
    want = torch.cat([torch.full((j + 1, 2), float(j + 1)) for j in range(n())])
    assert torch.allclose(x.grad, want)
    x2 = torch.ones(2 * n(), requires_grad=True)
    y2 = hvd.alltoall(x2, name="grad.a2a.even")
    (y2 * weight()).sum().backward()
    assert torch.allclose(x2.grad, torch.cat([torch.full((2,), float(j + 1))
                                              for j in range(n())]))


def test_reducescatter_gradient():
    # Horovod's rule: Sum scales the allgathered gradient by the set's size, Average does not.
    for op, factor in [(hvd.Sum, float(n())), (hvd.Average, 1.0)]:
        x = torch.ones(2 * n() + 1, 2, dtype=torch.float64, requires_grad=True)
        y = hvd.reducescatter(x, op=op, name="grad.rs.{}".format(op))
        (y * weight()).sum().backward()
        # Rank j's rows of every input get rank j's weight.
        counts = [3 if j == 0 else 2 for j in range(n())]
        want = torch.cat([torch.full((c, 2), (j + 1) * factor, dtype=torch.float64)
                          for j, c in enumerate(counts)])
        assert torch.allclose(x.grad, want)


# ---- process sets ----

def test_process_sets():
    # Horovod's ValueErrors, raised before the core is asked.
    with pytest.raises(ValueError, match="duplicate process set"):
        hvd.add_process_set(list(range(n())))  # the global set
    with pytest.raises(ValueError, match="repeats a rank"):
        hvd.add_process_set([0, 0])
    with pytest.raises(ValueError, match="must be among"):
        hvd.add_process_set([n()])
    assert hvd.ProcessSet({0}).ranks == [0]  # any iterable of ranks, as in Horovod
    if n() == 1:
        return
    evens = hvd.ProcessSet(list(range(0, n(), 2)))
    assert evens.process_set_id is None and evens.size() is None
    ps = hvd.add_process_set(evens)
    assert ps is evens and ps.process_set_id > 0
    assert ps.size() == len(evens.ranks)
    assert ps.included() == (r() % 2 == 0)
    assert ps.rank() == (r() // 2 if r() % 2 == 0 else -1)
    last = hvd.add_process_set([n() - 1])
    if ps.included():
        y = hvd.allreduce(torch.full((3,), float(contribution(r()))), op=hvd.Sum,
                          name="ps.ar", process_set=ps)
        assert torch.equal(y, torch.full((3,), float(sum(contribution(k) for k in evens.ranks))))
        g = hvd.allgather(torch.full((1,), r()), name="ps.ag", process_set=ps)
        assert g.tolist() == evens.ranks
        b = hvd.broadcast(torch.full((2,), r()), root_rank=evens.ranks[-1],
                          name="ps.bc", process_set=ps)
        assert b.tolist() == [evens.ranks[-1]] * 2
        a, received = hvd.alltoall(torch.full((len(evens.ranks),), r()),
                                   splits=[1] * len(evens.ranks), name="ps.a2a", process_set=ps)
        assert a.tolist() == evens.ranks and received.tolist() == [1] * len(evens.ranks)
        rs = hvd.reducescatter(torch.ones(len(evens.ranks), 2), op=hvd.Sum, name="ps.rs",
                               process_set=ps)
        assert torch.equal(rs, torch.full((1, 2), float(len(evens.ranks))))
        gs = hvd.grouped_allreduce([torch.ones(1), torch.ones(2)], op=hvd.Sum, name="ps.gar",
                                   process_set=ps)
        assert [g.tolist() for g in gs] == [[len(evens.ranks)], [len(evens.ranks)] * 2]
        hvd.barrier(process_set=ps)
    else:
        # Found before anything is sent: a ValueError at the call, as Horovod's.
        with pytest.raises(ValueError, match="not a member"):
            hvd.allreduce(torch.ones(1), name="ps.notmember", process_set=ps)
    if r() == n() - 1:
        y = hvd.allreduce(torch.ones(2), name="ps.last", process_set=last, op=hvd.Sum)
        assert torch.equal(y, torch.ones(2))
    hvd.barrier()
    assert hvd.remove_process_set(ps)
    assert ps.process_set_id is None
    assert hvd.remove_process_set(last)
    assert not hvd.remove_process_set(hvd.global_process_set)
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(torch.ones(1), name="ps.removed", process_set=ps)


# ---- barrier, join ----

def test_barrier():
    for _ in range(3):
        hvd.barrier()


def test_join():
    # The last rank joins at once; the others allreduce with it contributing zeros.
    if r() == n() - 1:
        last = hvd.join()
    else:
        y = hvd.allreduce(torch.ones(3), name="join.ar", op=hvd.Sum)
        assert torch.equal(y, torch.full((3,), float(n() - 1)))
        last = hvd.join()
    assert 0 <= last < n()
    lasts = hvd.allgather(torch.tensor([last]), name="join.check")
    assert len(set(lasts.tolist())) == 1


# ---- errors ----

def test_mismatched_shapes_fail_on_every_rank():
    if n() == 1:
        pytest.skip("needs two ranks to disagree")
    with pytest.raises(hvd.HorovodInternalError, match="Mismatched"):
        hvd.allreduce(torch.ones(r() + 1), name="err.shape")
    with pytest.raises(hvd.HorovodInternalError, match="Mismatched"):
        hvd.broadcast(torch.ones(2, dtype=torch.float32 if r() == 0 else torch.float64), 0,
                      name="err.dtype")
    with pytest.raises(hvd.HorovodInternalError, match="Mismatched"):
        hvd.allgather(torch.ones(1, r() + 1), name="err.ag.trailing")
    with pytest.raises(hvd.HorovodInternalError, match="Mismatched"):
        hvd.reducescatter(torch.ones(n() + r(), 2), name="err.rs.shape")
    with pytest.raises(hvd.HorovodInternalError, match="Mismatched"):
        hvd.grouped_allreduce([torch.ones(2), torch.ones(r() + 1)], name="err.grouped")
    # krug keeps working afterwards.
    assert torch.equal(hvd.allreduce(torch.ones(2), name="err.after", op=hvd.Sum),
                       torch.full((2,), float(n())))


def test_invalid_tensors_raise_value_error():
    with pytest.raises(ValueError, match="complex64"):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64), name="err.complex")
    with pytest.raises(ValueError, match="not supported"):
        hvd.allreduce(torch.ones(2, device="meta"), name="err.meta")
    with pytest.raises(ValueError, match="at least one dimension"):
        hvd.allgather(torch.tensor(1.0), name="err.scalar")
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(2), name="err.set", process_set=hvd.ProcessSet([0]))
    # Nothing was enqueued: the names are free and the ranks still agree.
    assert torch.equal(hvd.allreduce(torch.ones(1), name="err.complex", op=hvd.Sum),
                       torch.full((1,), float(n())))
