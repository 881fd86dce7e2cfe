"""krug.jax's training helpers inside every rank of `krugrun -np N python -m pytest`: parameter
trees, gradients, optax's optimizer and Python objects."""

import importlib.util
import pickle
import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import krug.jax as hvd


def test_broadcast_parameters_gives_every_rank_the_roots_tree():
    params = {"dense": {"w": jnp.full((3, 2), float(hvd.rank())), "b": jnp.zeros(2) + hvd.rank()},
              "steps": [jnp.int32(hvd.rank() + 7)]}
    out = hvd.broadcast_parameters(params, root_rank=hvd.size() - 1)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(params)
    for leaf in jax.tree_util.tree_leaves(out["dense"]):
        np.testing.assert_array_equal(np.asarray(leaf), hvd.size() - 1)
    assert int(out["steps"][0]) == hvd.size() + 6


def test_broadcast_parameters_keeps_each_leafs_kind_and_bits():
    # PRNG keys, unsigned integers krug has no type for, and numpy arrays that JAX would narrow
    # (64-bit values without jax_enable_x64) arrive as the root sent them.
    def values(k):
        return {"key": jax.random.key(k), "u32": jnp.array([2**31 + k, 7], jnp.uint32),
                "np64": np.array([2**40 + k, -3], np.int64), "npf64": np.array([0.1 + k]),
                "np32": np.full((2,), k, np.float32)}

    root = hvd.size() - 1
    out = hvd.broadcast_parameters(values(hvd.rank()), root_rank=root)
    want = values(root)
    np.testing.assert_array_equal(jax.random.key_data(out["key"]),
                                  jax.random.key_data(want["key"]))
    assert out["u32"].dtype == jnp.uint32
    np.testing.assert_array_equal(np.asarray(out["u32"]), np.asarray(want["u32"]))
    for name in ("np64", "npf64", "np32"):
        assert isinstance(out[name], np.ndarray) and out[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(out[name], want[name])


def test_allreduce_gradients_with_fp16_compression():
    # 1 + 2**-12 is not a float16: compressed, every rank sends 1.0.
    grads = {"a": jnp.full((4,), 1.0 + 2.0**-12), "n": jnp.full((2,), hvd.rank() + 1)}
    packed = hvd.allreduce_gradients(grads, compression=hvd.Compression.fp16)
    plain = hvd.allreduce_gradients(grads)
    assert packed["a"].dtype == jnp.float32 and packed["n"].dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(packed["a"]), 1.0)
    np.testing.assert_array_equal(np.asarray(plain["a"]), np.float32(1.0 + 2.0**-12))
    # Integers travel as they are (Average of 1..n, rounded as the engine does for ints).
    np.testing.assert_array_equal(np.asarray(packed["n"]), np.asarray(plain["n"]))


def test_compression_is_horovods_and_its_classes_pickle():
    from krug.jax.compression import Compressor, FP16Compressor

    assert issubclass(hvd.Compression.fp16, Compressor)
    assert pickle.loads(pickle.dumps(hvd.Compression.fp16)) is FP16Compressor
    x = jnp.ones((2,), jnp.bfloat16)
    sent, dtype = hvd.Compression.fp16.compress(x)
    assert sent.dtype == jnp.float16 and hvd.Compression.fp16.decompress(sent, dtype).dtype == x.dtype


def _loss(params, x, y):
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def test_distributed_optimizer_matches_one_process_on_the_whole_batch():
    # Each rank holds one shard of a batch; the averaged gradient of equal shards is the whole
    # batch's, so krug's training must follow one process's on the whole batch.
    rng = np.random.RandomState(0)
    n, shard = hvd.size(), 8
    x_all = rng.randn(n * shard, 3).astype(np.float32)
    y_all = x_all @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.3
    mine = slice(hvd.rank() * shard, (hvd.rank() + 1) * shard)
    params = hvd.broadcast_parameters({"w": jnp.asarray(rng.randn(3, 1), jnp.float32) *
                                       (hvd.rank() + 1), "b": jnp.zeros(1)})
    reference = jax.tree_util.tree_map(lambda a: a, params)
    tx, one = hvd.DistributedOptimizer(optax.sgd(0.05)), optax.sgd(0.05)
    state, ref_state = tx.init(params), one.init(reference)

    @jax.jit
    def step(params, state, x, y):
        grads = jax.grad(_loss)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for _ in range(20):
        params, state = step(params, state, x_all[mine], y_all[mine])
        grads = jax.grad(_loss)(reference, x_all, y_all)
        updates, ref_state = one.update(grads, ref_state, reference)
        reference = optax.apply_updates(reference, updates)
    for got, want in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(reference)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    assert float(_loss(params, x_all, y_all)) < float(_loss(
        hvd.broadcast_parameters({"w": jnp.asarray(np.random.RandomState(0).randn(3, 1),
                                                   jnp.float32), "b": jnp.zeros(1)}),
        x_all, y_all))


def test_python_objects():
    got = hvd.broadcast_object({"epoch": 3, "rank": hvd.rank()}, root_rank=0)
    assert got == {"epoch": 3, "rank": 0}
    assert hvd.allgather_object(("r", hvd.rank())) == [("r", k) for k in range(hvd.size())]


def test_an_object_that_cannot_be_sent_raises_on_every_rank():
    # A lock pickles with neither pickle nor cloudpickle: the others must not wait for it.
    lock = threading.Lock()
    with pytest.raises(ValueError, match=r"rank\(s\) 0 could not send the object"):
        hvd.broadcast_object(lock if hvd.rank() == 0 else None, root_rank=0)
    last = hvd.size() - 1
    with pytest.raises(ValueError, match=r"rank\(s\) {} could not send".format(last)):
        hvd.allgather_object(lock if hvd.rank() == last else hvd.rank())
    # The job goes on, and where cloudpickle is installed a lambda travels (as in Horovod).
    travels = (lambda v: v + 1) if importlib.util.find_spec("cloudpickle") else (1).__add__
    add_one = hvd.broadcast_object(travels if hvd.rank() == 0 else None, root_rank=0)
    assert add_one(1) == 2


def test_a_joined_rank_contributes_zeros_and_join_names_the_last():
    # Rank 0 runs out of data first; the others still reduce, with rank 0 counting as zeros.
    if hvd.rank() == 0:
        last = hvd.join()
    else:
        out = hvd.allreduce(jnp.ones(3), op=hvd.Sum, name="test.after_join")
        np.testing.assert_array_equal(np.asarray(out), hvd.size() - 1)
        last = hvd.join()
    everyone = hvd.allgather_object(last)
    assert len(set(everyone)) == 1
    if hvd.size() == 1:
        assert last == 0
    else:
        assert 1 <= last < hvd.size()  # rank 0 joined first, so it cannot be the last
