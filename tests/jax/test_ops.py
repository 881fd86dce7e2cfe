"""krug.jax's collectives on JAX arrays, eagerly and inside jax.jit, with their gradients, run
inside every rank of `krugrun -np N python -m pytest`.

Rank r contributes 2r+1, so over n ranks Sum = n^2, Average = n, Min = 1, Max = 2n-1,
Product = 1*3*5*..., exact in every dtype for n <= 3.
"""

import os
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import krug.jax as hvd
from krug import info
from krug_testing import expected_reduction, reduce_ops
from krug.common.timeline import timeline_events

NUMERIC = [jnp.uint8, jnp.int8, jnp.int16, jnp.int32, jnp.uint16, jnp.uint32, jnp.float16,
           jnp.bfloat16, jnp.float32]
OPS = reduce_ops(hvd)


def n():
    return hvd.size()


def r():
    return hvd.rank()


def expected(op):
    return expected_reduction(op, n())


def mine(dtype, shape=(2, 3)):
    return jnp.full(shape, 2 * r() + 1, dtype)


def as_np(x):
    return np.asarray(x, dtype=np.float64)


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: jnp.dtype(d).name)
def test_allreduce_every_op_eager_and_jitted(dtype):
    for name, op in OPS.items():
        out = hvd.allreduce(mine(dtype), op=op)
        assert out.dtype == dtype and out.shape == (2, 3)
        np.testing.assert_array_equal(as_np(out), expected(name), err_msg=name)

    @jax.jit
    def every_op(x):
        return [hvd.allreduce(x, op=op) for op in OPS.values()]

    for name, out in zip(OPS, every_op(mine(dtype))):
        np.testing.assert_array_equal(as_np(out), expected(name), err_msg=name)


def test_bool_and_64_bit_dtypes():
    flags = jnp.asarray([r() == 0, True, False])
    np.testing.assert_array_equal(np.asarray(hvd.allreduce(flags, op=hvd.Max)),
                                  [True, True, False])
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda f: hvd.allreduce(f, op=hvd.Min))(
        flags)), [n() == 1, True, False])
    with jax.enable_x64(True):
        for dtype in (jnp.int64, jnp.uint64, jnp.float64):
            big = jnp.full((2,), 2**40 + r(), dtype)
            for out in (hvd.allreduce(big, op=hvd.Sum),
                        jax.jit(lambda x: hvd.allreduce(x, op=hvd.Sum))(big)):
                assert out.dtype == dtype
                np.testing.assert_array_equal(np.asarray(out),
                                              n() * 2**40 + n() * (n() - 1) // 2)


def test_allreduce_scales_and_the_deprecated_average_argument():
    out = hvd.allreduce(mine(jnp.float32), op=hvd.Sum, prescale_factor=0.5,
                        postscale_factor=4.0)
    np.testing.assert_allclose(as_np(out), 2.0 * expected("sum"))
    with pytest.warns(DeprecationWarning):
        out = hvd.allreduce(mine(jnp.float32), average=False)
    np.testing.assert_array_equal(as_np(out), expected("sum"))


def test_nccl_built_and_the_other_build_flags_are_horovods():
    # NCCL's NCCL_VERSION_CODE as krugrun --check-build names the version (22809 for 2.28.9).
    assert type(hvd.nccl_built()) is int and hvd.nccl_built() == info.nccl_version_code()
    flags = [hvd.cuda_built(), hvd.mpi_built(), hvd.ddl_built(), hvd.ccl_built()]
    assert all(type(f) is bool for f in flags) and hvd.gloo_built() and not hvd.rocm_built()


def test_grouped_allreduce_keeps_each_tensor_apart():
    tensors = [mine(jnp.float32, (4,)), mine(jnp.int32, (2, 2)), mine(jnp.float16, (1,))]
    for out in (hvd.grouped_allreduce(tensors, op=hvd.Sum),
                jax.jit(lambda ts: hvd.grouped_allreduce(ts, op=hvd.Sum))(tensors)):
        assert [o.shape for o in out] == [(4,), (2, 2), (1,)]
        assert [o.dtype for o in out] == [jnp.float32, jnp.int32, jnp.float16]
        for o in out:
            np.testing.assert_array_equal(as_np(o), expected("sum"))
    assert hvd.grouped_allreduce([]) == []


def test_one_jitted_step_reuses_its_names_every_call():
    step = jax.jit(lambda x: hvd.allreduce(x, op=hvd.Sum) + hvd.allreduce(2 * x, op=hvd.Max))
    for i in range(5):
        out = step(mine(jnp.float32) + i)
        want = expected("sum") + n() * i + 2 * (expected("max") + i)
        np.testing.assert_array_equal(as_np(out), want)


def first_negotiations(path):
    """{tensor name: when its first negotiation began} from a timeline file."""
    first = {}
    for row, e in timeline_events(path):
        if e["ph"] == "B" and e["name"].startswith("NEGOTIATE"):
            first[row] = min(first.get(row, e["ts"]), e["ts"])
    return first


def unordered_collectives(fn, *args):
    """Pairs of krug's custom calls in ``jax.jit(fn)``'s compiled program of which neither
    depends on the other (operands or control dependencies, through any instruction)."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    uses, calls = {}, []
    for line in text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (.*)$", line)
        if m:
            uses[m.group(1)] = set(re.findall(r"%([\w.\-]+)", m.group(2)))
            if "krug_collective" in m.group(2):
                calls.append(m.group(1))

    def depends(a, b):
        stack, seen = [a], set()
        while stack:
            x = stack.pop()
            if x == b:
                return True
            if x not in seen:
                seen.add(x)
                stack.extend(uses.get(x, ()))
        return False

    assert calls, text
    return [(a, b) for i, a in enumerate(calls) for b in calls[i + 1:]
            if not depends(a, b) and not depends(b, a)]


def test_a_jitted_programs_collectives_run_in_the_order_of_its_calls():
    # XLA's CPU runtime runs independent operations as their data allows, not in program order
    # (12 independent host callbacks ran as 0-5, 11-6 here); krug.jax chains a program's
    # collectives so that every rank runs them in the order the program called them.
    count = 12
    xs = [mine(jnp.float32, (4096 + 64 * i,)) for i in range(count)]

    @jax.jit
    def step(xs):
        return [hvd.allreduce(x * 2, op=hvd.Sum, name="order.%d" % i) for i, x in enumerate(xs)]

    jax.block_until_ready(step(xs))  # compiled before the timeline starts
    with tempfile.TemporaryDirectory() as tmp:  # not pytest's tmp_path, which ranks share
        path = os.path.join(tmp, "order.json")
        hvd.start_timeline(path)
        out = jax.block_until_ready(step(xs))
        hvd.stop_timeline()
        first = first_negotiations(path) if r() == 0 else {}  # only rank 0 writes one
    for o in out:
        np.testing.assert_array_equal(as_np(o), 2 * expected("sum"))
    # The order is a data dependency that survives XLA's compilation, also for the backward
    # pass's collectives and across custom_vjp bodies.
    assert unordered_collectives(step, xs) == []
    grad = jax.grad(lambda xs: sum((hvd.allgather(x) * 2).sum() + hvd.broadcast(x, 0).sum()
                                   + hvd.allreduce(x).sum() for x in xs))
    assert unordered_collectives(grad, xs[:3]) == []
    if r() == 0:
        began = [first["order.%d" % i] for i in range(count)]
        assert began == sorted(began), [f"order.{i}" for i in np.argsort(began)]


def test_allgather_eager_takes_a_first_dimension_per_rank():
    out = hvd.allgather(jnp.full((r() + 1, 2), r(), jnp.int32))
    want = np.concatenate([np.full((k + 1, 2), k) for k in range(n())])
    np.testing.assert_array_equal(np.asarray(out), want)


def test_a_named_eager_allgather_may_come_from_different_lines():
    # Ranks match the row-count exchange by the operation's name too, not by the calling line.
    x = jnp.ones((r() + 1, 2))
    if r() == 0:
        out = hvd.allgather(x, name="test.branches")
    else:
        out = hvd.allgather(x, name="test.branches")
    assert out.shape == (n() * (n() + 1) // 2, 2)


def test_allgather_jitted_with_the_same_shape_everywhere():
    out = jax.jit(hvd.allgather)(mine(jnp.float32, (2, 3)))
    want = np.concatenate([np.full((2, 3), 2 * k + 1) for k in range(n())])
    np.testing.assert_array_equal(as_np(out), want)


def test_broadcast_from_every_root_eager_and_jitted():
    for root in range(n()):
        out = hvd.broadcast(mine(jnp.float32), root)
        np.testing.assert_array_equal(as_np(out), 2 * root + 1)
        out = jax.jit(lambda x, root=root: hvd.broadcast(x, root))(mine(jnp.int32))
        np.testing.assert_array_equal(as_np(out), 2 * root + 1)


def test_alltoall_with_splits_eagerly():
    # Rank r sends k+1 rows to rank k, each row holding 100r + k.
    splits = [k + 1 for k in range(n())]
    rows = np.concatenate([np.full((k + 1, 2), 100 * r() + k) for k in range(n())])
    out, received = hvd.alltoall(jnp.asarray(rows, jnp.int32), splits=splits)
    want = np.concatenate([np.full((r() + 1, 2), 100 * k + r()) for k in range(n())])
    np.testing.assert_array_equal(np.asarray(out), want)
    np.testing.assert_array_equal(np.asarray(received), [r() + 1] * n())


def test_alltoall_even_split_jitted():
    rows = jnp.asarray(np.repeat(np.arange(n()) + 10 * r(), 2).reshape(-1, 1), jnp.float32)
    out, received = jax.jit(hvd.alltoall)(rows)
    want = np.repeat([10 * k + r() for k in range(n())], 2).reshape(-1, 1)
    np.testing.assert_array_equal(as_np(out), want)
    np.testing.assert_array_equal(np.asarray(received), [2] * n())


def test_bad_alltoall_splits_raise_the_same_error_on_every_rank():
    rows = jnp.ones((2 * n(), 1))
    # One rank's splits do not add up: every rank raises, naming it, and nothing is stuck.
    bad = [1] * n() if r() == n() - 1 else [2] * n()
    with pytest.raises(ValueError, match="rank {}'s splits".format(n() - 1)):
        hvd.alltoall(rows, splits=bad)
    with pytest.raises(ValueError, match="wrong number of entries"):
        hvd.alltoall(rows, splits=[2] * (n() + 1))
    if n() > 1:
        uneven = jnp.ones((n() + (1 if r() == 0 else 0), 1))
        with pytest.raises(ValueError, match="rank 0 has {} rows".format(n() + 1)):
            hvd.alltoall(uneven)
    # A negative split is refused as such, not taken for "no splits".
    negative = [-1] + [2 * n() + 1] + [0] * (n() - 2) if n() > 1 else [-1]
    with pytest.raises(ValueError, match="rank 0's splits"):
        hvd.alltoall(rows, splits=negative if r() == 0 else [2] * n())
    out, _ = hvd.alltoall(rows)
    assert out.shape == (2 * n(), 1)


def test_alltoall_with_splits_under_jit_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="outside jax.jit"):
        jax.jit(lambda x: hvd.alltoall(x, splits=[1] * n()))(jnp.ones((n(), 1)))
    # Also when the jitted function only closes over a concrete array.
    closed = jnp.ones((n(), 1))
    with pytest.raises(ValueError, match="outside jax.jit"):
        jax.jit(lambda: hvd.alltoall(closed, splits=[1] * n()))()


def test_alltoall_gradient_goes_back_the_way_the_rows_came():
    # Each rank weighs what it receives by its rank + 1, so the rows a rank sent to rank k get
    # the gradient k + 1: eagerly with uneven splits, and jitted with an even split.
    splits = [k + 1 for k in range(n())]
    x = jnp.ones((sum(splits), 2))
    g = jax.grad(lambda a: (hvd.alltoall(a, splits=splits)[0] * (r() + 1)).sum())(x)
    want = np.concatenate([np.full((s, 2), k + 1.0) for k, s in enumerate(splits)])
    np.testing.assert_array_equal(as_np(g), want)
    even = jnp.ones((2 * n(), 2))
    g = jax.jit(jax.grad(lambda a: (hvd.alltoall(a)[0] * (r() + 1)).sum()))(even)
    want = np.concatenate([np.full((2, 2), k + 1.0) for k in range(n())])
    np.testing.assert_array_equal(as_np(g), want)


def test_reducescatter_gives_each_rank_its_rows():
    rows = 2 * n() + 1  # uneven: the first ranks get one more
    x = jnp.tile(jnp.arange(rows, dtype=jnp.float32)[:, None], (1, 2)) * (r() + 1)
    total = sum(k + 1 for k in range(n()))
    start = sum(rows // n() + (1 if k < rows % n() else 0) for k in range(r()))
    mine_rows = rows // n() + (1 if r() < rows % n() else 0)
    for out in (hvd.reducescatter(x, op=hvd.Sum),
                jax.jit(lambda x: hvd.reducescatter(x, op=hvd.Sum))(x)):
        assert out.shape == (mine_rows, 2)
        np.testing.assert_array_equal(
            as_np(out)[:, 0], np.arange(start, start + mine_rows) * total)


def test_gradients_follow_horovods_rules():
    x = mine(jnp.float32, (3,))
    # allreduce (Average): the cotangent averaged again.
    np.testing.assert_allclose(as_np(jax.grad(lambda a: hvd.allreduce(a).sum())(x)), 1.0)
    np.testing.assert_allclose(
        as_np(jax.jit(jax.grad(lambda a: (hvd.allreduce(a, op=hvd.Sum) * 2).sum()))(x)),
        2.0 * n())
    # allgather: the gradient averaged over the ranks, this rank's rows.
    g = jax.grad(lambda a: (hvd.allgather(a) * (hvd.rank() + 1)).sum())(jnp.ones((r() + 1, 2)))
    assert g.shape == (r() + 1, 2)
    np.testing.assert_allclose(as_np(g), sum(k + 1 for k in range(n())) / n())
    # broadcast: averaged, kept on the root.
    g = jax.grad(lambda a: hvd.broadcast(a, 0).sum())(x)
    np.testing.assert_allclose(as_np(g), 1.0 if r() == 0 else 0.0)
    # reducescatter (Sum): the allgather of the gradient times the set's size.
    g = jax.grad(lambda a: hvd.reducescatter(a, op=hvd.Sum).sum())(jnp.ones((n(), 2)))
    np.testing.assert_allclose(as_np(g), float(n()))


def test_a_grouped_allreduce_of_floats_and_integers_is_differentiable():
    # The integer output has no gradient (JAX passes float0): only the floats are reduced.
    def loss(a):
        total, count = hvd.grouped_allreduce([a.sum(), jnp.int32(3)], op=hvd.Sum)
        return total / count, count

    for f in (jax.grad(loss, has_aux=True), jax.jit(jax.grad(loss, has_aux=True))):
        g, count = f(mine(jnp.float32, (3,)))
        assert int(count) == 3 * n()
        np.testing.assert_allclose(as_np(g), 1.0 / 3)


def test_jitted_gradients_match_the_eager_ones():
    rows = 2 * n() + 1  # reducescatter's shares are uneven
    cases = {
        "allgather": (lambda a: (hvd.allgather(a) * (hvd.rank() + 1)).sum(), jnp.ones((2, 3))),
        "broadcast": (lambda a: (hvd.broadcast(a, n() - 1) * 3).sum(), mine(jnp.float32)),
        "reducescatter": (lambda a: (hvd.reducescatter(a, op=hvd.Sum) ** 2).sum(),
                          jnp.arange(rows * 2, dtype=jnp.float32).reshape(rows, 2)),
    }
    for name, (loss, x) in cases.items():
        eager = jax.grad(loss)(x)
        jitted = jax.jit(jax.grad(loss))(x)
        assert jitted.shape == x.shape, name
        np.testing.assert_allclose(as_np(jitted), as_np(eager), err_msg=name)


def test_a_function_traced_again_on_one_rank_keeps_its_names():
    # Names come from the calling line, not from a count of traces: rank 0 tracing the step
    # once more (another shape, jax.eval_shape) must not shift its names against the others.
    step = jax.jit(lambda x: hvd.allreduce(x, op=hvd.Sum))
    if r() == 0:
        jax.eval_shape(step, jnp.ones(5))
        step.lower(jnp.ones(7))
    np.testing.assert_array_equal(as_np(step(mine(jnp.float32))), expected("sum"))


def test_a_host_callback_after_a_collective_may_call_krug():
    # The program goes on on XLA's thread after a collective, so a callback that averages a
    # metric over the ranks can use krug itself.
    def metric(v):
        return np.asarray(hvd.allreduce(v, op=hvd.Sum, name="test.metric"), np.float32)

    @jax.jit
    def step(x):
        y = hvd.allreduce(x, op=hvd.Sum)
        return y, io_callback(metric, jax.ShapeDtypeStruct((), jnp.float32), y.sum())

    y, m = step(mine(jnp.float32))
    np.testing.assert_array_equal(as_np(y), expected("sum"))
    assert float(m) == 6 * expected("sum") * n()


def test_a_mismatch_across_ranks_raises_on_every_rank_and_the_job_goes_on():
    if n() < 2:
        pytest.skip("needs two ranks to disagree")
    with pytest.raises(hvd.HorovodInternalError, match="Mismatched shapes"):
        hvd.allreduce(jnp.ones((3 + r(),)), name="krug.jax.test.mismatch")
    np.testing.assert_array_equal(as_np(hvd.allreduce(mine(jnp.float32), op=hvd.Sum)),
                                  expected("sum"))


def test_arguments_that_can_never_work_are_refused_here():
    with pytest.raises(ValueError, match="complex64 is not supported"):
        hvd.allreduce(jnp.ones(2, jnp.complex64))
    with pytest.raises(ValueError, match="unknown reduction op"):
        hvd.allreduce(jnp.ones(2), op=99)
    with pytest.raises(ValueError, match="at least one dimension"):
        hvd.allgather(jnp.float32(1.0))


def test_elastic_run_raises_a_refused_argument_rather_than_recovering():
    # Inside jit krug's refusal reaches elastic.run as XLA's error; recovering would only fail
    # again after every reset, so it is raised as ValueError, as it is eagerly.
    calls = []

    @hvd.elastic.run
    def train(state):
        calls.append(1)
        return jax.jit(lambda x: hvd.allreduce(x))(jnp.ones(2, jnp.complex64))

    with pytest.raises(ValueError, match="not supported"):
        train(hvd.elastic.ObjectState(epoch=0))
    assert len(calls) == 1


def test_process_sets():
    if n() < 2:
        pytest.skip("needs two ranks")
    evens = hvd.add_process_set(hvd.ProcessSet(list(range(0, n(), 2))))
    try:
        if r() % 2 == 0:
            out = hvd.allreduce(mine(jnp.float32), op=hvd.Sum, process_set=evens)
            np.testing.assert_array_equal(as_np(out), sum(2 * k + 1 for k in range(0, n(), 2)))
            out = jax.jit(lambda x: hvd.allgather(x, process_set=evens))(mine(jnp.float32))
            assert out.shape == (2 * len(evens.ranks), 3)
        else:
            with pytest.raises(ValueError, match="not a member"):
                hvd.reducescatter(mine(jnp.float32), process_set=evens)
            with pytest.raises(ValueError):
                hvd.allreduce(mine(jnp.float32), process_set=evens)
    finally:
        hvd.remove_process_set(evens)


def test_barrier_and_topology():
    hvd.barrier()
    assert hvd.is_initialized() and 0 <= r() < n()
    assert hvd.local_size() * hvd.cross_size() == n()
    assert hvd.gloo_enabled() and not hvd.mpi_enabled()
