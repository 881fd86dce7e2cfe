"""The helper modules ported code imports (horovod.tensorflow.util as krug.tensorflow.util,
horovod.common.util as krug.common.util), run inside every rank of
`krugrun -np N python -m pytest`."""

import sys
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
