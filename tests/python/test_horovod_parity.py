"""Horovod 0.28.1 semantics that ported scripts rely on (issue 16), run inside every rank of
`krugrun -np N python3 -m pytest`. Every test uses its own tensor names."""

import pytest
import torch

import krug.torch as hvd


def n():
    return hvd.size()


def r():
    return hvd.rank()


# ---- process sets take global ranks as roots ----

@pytest.fixture(scope="module")
def split_sets():
    """The even and odd ranks as two process sets (the global set in a job of one)."""
    if n() == 1:
        yield [hvd.global_process_set]
        return
    sets = [hvd.add_process_set(list(range(0, n(), 2))),
            hvd.add_process_set(list(range(1, n(), 2)))]
    yield sets
    for ps in sets:
        assert hvd.remove_process_set(ps)


def own_set(sets):
    return next(ps for ps in sets if ps.included())


def test_broadcast_root_is_a_global_rank(split_sets):
    ps = own_set(split_sets)
    root = ps.ranks[-1]  # a global rank; its position in the set differs for odd sets
    x = torch.full((3,), float(r()))
    assert hvd.broadcast(x, root, name="ps.root.bc", process_set=ps).tolist() == [root] * 3
    y = x.clone()
    hvd.broadcast_(y, root, name="ps.root.bc_", process_set=ps)
    assert y.tolist() == [root] * 3
    h = hvd.broadcast_async(x, root, name="ps.root.bca", process_set=ps)
    assert hvd.synchronize(h).tolist() == [root] * 3
    z = x.clone()
    hvd.synchronize(hvd.broadcast_async_(z, root, name="ps.root.bca_", process_set=ps))
    assert z.tolist() == [root] * 3
    obj = hvd.broadcast_object({"from": r()} if r() == root else None, root_rank=root,
                               name="ps.root.obj", process_set=ps)
    assert obj == {"from": root}


def test_broadcast_gradient_root_is_a_global_rank(split_sets):
    ps = own_set(split_sets)
    root = ps.ranks[-1]
    x = torch.full((2,), float(r()), requires_grad=True)
    y = hvd.broadcast(x, root, name="ps.root.grad", process_set=ps)
    (y * (r() + 1)).sum().backward()
    avg = sum(k + 1 for k in ps.ranks) / len(ps.ranks)
    assert x.grad.tolist() == [avg if r() == root else 0.0] * 2


def test_broadcast_root_outside_the_set_raises_value_error(split_sets):
    ps = own_set(split_sets)
    outsider = next((k for k in range(n()) if k not in ps.ranks), n())
    with pytest.raises(ValueError, match="not a member"):
        hvd.broadcast(torch.ones(1), outsider, name="ps.root.outside", process_set=ps)
    # Nothing was submitted: the name is free.
    assert hvd.broadcast(torch.ones(1), ps.ranks[0], name="ps.root.outside",
                         process_set=ps).tolist() == [1.0]


# ---- reducescatter's gradient ----

def rows_of(j, total):
    """Rows of a first dimension `total` that rank j keeps (lower ranks get the extra ones)."""
    return total // n() + (1 if j < total % n() else 0)


@pytest.mark.parametrize("op", ["sum", "average"])
@pytest.mark.parametrize("grouped", [False, True])
def test_reducescatter_gradient_as_horovod(op, grouped):
    # Horovod: the output's gradient times the scale factors, and times the set's size for
    # Sum, allgathered.
    hop = hvd.Sum if op == "sum" else hvd.Average
    pre, post = 2.0, 0.5 if op == "sum" else 3.0
    factor = pre * post * (n() if op == "sum" else 1)
    total = 2 * n() + 1
    xs = [torch.ones(total, 2, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    name = "rs.grad.{}.{}".format(op, grouped)
    if grouped:
        ys = hvd.grouped_reducescatter(xs, op=hop, name=name, prescale_factor=pre,
                                       postscale_factor=post)
    else:
        ys = [hvd.reducescatter(x, op=hop, name="{}.{}".format(name, i), prescale_factor=pre,
                                postscale_factor=post) for i, x in enumerate(xs)]
    weight = r() + 1
    sum(((y * weight * (i + 1)).sum() for i, y in enumerate(ys))).backward()
    for i, x in enumerate(xs):
        want = torch.cat([torch.full((rows_of(j, total), 2), (j + 1) * (i + 1) * factor,
                                     dtype=torch.float64) for j in range(n())])
        assert torch.allclose(x.grad, want)


# ---- broadcast_optimizer_state with parameters that have no gradient ----

@pytest.mark.parametrize("make", ["sgd_momentum", "adam"])
@pytest.mark.parametrize("distributed", [False, True])
def test_broadcast_optimizer_state_with_params_without_gradient(make, distributed):
    torch.manual_seed(r())
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1),
                                torch.nn.Linear(3, 3))
    model[0].weight.requires_grad_(False)  # frozen everywhere
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if make == "sgd_momentum"
           else torch.optim.Adam(model.parameters(), lr=0.1))
    if distributed:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)  # fresh: state made by a zero step
    loss = model[1](model[0](torch.ones(1, 2))).sum()
    if r() == 0 and not distributed:
        loss = loss + model[2](torch.ones(3)).sum()  # model[2] is used on the root only
    loss.backward()
    opt.step()
    root = n() - 1
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    # Every rank now has the root's state: the same parameters, keys and values.
    state = {i: {k: v.tolist() if torch.is_tensor(v) else v for k, v in s.items()}
             for i, s in opt.state_dict()["state"].items()}
    assert hvd.allgather_object(state, name="bos.state.{}.{}".format(make, distributed)) == \
        [state] * n()


# ---- sparse allreduce ----

@pytest.mark.parametrize("op", ["sum", "average"])
def test_sparse_allreduce_async(op, split_sets):
    hop = hvd.Sum if op == "sum" else hvd.Average
    for ps in (hvd.global_process_set, own_set(split_sets)):
        # Rank k sets rows k and k+1 of a 5x2 matrix to k+1.
        dense = torch.zeros(n() + 1, 2)
        dense[r()] = r() + 1
        dense[r() + 1] = r() + 1
        handle = hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse.{}.{}".format(
            op, ps.process_set_id), op=hop, process_set=ps)
        result = hvd.synchronize(handle)
        assert result.is_sparse
        want = torch.zeros(n() + 1, 2)
        for k in ps.ranks:
            want[k] += k + 1
            want[k + 1] += k + 1
        if hop == hvd.Average:
            want /= len(ps.ranks)
        assert torch.allclose(result.to_dense(), want)


def test_distributed_optimizer_sparse_gradients():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(n() + 2, 3, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=1.0),
                                   named_parameters=emb.named_parameters(),
                                   sparse_as_dense=False)
    before = emb.weight.detach().clone()
    emb(torch.tensor([r(), r() + 1])).sum().backward()
    opt.synchronize()
    assert emb.weight.grad.is_sparse
    want = torch.zeros(n() + 2, 3)
    for k in range(n()):
        want[k] += 1.0 / n()
        want[k + 1] += 1.0 / n()
    assert torch.allclose(emb.weight.grad.to_dense(), want)
    with opt.skip_synchronize():
        opt.step()
    assert torch.allclose(emb.weight.detach(), before - want)


# ---- integer pre/postscale as Horovod: per element in float64, toward zero ----

def horovod_scaled(t, factor):
    """Horovod's CPU scaling of an integer tensor: the product in float64, cast toward zero."""
    return torch.trunc(t.double() * factor).to(t.dtype)


INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=[str(d)[6:] for d in INT_DTYPES])
@pytest.mark.parametrize("op", ["sum", "average"])
def test_integer_scaling_truncates_like_horovod(dtype, op):
    hop = hvd.Sum if op == "sum" else hvd.Average
    pre, post = 0.7, 1.3
    rows = 2 * n()

    def value(k):  # rank k's input: small, positive for uint8, and not multiples of anything
        return (torch.arange(rows * 3).reshape(rows, 3) * (k + 3) % 23 + (0 if dtype ==
                torch.uint8 else -5)).to(dtype)

    total = sum(horovod_scaled(value(k), pre).long() for k in range(n()))
    want = horovod_scaled(total, post / (n() if op == "average" else 1)).to(dtype)
    x = value(r())
    name = "scale.{}.{}".format(str(dtype)[6:], op)
    got = hvd.allreduce(x, op=hop, prescale_factor=pre, postscale_factor=post, name=name)
    assert torch.equal(got, want)
    got = hvd.grouped_allreduce([x, x[:1]], op=hop, prescale_factor=pre, postscale_factor=post,
                                name=name + ".grouped")
    assert torch.equal(got[0], want) and torch.equal(got[1], want[:1])
    mine = slice(2 * r(), 2 * r() + 2)
    got = hvd.reducescatter(x, op=hop, prescale_factor=pre, postscale_factor=post,
                            name=name + ".rs")
    assert torch.equal(got, want[mine])
    got = hvd.grouped_reducescatter([x, x], op=hop, prescale_factor=pre, postscale_factor=post,
                                    name=name + ".grs")
    assert torch.equal(got[0], want[mine]) and torch.equal(got[1], want[mine])


def horovod_scaled_half(t, factor):
    """Horovod's CPU scaling of a float16 tensor: in float32, with the factor as a float32."""
    return (t.float() * torch.tensor(factor, dtype=torch.float32)).half()


@pytest.mark.parametrize("where", ["prescale", "postscale"])
def test_half_scaling_is_in_float32_like_horovod(where):
    # Every finite non-negative float16: with this factor (not a float32), 463 of them round
    # differently through float64.
    factor = 1.3
    x = torch.arange(0, 0x7C00, dtype=torch.int32).to(torch.int16).view(torch.float16)
    in_float64 = (x.double() * factor).half()
    want = horovod_scaled_half(x, factor)
    assert not torch.equal(want, in_float64), "the data must tell the two routes apart"
    # Only rank 0 contributes, so the sum adds exact zeros and the scaling alone decides.
    mine = x if r() == 0 else torch.zeros_like(x)
    scales = {"prescale_factor": factor} if where == "prescale" else {"postscale_factor": factor}
    got = hvd.allreduce(mine, op=hvd.Sum, name="scale.half." + where, **scales)
    assert torch.equal(got, want)


# ---- float32 and float64 pre/postscale as Horovod, bit for bit ----

def horovod_scaled_float(t, factor):
    """Horovod's scaling of a float tensor: float64 in float64; float32 in float32, with the
    factor rounded to float32 first."""
    if t.dtype == torch.float64:
        return t * factor
    return t * torch.tensor(factor, dtype=torch.float32)


def disjoint_inputs(dtype, rows, cols=33):
    """Random values of many magnitudes (no subnormals) and rank k's input: those at flat
    positions i with i % size == k, zeros elsewhere. Each element is then one rank's scaled
    value plus exact zeros, so the sum is exact in any order and the scaling alone decides."""
    g = torch.Generator().manual_seed(2024)
    base = torch.rand(rows, cols, generator=g, dtype=torch.float64) * 1.9 + 0.1
    base = base * 10.0 ** torch.randint(-3, 4, (rows, cols), generator=g)
    base = (base * (torch.randint(0, 2, (rows, cols), generator=g) * 2 - 1)).to(dtype)
    owner = torch.arange(rows * cols).reshape(rows, cols) % n()
    return base, [torch.where(owner == k, base, torch.zeros_like(base)) for k in range(n())]


def rounded_once_from_double(t, factor):
    """The route krug took before: the product in float64, rounded once to float32."""
    return (t.double() * factor).float()


def float32_holds(f):
    return torch.tensor(f, dtype=torch.float32).item() == f


# (op, pre, post): factors that float32 does not hold, so that for some elements Horovod's
# float32 product differs from the product rounded once from double. A plain Average scales by
# 1/size: such a factor at 3 ranks.
FLOAT_SCALES = [("sum", 1 / 3, 1.0), ("sum", 0.1, 1.0), ("sum", 1.0, 1 / 7), ("sum", 1.0, 3.3),
                ("sum", 0.1, 1 / 3), ("average", 1.0, 1.0), ("average", 1.0, 0.1),
                ("average", 1 / 7, 3.3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", range(len(FLOAT_SCALES)))
def test_float_scaling_is_bitwise_horovods(dtype, case):
    op, pre, post = FLOAT_SCALES[case]
    hop = hvd.Sum if op == "sum" else hvd.Average
    rows = 16 * n()
    base, inputs = disjoint_inputs(dtype, rows)
    # Horovod (its torch and TensorFlow bindings alike): an Average is a postscale of
    # postscale_factor / size, divided in float64, then applied like any other postscale.
    post_applied = post / n() if op == "average" else post
    want = horovod_scaled_float(horovod_scaled_float(base, pre), post_applied)
    if dtype == torch.float32 and not (float32_holds(pre) and float32_holds(post_applied)):
        # The data must tell the two routes apart, or the comparisons below prove nothing.
        other = rounded_once_from_double(rounded_once_from_double(base, pre), post_applied)
        assert not torch.equal(want, other)
    x = inputs[r()]
    name = "scale.float.{}.{}".format(str(dtype)[6:], case)
    scales = {"prescale_factor": pre, "postscale_factor": post}
    assert torch.equal(hvd.allreduce(x, op=hop, name=name, **scales), want)
    y = x.clone()
    hvd.allreduce_(y, op=hop, name=name + ".inplace", **scales)
    assert torch.equal(y, want)
    got = hvd.grouped_allreduce([x, x[:3]], op=hop, name=name + ".grouped", **scales)
    assert torch.equal(got[0], want) and torch.equal(got[1], want[:3])
    mine = slice(16 * r(), 16 * r() + 16)
    assert torch.equal(hvd.reducescatter(x, op=hop, name=name + ".rs", **scales), want[mine])
    got = hvd.grouped_reducescatter([x, x], op=hop, name=name + ".grs", **scales)
    assert torch.equal(got[0], want[mine]) and torch.equal(got[1], want[mine])


# ---- join after names are in the response cache ----

JOIN_DTYPES = [torch.int32, torch.int64, torch.float32, torch.float64]


@pytest.mark.parametrize("cached", [False, True], ids=["fresh", "cached"])
@pytest.mark.parametrize("first", [0, 1, 2], ids=["first0", "first1", "first2"])
@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("dtype", JOIN_DTYPES, ids=[str(d)[6:] for d in JOIN_DTYPES])
def test_join_after_cached_names(dtype, dims, first, cached):
    # Horovod's test_horovod_join_allreduce: the same two names in every case (their dtype and
    # shape change from case to case), fused, averaged; one rank joins while the others reduce.
    if first >= n():
        pytest.skip("no such rank")
    torch.manual_seed(1234)
    a = torch.randint(-100, 100, (5,) * dims).to(dtype)
    b = torch.randint(-100, 100, (17,) * dims).to(dtype)

    def reduce_both():
        handles = [hvd.allreduce_async(t, name="join.cache." + k, op=hvd.Average)
                   for k, t in (("a", a), ("b", b))]
        return [hvd.synchronize(h) for h in handles]

    if cached:
        reduce_both()
    if r() == first:
        last = hvd.join()
    else:
        averaged = reduce_both()
        last = hvd.join()
        for t, got in zip((a, b), averaged):
            # The joined rank contributes zeros; the sum is divided by the set's size.
            want = t.double() * (n() - 1) / n()
            if not dtype.is_floating_point:
                want = torch.trunc(want)
            assert torch.allclose(got.double(), want, atol=1e-5)
    assert n() == 1 or last != first
    assert hvd.allgather_object(last, name="join.cache.last") == [last] * n()


# ---- a name still in flight raises ValueError at the call ----

def test_duplicate_name_in_flight_raises_value_error_at_once():
    # Rank 0 submits four ops that cannot complete until the others submit them too, which
    # they do only after the gate, which rank 0 reaches after its checks: the first ops are
    # surely still in flight when rank 0 reuses their names.
    if n() == 1:
        pytest.skip("a lone rank completes the first op at once")
    t = torch.full((n(), 2), float(r() + 1))
    submit = {
        "ar": lambda: hvd.allreduce_async(t, name="dup.ar", op=hvd.Sum),
        "ag": lambda: hvd.allgather_async(t, name="dup.ag"),
        "bc": lambda: hvd.broadcast_async(t, 0, name="dup.bc"),
        "rs": lambda: hvd.reducescatter_async(t, name="dup.rs", op=hvd.Sum),
    }
    if r() == 0:
        first = {k: f() for k, f in submit.items()}
        for k, f in submit.items():
            with pytest.raises(ValueError, match="already in flight"):
                f()
    hvd.allreduce(torch.ones(1), name="dup.gate")
    if r() != 0:
        first = {k: f() for k, f in submit.items()}
    total = sum(k + 1 for k in range(n()))
    assert torch.equal(hvd.synchronize(first["ar"]), torch.full((n(), 2), float(total)))
    assert hvd.synchronize(first["ag"]).shape == (n() * n(), 2)
    assert torch.equal(hvd.synchronize(first["bc"]), torch.full((n(), 2), 1.0))
    assert torch.equal(hvd.synchronize(first["rs"]), torch.full((1, 2), float(total)))


# ---- bad arguments raise locally ----

def test_bad_arguments_raise_before_enqueueing():
    if n() > 1:
        with pytest.raises(ValueError, match="not divisible"):
            hvd.alltoall(torch.ones(n() + 1, 2), name="args.a2a")
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(torch.ones(3), splits=[3] + [0] * n(), name="args.a2a.splits")
    with pytest.raises(ValueError, match="supersedes"):
        hvd.allreduce(torch.ones(1), average=True, op=hvd.Sum, name="args.average")
    with pytest.raises(ValueError, match="at least one dimension"):
        hvd.reducescatter(torch.tensor(1.0), name="args.rs.scalar")
    with pytest.raises(ValueError):
        hvd.grouped_allreduce([], name="args.grouped.empty")
    with pytest.raises(ValueError, match="dtype"):
        hvd.broadcast(torch.ones(2, dtype=torch.complex64), 0, name="args.bc.complex")
    with pytest.raises(ValueError, match="not registered"):
        hvd.allgather(torch.ones(1), name="args.ps", process_set=hvd.ProcessSet([0]))
    assert hvd._torch_core.adasum_available()  # in every build: no silent pass without it
    if n() & (n() - 1):
        with pytest.raises(NotImplementedError, match="power-of-two"):
            hvd.allreduce(torch.ones(2), op=hvd.Adasum, name="args.adasum")
    # Nothing was sent: the names are free, and every rank still agrees.
    assert torch.equal(hvd.alltoall(torch.full((n(),), float(r())), name="args.a2a"),
                       torch.arange(n(), dtype=torch.float32))


# ---- one rank's bad input fails that operation everywhere; the job goes on ----

def test_bad_call_on_one_rank_fails_everywhere_then_training_works():
    bad = n() - 1
    calls = [
        lambda: hvd.allreduce(torch.ones(4 if r() == bad else 3), name="bad.shape"),
        lambda: hvd.broadcast(torch.ones(2), root_rank=0 if r() != bad else n() - 1,
                              name="bad.root"),
        lambda: hvd.allgather(torch.ones(2, 2 if r() != bad else 3), name="bad.trailing"),
        lambda: hvd.reducescatter(torch.ones(n(), dtype=torch.float64 if r() == bad
                                             else torch.float32), name="bad.dtype"),
    ]
    if n() > 1:
        for i, call in enumerate(calls):
            with pytest.raises(hvd.HorovodInternalError) as failure:
                call()
            messages = hvd.allgather_object(str(failure.value), name="bad.messages.%d" % i)
            assert messages == [messages[0]] * n()  # the same message on every rank
            assert "Mismatched" in messages[0] and "rank {}".format(bad) in messages[0]

    # Training goes on: a few steps of a small model, and every rank ends with the same weights.
    torch.manual_seed(r())
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    data = torch.randn(8, 4)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(data), data.sum(1, keepdim=True)).backward()
        opt.step()
    weights = [p.detach().tolist() for p in model.parameters()]
    assert hvd.allgather_object(weights, name="bad.after.weights") == [weights] * n()
