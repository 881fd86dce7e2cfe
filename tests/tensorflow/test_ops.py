"""krug.tensorflow's collectives as TensorFlow ops, eagerly and inside tf.function, with their
gradients, run inside every rank of `krugrun -np N python -m pytest`.

Rank r contributes 2r+1, so over n ranks Sum = n^2, Average = n, Min = 1, Max = 2n-1,
Product = 1*3*5*..., exact in every dtype for n <= 3.
"""

import importlib.util
import os
import pickle
import tempfile
import threading

import numpy as np
import pytest
import tensorflow as tf

import krug.tensorflow as hvd
from krug import info
from krug_testing import expected_reduction, reduce_ops
from krug.common.timeline import read_timeline

NUMERIC = [tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.uint16, tf.uint32, tf.uint64,
           tf.float16, tf.bfloat16, tf.float32, tf.float64]
OPS = reduce_ops(hvd)


def n():
    return hvd.size()


def r():
    return hvd.rank()


def expected(op):
    return expected_reduction(op, n())


def mine(dtype, shape=(2, 3)):
    return tf.cast(tf.fill(shape, 2 * r() + 1), dtype)


def as_np(t):
    return tf.cast(t, tf.float64).numpy()


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: d.name)
def test_allreduce_every_op_eager_and_in_a_function(dtype):
    for name, op in OPS.items():
        out = hvd.allreduce(mine(dtype), op=op)
        assert out.dtype == dtype and out.shape == (2, 3)
        np.testing.assert_array_equal(as_np(out), expected(name), err_msg=name)

    @tf.function
    def every_op(x):
        return [hvd.allreduce(x, op=op) for op in OPS.values()]

    for name, out in zip(OPS, every_op(mine(dtype))):
        np.testing.assert_array_equal(as_np(out), expected(name), err_msg=name)


def test_allreduce_under_the_asynchronous_eager_executor():
    # Eager kernels then run on TensorFlow's executor thread, which an eager krug kernel blocks
    # while it waits for the other ranks (the Python thread goes on and waits at .numpy()).
    tf.config.experimental.set_synchronous_execution(False)
    try:
        outs = [hvd.allreduce(mine(tf.float32), op=hvd.Sum, name="async_eager.%d" % i)
                for i in range(3)]
        results = [as_np(out) for out in outs]
    finally:
        tf.config.experimental.set_synchronous_execution(True)
    for res in results:
        np.testing.assert_array_equal(res, np.full((2, 3), expected("sum")))


def test_allreduce_bool_min_and_max():
    x = tf.constant([True, r() == 0, False])
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Max).numpy(), [True, True, False])
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Min).numpy(),
                                  [True, n() == 1, False])


def test_allreduce_scale_factors_and_deprecated_average():
    x = tf.fill([4], float(2 * r() + 1))
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    np.testing.assert_allclose(out.numpy(), 1.5 * n() * n())
    with pytest.warns(DeprecationWarning):
        out = hvd.allreduce(x, average=False)
    np.testing.assert_allclose(out.numpy(), n() * n())
    with pytest.raises(ValueError):
        hvd.allreduce(x, average=True, op=hvd.Sum)


def disjoint_inputs(dtype, rows, cols=33):
    """Random values of many magnitudes (no subnormals) and this rank's input: those at flat
    positions i with i % size == rank, zeros elsewhere. Each element of a sum is then one rank's
    scaled value plus exact zeros, so the scaling alone decides the result."""
    rng = np.random.default_rng(2024)
    base = rng.uniform(0.1, 2.0, (rows, cols)) * 10.0 ** rng.integers(-3, 4, (rows, cols))
    base = base * rng.choice([-1.0, 1.0], (rows, cols))
    owner = np.arange(rows * cols).reshape(rows, cols) % n()
    return tf.constant(base, dtype), tf.constant(np.where(owner == r(), base, 0.0), dtype)


# (op, pre, post): factors that float32 does not hold, so that for some elements Horovod's
# float32 product differs from the product rounded once from double. A plain Average scales by
# 1/size: such a factor at 3 ranks.
FLOAT_SCALES = [("sum", 1 / 3, 1.0), ("sum", 0.1, 1.0), ("sum", 1.0, 1 / 7), ("sum", 1.0, 3.3),
                ("sum", 0.1, 1 / 3), ("average", 1.0, 1.0), ("average", 1.0, 0.1),
                ("average", 1 / 7, 3.3)]


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64], ids=lambda d: d.name)
@pytest.mark.parametrize("case", range(len(FLOAT_SCALES)))
def test_float_scaling_is_bitwise_horovods(dtype, case):
    # Horovod's TensorFlow ops hold the factors as float32 attributes; its core turns an
    # Average into a postscale of postscale_factor / size (in float64) and multiplies a float32
    # tensor by the factor rounded to float32, a float64 tensor by the factor in float64.
    op, pre, post = FLOAT_SCALES[case]
    pre32, post32 = float(np.float32(pre)), float(np.float32(post))
    post_applied = post32 / n() if op == "average" else post32
    rows = 16 * n()
    base, x = disjoint_inputs(dtype, rows)

    def scaled(t, factor):
        return t * tf.constant(factor, dtype)  # tf arithmetic in the tensor's dtype

    want = scaled(scaled(base, pre32), post_applied).numpy()
    if dtype == tf.float32 and float(np.float32(post_applied)) != post_applied:
        # The factors that reach the core are float32 values, whose products with a float32
        # are exact in float64: only an Average's post32 / size tells the routes apart. The
        # data must then do so, or the comparisons below prove nothing.
        through_double = (base.numpy().astype(np.float64) * pre32).astype(np.float32)
        through_double = (through_double.astype(np.float64) * post_applied).astype(np.float32)
        assert not np.array_equal(want, through_double)
    hop = hvd.Sum if op == "sum" else hvd.Average
    scales = {"prescale_factor": pre, "postscale_factor": post}

    def same(got, expected):
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.numpy().view(np.uint8), expected.view(np.uint8))

    same(hvd.allreduce(x, op=hop, **scales), want)
    same(tf.function(lambda t: hvd.allreduce(t, op=hop, **scales))(x), want)
    got = hvd.grouped_allreduce([x, x[:3]], op=hop, **scales)
    same(got[0], want)
    same(got[1], want[:3])
    mine = want[16 * r():16 * r() + 16]
    same(hvd.reducescatter(x, op=hop, **scales), mine)
    for got in hvd.grouped_reducescatter([x, x], op=hop, **scales):
        same(got, mine)


def test_adasum_of_equal_tensors_is_the_tensor():
    if n() & (n() - 1):
        pytest.skip("Adasum needs a power-of-two number of ranks")
    x = tf.constant([1.0, -2.0, 3.0])
    np.testing.assert_allclose(hvd.allreduce(x, op=hvd.Adasum).numpy(), x.numpy(), rtol=1e-6)


def test_grouped_allreduce_mixed_dtypes_eager_and_function():
    tensors = [mine(tf.float32, (3,)), mine(tf.int64, (2, 2)), mine(tf.float16, (1,))]
    for out in (hvd.grouped_allreduce(tensors, op=hvd.Sum),
                tf.function(lambda ts: hvd.grouped_allreduce(ts, op=hvd.Sum))(tensors)):
        assert [o.dtype for o in out] == [t.dtype for t in tensors]
        for o in out:
            np.testing.assert_array_equal(as_np(o), expected("sum"))


def test_build_flags_are_horovods():
    # The core's build, as krug.torch reports it: nccl_built() is NCCL's NCCL_VERSION_CODE
    # (22809 for the NCCL 2.28.9 that krugrun --check-build names), 0 without NCCL.
    assert type(hvd.nccl_built()) is int and hvd.nccl_built() == info.nccl_version_code()
    assert type(hvd.cuda_built()) is bool and (hvd.cuda_built() or not hvd.nccl_built())
    assert [hvd.gloo_built(), hvd.ddl_built(), hvd.ccl_built(), hvd.rocm_built()] == [
        True, False, False, False]


def test_compression_classes_are_horovods_and_pickle():
    from krug.tensorflow.compression import Compressor, FP16Compressor, NoneCompressor

    assert hvd.Compression.fp16 is FP16Compressor and hvd.Compression.none is NoneCompressor
    assert issubclass(FP16Compressor, Compressor)
    assert pickle.loads(pickle.dumps(hvd.Compression.fp16)) is FP16Compressor
    ints = tf.constant([1, 2], tf.int32)
    assert hvd.Compression.fp16.compress(ints)[0] is ints


def test_fp16_compression_keeps_the_dtype():
    x = tf.fill([5], 0.5 * (r() + 1))
    out = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert out.dtype == tf.float32
    np.testing.assert_allclose(out.numpy(), 0.5 * n() * (n() + 1) / 2)


@pytest.mark.parametrize("dtype", NUMERIC + [tf.bool], ids=lambda d: d.name)
def test_allgather_uneven_first_dimension(dtype):
    x = tf.cast(tf.fill([r() + 1, 2], r()), dtype)
    for out in (hvd.allgather(x), tf.function(hvd.allgather)(x)):
        want = np.concatenate([np.full([k + 1, 2], k) for k in range(n())])
        assert out.dtype == dtype
        np.testing.assert_array_equal(as_np(out), want.astype(bool) if dtype == tf.bool else want)


def test_grouped_allgather():
    out = hvd.grouped_allgather([tf.fill([r() + 1], r()), tf.fill([1, 3], float(r()))])
    np.testing.assert_array_equal(out[0].numpy(), np.concatenate(
        [np.full([k + 1], k) for k in range(n())]))
    np.testing.assert_array_equal(out[1].numpy(), np.repeat(np.arange(n()), 3).reshape(n(), 3))


@pytest.mark.parametrize("dtype", NUMERIC + [tf.bool], ids=lambda d: d.name)
def test_broadcast_from_every_root(dtype):
    for root in range(n()):
        x = tf.cast(tf.fill([3], r() + 1), dtype)
        for out in (hvd.broadcast(x, root), tf.function(lambda t: hvd.broadcast(t, root))(x)):
            np.testing.assert_array_equal(as_np(out), as_np(tf.cast(tf.fill([3], root + 1),
                                                                    dtype)))


def test_alltoall_with_splits_and_received_splits():
    # Rank r sends k+1 rows of value 10r+k to rank k.
    rows = [tf.fill([k + 1, 2], 10 * r() + k) for k in range(n())]
    x = tf.concat(rows, 0)
    splits = [k + 1 for k in range(n())]
    for out, received in (hvd.alltoall(x, splits),
                          tf.function(lambda t: hvd.alltoall(t, splits))(x)):
        np.testing.assert_array_equal(received.numpy(), [r() + 1] * n())
        want = np.concatenate([np.full([r() + 1, 2], 10 * k + r()) for k in range(n())])
        np.testing.assert_array_equal(out.numpy(), want)


def test_alltoall_even_split():
    # Without splits Horovod returns the rows alone (a tuple only when splits are given).
    x = tf.reshape(tf.range(2 * n()) + 100 * r(), [2 * n(), 1])
    out = hvd.alltoall(x)
    assert isinstance(out, tf.Tensor)
    want = np.concatenate([[[100 * k + 2 * r()], [100 * k + 2 * r() + 1]] for k in range(n())])
    np.testing.assert_array_equal(out.numpy(), want)


def test_alltoall_bad_splits_raise_on_the_caller():
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        hvd.alltoall(tf.zeros([3, 1]), splits=[4] + [0] * (n() - 1))


def test_reducescatter_and_grouped():
    rows = 2 * n() + 1
    x = tf.reshape(tf.range(rows * 2, dtype=tf.float32), [rows, 2]) * (r() + 1)
    total = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) * n() * (n() + 1) / 2
    share = [rows // n() + (1 if k < rows % n() else 0) for k in range(n())]
    start = sum(share[:r()])
    out = hvd.reducescatter(x, op=hvd.Sum)
    np.testing.assert_allclose(out.numpy(), total[start:start + share[r()]])
    outs = hvd.grouped_reducescatter([x, x * 2], op=hvd.Average)
    np.testing.assert_allclose(outs[1].numpy(), 2 * total[start:start + share[r()]] / n())
    out = tf.function(lambda t: hvd.reducescatter(t, op=hvd.Sum))(x)
    np.testing.assert_allclose(out.numpy(), total[start:start + share[r()]])


def test_join_barrier_and_topology_ops():
    assert 0 <= int(hvd.join()) < n()
    hvd.barrier()

    @tf.function
    def topology():
        return hvd.size_op(), hvd.rank_op(), hvd.local_size_op(), hvd.local_rank_op()

    assert [int(v) for v in topology()] == [n(), r(), hvd.local_size(), hvd.local_rank()]
    assert hvd.is_homogeneous()
    # krugrun's jobs run on krug's own planes (shared memory on one host), never MPI here.
    assert hvd.gloo_enabled() and not hvd.mpi_enabled()


def test_names_ignore_name_scope():
    # Different scopes on different ranks: the same name once the scope is ignored.
    @tf.function
    def scoped(x):
        with tf.name_scope("scope%d" % r()):
            return hvd.allreduce(x, op=hvd.Sum, name="scoped_sum", ignore_name_scope=True)
    np.testing.assert_allclose(scoped(tf.ones([2])).numpy(), n())


def grad_of(fn, x):
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x).numpy()


def test_gradients_against_analytic_values():
    x = tf.fill([2, 2], float(r() + 1))
    # d/dx sum(allreduce_Sum(x)) = n; Average: 1; with scale factors 2*3*n.
    np.testing.assert_allclose(grad_of(lambda t: tf.reduce_sum(hvd.allreduce(t, op=hvd.Sum)),
                                       x), n())
    np.testing.assert_allclose(grad_of(lambda t: tf.reduce_sum(hvd.allreduce(t)), x), 1.0)
    np.testing.assert_allclose(grad_of(lambda t: tf.reduce_sum(hvd.allreduce(
        t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=3.0)), x), 6.0 * n())
    # allgather: the weight of each gathered row is its global index + 1; rank r's rows start
    # at r(r+1)/2 (rank k has k+1 rows).
    xg = tf.ones([r() + 1, 2])
    total_rows = n() * (n() + 1) // 2
    weights = tf.reshape(tf.range(1, total_rows + 1, dtype=tf.float32), [total_rows, 1])
    g = grad_of(lambda t: tf.reduce_sum(hvd.allgather(t) * weights), xg)
    start = r() * (r() + 1) // 2
    np.testing.assert_allclose(g, np.repeat(np.arange(start + 1, start + r() + 2)[:, None], 2, 1))
    # broadcast: 1 on the root, 0 elsewhere.
    g = grad_of(lambda t: tf.reduce_sum(hvd.broadcast(t, 0)), x)
    np.testing.assert_allclose(g, 1.0 if r() == 0 else 0.0)
    # alltoall: the gradient comes back to the rows that were sent.
    xa = tf.ones([n(), 3])
    g = grad_of(lambda t: tf.reduce_sum(hvd.alltoall(t) * 2.0), xa)
    np.testing.assert_allclose(g, 2.0)
    # reducescatter: Sum gives n, Average 1 (Horovod's rule).
    xr = tf.ones([2 * n(), 2])
    np.testing.assert_allclose(grad_of(lambda t: tf.reduce_sum(hvd.reducescatter(
        t, op=hvd.Sum)), xr), n())
    np.testing.assert_allclose(grad_of(lambda t: tf.reduce_sum(hvd.reducescatter(t)), xr), 1.0)


def test_indexed_slices_are_allgathered_unless_sparse_as_dense():
    params = tf.Variable(tf.zeros([5, 2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(params, [r() % 5]) * (r() + 1))
    tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
    grad = tape.gradient(loss, [params])[0]
    assert isinstance(grad, tf.IndexedSlices)
    np.testing.assert_array_equal(grad.indices.numpy(), [k % 5 for k in range(n())])
    dense = tf.convert_to_tensor(grad).numpy()
    want = np.zeros([5, 2])
    for k in range(n()):
        want[k % 5] += k + 1
    np.testing.assert_allclose(dense, want)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(params, [r() % 5]) * (r() + 1))
    tape = hvd.DistributedGradientTape(tape, op=hvd.Sum, sparse_as_dense=True)
    grad = tape.gradient(loss, [params])[0]
    assert not isinstance(grad, tf.IndexedSlices)
    np.testing.assert_allclose(grad.numpy(), want)


def test_distributed_gradient_tape_averages_and_partial_keeps_local():
    w = tf.Variable([1.0, 2.0])
    local = tf.Variable([3.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * (r() + 1)) + tf.reduce_sum(local * (r() + 1))
    tape = hvd.DistributedGradientTape(tape)
    tape.register_local_source(local)
    gw, gl = tape.gradient(loss, [w, local])
    np.testing.assert_allclose(gw.numpy(), (n() + 1) / 2.0)
    np.testing.assert_allclose(gl.numpy(), (r() + 1) / n())  # local, scaled by 1/size
    dense = tf.keras.layers.Dense(1)
    dense.build((None, 1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(dense(tf.fill([1, 1], float(r() + 1))))
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[dense],
                                              scale_local_gradients=False)
    gk, gb = tape.gradient(loss, dense.trainable_weights)
    np.testing.assert_allclose(gk.numpy(), [[r() + 1]])
    np.testing.assert_allclose(gb.numpy(), [1.0])


def test_process_sets():
    if n() == 1:
        pytest.skip("a set of one rank is the global set")
    members = [1] if n() == 2 else [0, n() - 1]  # a proper subset
    ps = hvd.add_process_set(members)
    try:
        if r() in members:
            out = hvd.allreduce(tf.fill([2], float(r() + 1)), op=hvd.Sum, process_set=ps)
            np.testing.assert_allclose(out.numpy(), sum(k + 1 for k in set(members)))
            root = members[-1]
            out = hvd.broadcast(tf.fill([1], r()), root, process_set=ps)
            assert int(out.numpy()[0]) == root
            assert int(hvd.size_op(ps.process_set_id)) == len(set(members))
        else:
            assert int(hvd.process_set_included_op(ps.process_set_id)) == 0
            with pytest.raises(tf.errors.InvalidArgumentError):
                hvd.allreduce(tf.ones([1]), process_set=ps)
        # The gradient tape over the set: members average, the others keep their own (Horovod).
        v = tf.Variable([1.0])
        with tf.GradientTape() as tape:
            loss = v * float(r() + 1)
        tape = hvd.DistributedGradientTape(tape, process_set=ps)
        (g,) = tape.gradient(loss, [v])
        want = np.mean([k + 1 for k in sorted(set(members))]) if r() in members else r() + 1
        np.testing.assert_allclose(g.numpy(), [want])
    finally:
        hvd.remove_process_set(ps)


def test_mismatched_shapes_fail_on_every_rank():
    if n() == 1:
        pytest.skip("needs two ranks to disagree")
    # Horovod's code: a precondition the ranks broke, which a retry cannot fix (elastic runs do
    # not take it for a lost peer).
    with pytest.raises(tf.errors.FailedPreconditionError, match="(?i)mismatch"):
        hvd.allreduce(tf.ones([r() + 1]), name="mismatch")
    # The next operations run normally.
    np.testing.assert_allclose(hvd.allreduce(tf.ones([2]), op=hvd.Sum).numpy(), n())


def _stall_job():
    """tests/python/stall_job.py: the job of a rank that leaves a collective early."""
    path = os.path.join(os.path.dirname(__file__), os.pardir, "python", "stall_job.py")
    spec = importlib.util.spec_from_file_location("stall_job", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_rank_that_leaves_a_collective_early_is_reported_and_the_next_tests_run(tmp_path):
    # Rank 1 fails an assertion between two collectives in a tf.function and goes on to the
    # next test: both ranks are told, the waits end in Horovod's UnknownError naming the
    # operation and the missing rank, and the tests after it run. A job of its own, started
    # from the 1-rank run.
    if n() != 1:
        pytest.skip("runs its own job from the 1-rank run")
    stall_job = _stall_job()
    returncode, out, ranks = stall_job.finish(stall_job.start("tensorflow", tmp_path, 1),
                                              timeout=240)
    stall_job.check_stall_reported_and_job_goes_on(returncode, out, ranks, 1, "UnknownError")


def test_broadcast_variables_and_objects():
    v = tf.Variable(tf.fill([3], float(r())))
    hvd.broadcast_variables([v], root_rank=n() - 1)
    np.testing.assert_allclose(v.numpy(), n() - 1)
    obj = hvd.broadcast_object({"rank": r(), "list": [1, 2]} if r() == 0 else None)
    assert obj == {"rank": 0, "list": [1, 2]}
    assert hvd.allgather_object(("r", r())) == [("r", k) for k in range(n())]


def test_an_object_that_cannot_be_sent_raises_on_every_rank():
    # A lock pickles with neither pickle nor cloudpickle: the others must not wait for it.
    lock = threading.Lock()
    with pytest.raises(ValueError, match=r"rank\(s\) 0 could not send the object"):
        hvd.broadcast_object(lock if r() == 0 else None, root_rank=0)
    last = n() - 1
    with pytest.raises(ValueError, match=r"rank\(s\) {} could not send".format(last)):
        hvd.allgather_object(lock if r() == last else r())
    # The job goes on, and where cloudpickle is installed a lambda travels (as in Horovod).
    travels = (lambda v: v + 1) if importlib.util.find_spec("cloudpickle") else (1).__add__
    add_one = hvd.broadcast_object(travels if r() == 0 else None, root_rank=0)
    assert add_one(1) == 2


def test_start_and_stop_timeline_eager_and_in_a_function():
    import krug.keras
    import krug.tensorflow.keras
    for module in (krug.keras, krug.tensorflow.keras):  # Horovod's keras modules have them too
        assert module.start_timeline is hvd.start_timeline
        assert module.stop_timeline is hvd.stop_timeline

    @tf.function
    def reduce_in_graph(x):
        return hvd.allreduce(x, name="tl.graph", op=hvd.Sum)

    with tempfile.TemporaryDirectory() as tmp:
        first, second = os.path.join(tmp, "first.json"), os.path.join(tmp, "second.json")
        hvd.start_timeline(first, mark_cycles=True)
        hvd.allreduce(tf.ones([3]), name="tl.eager", op=hvd.Sum)
        hvd.allgather(tf.ones([r() + 1]), name="tl.gather")
        reduce_in_graph(tf.ones([2]))
        hvd.stop_timeline()
        hvd.start_timeline(second)
        hvd.broadcast(tf.ones([2]), root_rank=0, name="tl.bcast")
        hvd.stop_timeline()
        if r() != 0:
            assert not os.path.exists(first) and not os.path.exists(second)  # rank 0 writes
        else:
            # Eager ops run one at a time under their op's name (as Horovod's); in a graph
            # the name is the node's.
            phases = read_timeline(first)
            assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= phases["KrugAllreduce"], phases
            assert {"NEGOTIATE_ALLGATHER", "ALLGATHER"} <= phases["KrugAllgather"], phases
            assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"} <= phases["tl.graph"], phases
            assert "KrugBroadcast" not in phases and "cycles" in phases
            phases = read_timeline(second)
            assert "BROADCAST" in phases["KrugBroadcast"], phases
            assert "KrugAllreduce" not in phases and "tl.graph" not in phases, phases
            assert "cycles" not in phases
    with pytest.raises(ValueError, match="empty"):
        hvd.start_timeline("")
