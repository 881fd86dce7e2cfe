"""Horovod's TF1 graph API (global variables, objects through a session), its sparse allreduce
rules, and the helper modules ported code imports (horovod.tensorflow.util as
krug.tensorflow.util, horovod.common.util as krug.common.util), run inside every rank of
`krugrun -np N python -m pytest`."""

import sys
import threading
import types
import warnings

import numpy as np
import pytest
import tensorflow as tf

import krug.tensorflow as hvd
from krug.common import util as common_util
from krug.common.exceptions import HorovodVersionMismatchError
from krug.tensorflow import util as tf_util


def n():
    return hvd.size()


def r():
    return hvd.rank()


# ---- TF1 graphs: global variables ----

def test_broadcast_global_variables_assigns_the_roots_values_in_a_session():
    root = n() - 1
    with tf.Graph().as_default():
        resource = tf.compat.v1.Variable(tf.fill([3], float(r())), name="resource")
        ref = tf.compat.v1.Variable([[r(), r() + 10]], dtype=tf.int64, use_resource=False,
                                    name="ref")
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            op = hvd.broadcast_global_variables(root)
            assert isinstance(op, tf.Operation)
            sess.run(op)
            np.testing.assert_array_equal(sess.run(resource), [root] * 3)
            np.testing.assert_array_equal(sess.run(ref), [[root, root + 10]])


def test_broadcast_global_variables_without_variables_is_a_no_op():
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        sess.run(hvd.broadcast_global_variables(0))


def test_broadcast_global_variables_refuses_eager_mode():
    with pytest.raises(RuntimeError, match="does not support eager execution"):
        hvd.broadcast_global_variables(0)


def test_broadcast_global_variables_hook_in_a_monitored_session():
    hook = hvd.BroadcastGlobalVariablesHook(0)
    for start in (1.0, 5.0):  # a second graph: the hook builds its op again
        with tf.Graph().as_default():
            v = tf.compat.v1.Variable(tf.fill([2], start + r()))
            with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
                np.testing.assert_array_equal(sess.run(v), [start, start])


# ---- TF1 graphs: Python objects through a session ----

def test_objects_through_a_session():
    last = n() - 1
    graph = tf.Graph()
    with graph.as_default():
        sess = tf.compat.v1.Session(graph=graph)
        try:
            for k in range(2):  # twice in one graph: the second gets new op names
                got = hvd.broadcast_object({"k": k, "from": r()} if r() == 0 else None,
                                           root_rank=0, session=sess)
                assert got == {"k": k, "from": 0}
            with sess.as_default():
                assert hvd.allgather_object(("r", r())) == [("r", k) for k in range(n())]
            fn = hvd.broadcast_object_fn(root_rank=last, session=sess)
            ops = len(graph.get_operations())
            for k in range(3):
                assert fn([k, r()]) == [k, last]
            assert len(graph.get_operations()) == ops  # its ops are built once
        finally:
            sess.close()


def test_broadcast_object_fn_uses_the_default_session_when_called():
    with tf.Graph().as_default():
        fn = hvd.broadcast_object_fn(root_rank=0, name="fn.default")
        with tf.compat.v1.Session() as sess, sess.as_default():
            assert fn("hello" if r() == 0 else None) == "hello"


def test_an_unpicklable_object_raises_on_every_rank_in_a_session():
    lock = threading.Lock()
    with tf.Graph().as_default(), tf.compat.v1.Session():
        with pytest.raises(ValueError, match=r"rank\(s\) 0 could not send the object"):
            hvd.broadcast_object(lock if r() == 0 else None, root_rank=0)
        assert hvd.broadcast_object("next" if r() == 0 else None) == "next"


def test_objects_in_a_graph_need_a_session_and_refuse_tf_function():
    with tf.Graph().as_default():
        with pytest.raises(RuntimeError, match="pass session="):
            hvd.broadcast_object(1)
        with pytest.raises(RuntimeError, match="pass session="):
            hvd.allgather_object(1)

    @tf.function
    def traced():
        hvd.allgather_object(1)
    with pytest.raises(RuntimeError, match="inside a tf.function"):
        traced()


def test_objects_eagerly_still_work():
    assert hvd.broadcast_object_fn(root_rank=0)(r() if r() == 0 else None) == 0
    assert hvd.allgather_object(r()) == list(range(n()))


# ---- IndexedSlices: Horovod's rules ----

def slices():
    return tf.IndexedSlices(tf.fill([1, 2], float(r() + 1)), tf.constant([r()]),
                            dense_shape=tf.constant([n(), 2]))


@pytest.mark.parametrize("factors", [{"prescale_factor": 2.0}, {"postscale_factor": 0.5}],
                         ids=["prescale", "postscale"])
def test_indexed_slices_with_scale_factors_raise_like_horovod(factors):
    pattern = "Pre/postscale_factor are not supported with tf.IndexedSlices"
    with pytest.raises(NotImplementedError, match=pattern):
        hvd.allreduce(slices(), op=hvd.Sum, **factors)
    with pytest.raises(NotImplementedError, match=pattern):
        hvd.grouped_allreduce([tf.ones([1]), slices()], **factors)
    # The gradient tape passes gradient_predivide_factor as scale factors (Horovod raises too).
    params = tf.Variable(tf.zeros([n(), 2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(params, [r()]))
    tape = hvd.DistributedGradientTape(tape, gradient_predivide_factor=2.0)
    with pytest.raises(NotImplementedError, match=pattern):
        tape.gradient(loss, [params])


def test_indexed_slices_with_unit_factors_are_allgathered():
    out = hvd.allreduce(slices(), op=hvd.Sum, prescale_factor=1.0, postscale_factor=1.0)
    np.testing.assert_array_equal(out.indices.numpy(), list(range(n())))
    np.testing.assert_allclose(tf.convert_to_tensor(out).numpy(),
                               [[k + 1, k + 1] for k in range(n())])


# ---- krug.tensorflow.util (horovod.tensorflow.util) ----

def test_tensorflow_util_names_are_exported_as_horovod_does():
    for name in ("_executing_eagerly", "_make_subgraph", "_cache", "vars_to_refs",
                 "refs_to_vars"):
        assert getattr(hvd, name) is getattr(tf_util, name)
    assert tf_util._has_eager is True
    assert hvd.check_num_rank_power_of_2(4) and not hvd.check_num_rank_power_of_2(6)


def test_executing_eagerly_follows_the_mode():
    assert hvd._executing_eagerly()
    seen = []

    @tf.function
    def traced():
        seen.append(hvd._executing_eagerly())
        return tf.constant(0)
    traced()
    with tf.Graph().as_default():
        seen.append(hvd._executing_eagerly())
    assert seen == [False, False]


def test_make_subgraph_runs_its_function_as_a_graph():
    modes = []

    def f(x):
        modes.append(tf.executing_eagerly())
        return x * 2
    g = tf_util._make_subgraph(f)
    assert hasattr(g, "get_concrete_function")  # a tf.function
    assert float(g(tf.constant(3.0))) == 6.0
    assert modes == [False]


def test_tensorflow_cache_memoizes_per_arguments_and_mode():
    calls = []

    @tf_util._cache
    def make(a, b):
        calls.append((a, b, tf_util._executing_eagerly()))
        return object()
    first = make(1, "x")
    assert make(1, "x") is first and len(calls) == 1
    assert make(2, "x") is not first and len(calls) == 2
    with tf.Graph().as_default():
        in_graph = make(1, "x")
        assert in_graph is not first and make(1, "x") is in_graph
    assert calls[-1] == (1, "x", False) and len(calls) == 3
    with pytest.raises(TypeError):
        make(1, b="x")  # positional arguments only, as Horovod's


def test_vars_to_refs_round_trip():
    a, b, c = tf.Variable(1.0), tf.Variable(2.0), tf.Variable(3.0)
    refs = tf_util.vars_to_refs([a, [b, c]])
    assert isinstance(refs, tuple) and isinstance(refs[1], tuple)
    assert hash(refs) == hash(tf_util.vars_to_refs([a, [b, c]]))
    back = tf_util.refs_to_vars(refs)
    assert back[0] is a and back[1][0] is b and back[1][1] is c
    plain = object()  # no ref() (Keras 3's variables): stands for itself
    assert tf_util.refs_to_vars(tf_util.vars_to_refs([plain])) == [plain]


# ---- krug.common.util (horovod.common.util) ----

def test_is_version_greater_equal_than_as_horovod():
    check = common_util.is_version_greater_equal_than
    assert check("2.21.0", "2.11.0")
    assert not check("2.9.1", "2.11.0")  # numerically, not as strings
    assert check("2.11.0", "2.11.0") and check("3.0", "2.11.0")
    assert check("2.11.0rc1", "2.11.0")  # LooseVersion's order: a suffix sorts after
    for bad in ((2.11, "2.11.0"), ("2.11.0", None)):
        with pytest.raises(ValueError, match="str"):
            check(*bad)
    for target in ("2.11", "2.11.0.1"):
        with pytest.raises(ValueError, match="major.minor.patch"):
            check("2.11.0", target)
    with pytest.raises(TypeError):
        check("2.a.0", "2.1.0")  # a letter against a number, as LooseVersion


def test_support_non_legacy_keras_optimizers():
    assert common_util.support_non_legacy_keras_optimizers(types.SimpleNamespace(
        __version__="3.5.0"))
    assert not common_util.support_non_legacy_keras_optimizers(types.SimpleNamespace(
        __version__="2.10.0"))


def test_split_list_and_power_of_two():
    assert common_util.split_list([1, 2, 3, 4, 5], 3) == [[1, 2], [3, 4], [5]]
    assert common_util.split_list([1], 3) == [[1], [], []]
    assert [k for k in range(9) if common_util.num_rank_is_power_2(k)] == [1, 2, 4, 8]


def test_common_cache_memoizes_per_positional_and_keyword_arguments():
    calls = []

    @common_util._cache
    def f(a, b=0):
        calls.append((a, b))
        return a + b
    assert f(1, b=2) == 3 and f(1, b=2) == 3 and calls == [(1, 2)]
    assert f(1, 2) == 3 and calls == [(1, 2), (1, 2)]  # another key: positional
    assert f(1) == 1 and len(calls) == 3


def test_env_sets_and_restores(monkeypatch):
    monkeypatch.setenv("KRUG_TEST_KEPT", "before")
    monkeypatch.delenv("KRUG_TEST_NEW", raising=False)
    import os
    with pytest.raises(KeyError):
        with common_util.env(KRUG_TEST_KEPT="during", KRUG_TEST_NEW="new", KRUG_TEST_NONE=None):
            assert os.environ["KRUG_TEST_KEPT"] == "during"
            assert os.environ["KRUG_TEST_NEW"] == "new"
            assert "KRUG_TEST_NONE" not in os.environ
            raise KeyError("restored even so")
    assert os.environ["KRUG_TEST_KEPT"] == "before"
    assert "KRUG_TEST_NEW" not in os.environ


def test_average_backwards_compatibility_and_is_iterable():
    resolve = common_util.get_average_backwards_compatibility_fun(hvd)
    assert resolve(None, None) == hvd.Average and resolve(hvd.Sum, None) == hvd.Sum
    with pytest.warns(DeprecationWarning):
        assert resolve(None, False) == hvd.Sum
    with pytest.raises(ValueError, match="supersedes average"):
        resolve(hvd.Sum, True)
    assert common_util.is_iterable([]) and not common_util.is_iterable(3)


def test_check_extension_finds_built_modules():
    import krug.common
    common_util.check_extension("krug.common", "KRUG_WITH_TENSORFLOW", krug.common.__file__,
                                "_basics")
    with pytest.raises(ImportError, match="KRUG_WITH_TENSORFLOW=1"):
        common_util.check_extension("krug.common", "KRUG_WITH_TENSORFLOW",
                                    krug.common.__file__, "no_such_module")


def test_extension_probes_and_build_facts():
    assert common_util.extension_available("tensorflow")
    assert not common_util.extension_available("no_such_framework")
    assert common_util.gpu_available("tensorflow") is False  # CPU kernels only
    assert common_util.mpi_built() == hvd.mpi_built()
    assert common_util.nccl_built() == hvd.nccl_built()  # NCCL's version code, or 0
    assert common_util.gloo_built() is True
    assert common_util.ddl_built() is False and common_util.ccl_built() is False


def test_check_installed_version():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        common_util.check_installed_version("tensorflow", tf.__version__)
    with pytest.warns(UserWarning, match="was built against tensorflow"):
        common_util.check_installed_version("tensorflow", "0.0.1")
    cause = ImportError("undefined symbol")
    with pytest.raises(HorovodVersionMismatchError) as raised:
        common_util.check_installed_version("tensorflow", "0.0.1", cause)
    assert raised.value.__cause__ is cause and raised.value.version == "0.0.1"
    assert isinstance(raised.value, ImportError)


def test_importing_common_util_loads_no_framework():
    import subprocess
    code = ("import sys, krug.common.util; "
            "print(sorted(m for m in ('tensorflow', 'torch', 'jax', 'krug.common._basics') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
