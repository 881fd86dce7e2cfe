"""Horovod's ``horovod.common.util`` for code ported from Horovod: every name of Horovod
0.28.1's module, with Horovod's behaviour where it applies to krug. Where a name does not apply
as it is (Horovod probes its per-framework extensions, krug has one core), its docstring says
what krug does instead.

Importing this module loads no framework and no compiled part of krug."""

import importlib
import multiprocessing
import os
import queue
import re
import sys
import sysconfig
import warnings
from contextlib import contextmanager

from krug.common.exceptions import HorovodVersionMismatchError, get_version_mismatch_message
from krug.common.reduce_ops import handle_average_backwards_compatibility

# The framework bindings krug can build (Horovod's list has mxnet instead of jax).
EXTENSIONS = ["tensorflow", "torch", "jax"]


def get_ext_suffix():
    """The file suffix of a compiled Python module here (``.cpython-311-x86_64-linux-gnu.so``)."""
    return sysconfig.get_config_var("EXT_SUFFIX") or sysconfig.get_config_var("SO") or ".so"


def get_extension_full_path(pkg_path, *args):
    """The path of the compiled module ``args[-1]`` in the folders ``args[:-1]`` beside the
    file ``pkg_path`` (a package's ``__file__``)."""
    if not args:
        raise ValueError("get_extension_full_path needs at least the extension's name")
    folder = os.path.join(os.path.dirname(pkg_path), *args[:-1])
    return os.path.join(folder, args[-1] + get_ext_suffix())


def check_extension(ext_name, ext_env_var, pkg_path, *args):
    """Raises ImportError unless the compiled module that get_extension_full_path names exists.
    ``ext_env_var`` is the switch that makes a build fail where the extension cannot be built
    (``KRUG_WITH_TENSORFLOW``; krug accepts Horovod's ``HOROVOD_WITH_*`` names too)."""
    path = get_extension_full_path(pkg_path, *args)
    if not os.path.exists(path):
        raise ImportError("Extension {} has not been built: {} not found. If it should have "
                          "been, reinstall krug with {}=1 to see why its build failed."
                          .format(ext_name, path, ext_env_var))


def _check_extension_lambda(ext_base_name, fn, fn_desc, verbose):
    """``fn(krug.<ext_base_name>)`` computed in a forked process, as Horovod does: a binding
    that fails to load, or a GPU probe that initializes CUDA, stays out of this process. None
    when the import or ``fn`` fails (or the process dies); its output is muted unless
    ``verbose``."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_probe, args=(ext_base_name, fn, fn_desc, results, verbose),
                            daemon=True)
    child.start()
    child.join()
    try:
        return results.get(timeout=5)  # the child put its answer before it exited
    except queue.Empty:
        return None


def _probe(ext_base_name, fn, fn_desc, results, verbose):
    if verbose:
        print("Checking whether extension {} was {}.".format(ext_base_name, fn_desc))
    else:
        sys.stdout = open(os.devnull, "w")
        sys.stderr = open(os.devnull, "w")
    try:
        result = fn(importlib.import_module("krug." + ext_base_name))
    except BaseException:  # a failed probe is an answer (None), whatever it raised
        import traceback
        traceback.print_exc()
        result = None
    if verbose:
        print("Extension {} {} {}.".format(ext_base_name, "was" if result else "was NOT",
                                           fn_desc))
    results.put(result)


def extension_available(ext_base_name, verbose=False):
    """Whether ``krug.<ext_base_name>`` imports (probed in a forked process)."""
    return _check_extension_lambda(ext_base_name, lambda ext: ext is not None, "built",
                                   verbose) or False


def _cache(f):
    """``f`` memoized on its arguments (positional and keyword; all must be hashable)."""
    results = {}

    def cached(*args, **kwargs):
        key = (args, frozenset(kwargs.items()))
        if key not in results:
            results[key] = f(*args, **kwargs)
        return results[key]
    return cached


def _has_gpu(ext):
    check = getattr(ext, "_check_has_gpu", None)
    return bool(check()) if check is not None else False


@_cache
def gpu_available(ext_base_name, verbose=False):
    """Whether ``krug.<ext_base_name>`` takes GPU tensors on this machine (probed in a forked
    process, so that this one does not initialize CUDA). krug.tensorflow and krug.jax run on CPU
    tensors only: False for them; krug.torch: True in a CUDA build with a visible GPU."""
    return _check_extension_lambda(ext_base_name, _has_gpu, "running with GPU",
                                   verbose) or False


def _core():
    """The compiled core module this process can load (the framework-free one of the
    TensorFlow and JAX bindings, else krug.torch's), or None without any."""
    from krug.common import binding
    for load in (binding.load_basics, binding.load_torch_core):
        try:
            return load()
        except ImportError:
            continue
    return None


def _built(what, fact, verbose):
    """``fact(core)`` for the core this process loads; None when no binding of krug loads.

    Horovod asks each framework's extension in a forked process and takes the first answer;
    every binding of krug links the same core library, so krug asks that core once, here."""
    core = _core()
    result = None if core is None else fact(core)
    if verbose:
        print("krug's core {} built with {}.".format(
            "is not available: cannot tell whether it was" if core is None
            else "was" if result else "was NOT", what))
    return result


def _build_fact(name, what, fact, doc):
    """Horovod's ``<name>(verbose=False)``, memoized: ``fact(core)`` through _built."""
    @_cache
    def built(verbose=False):
        return _built(what, fact, verbose)
    built.__name__ = built.__qualname__ = name
    built.__doc__ = doc + " None when no binding of krug loads."
    return built


mpi_built = _build_fact("mpi_built", "MPI", lambda core: bool(core.mpi_built()),
                        "Whether krug was built with its MPI data plane.")
gloo_built = _build_fact("gloo_built", "Gloo", lambda core: True,
                         "Whether krug has Gloo: every build does.")
nccl_built = _build_fact("nccl_built", "NCCL", lambda core: core.nccl_version_code(),
                         "The NCCL version krug's NCCL data plane was built against, as "
                         "nccl.h's NCCL_VERSION_CODE (22809 for 2.28.9), 0 without NCCL "
                         "(Horovod's value).")
ddl_built = _build_fact("ddl_built", "DDL", lambda core: False,
                        "IBM DDL: krug has no DDL backend, so False.")
ccl_built = _build_fact("ccl_built", "CCL", lambda core: False,
                        "oneCCL: krug has no CCL backend, so False.")


@contextmanager
def env(**kwargs):
    """Sets the environment variables given (None values are skipped) for the ``with`` block,
    then restores each to its value before, or removes it when it had none."""
    values = {name: value for name, value in kwargs.items() if value is not None}
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def get_average_backwards_compatibility_fun(reduce_ops):
    """A function ``(op, average) -> op`` with Horovod's rules for the deprecated ``average=``
    argument; ``reduce_ops`` has the frontend's ``Average`` and ``Sum``."""
    def resolve(op, average):
        return handle_average_backwards_compatibility(op, average, reduce_ops.Average,
                                                      reduce_ops.Sum)
    return resolve


def num_rank_is_power_2(num_rank):
    """Whether ``num_rank`` is a power of two (1, 2, 4, ...). Horovod needs it for Adasum;
    krug's Adasum runs on any number of ranks, but ported code may still ask."""
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0


def split_list(l, n):  # noqa: E741 (Horovod's argument name)
    """``l`` in ``n`` consecutive chunks whose lengths differ by at most one, the longer ones
    first (empty chunks when ``n`` exceeds the length)."""
    size, extra = divmod(len(l), n)
    return [l[i * size + min(i, extra):(i + 1) * size + min(i + 1, extra)] for i in range(n)]


def check_installed_version(name, version, exception=None):
    """Compares ``version``, the version of framework ``name`` ("torch", "tensorflow", "jax")
    found here, with the one krug's binding was built against: on a difference a warning, or
    with ``exception`` given a HorovodVersionMismatchError raised from it. Horovod reads its
    metadata.json; krug its build record (``python -m krug.info`` shows it)."""
    from krug import _build_info
    built = (getattr(_build_info, name + "_version", None)
             if getattr(_build_info, name + "_built", False) else None)
    if built == version:
        return
    if exception is None:
        warnings.warn(get_version_mismatch_message(name, version, built))
    else:
        raise HorovodVersionMismatchError(name, version, built) from exception


def is_iterable(x):
    """Whether ``iter(x)`` works."""
    try:
        iter(x)
    except TypeError:
        return False
    return True


def _loose_version(text):
    """``text`` as distutils' LooseVersion orders it: runs of digits as ints, everything else
    as strings, the dots dropped. Written out here because distutils is deprecated (gone from
    Python 3.12) and krug takes no dependency for it; comparing an int part with a str part
    raises TypeError, as LooseVersion does."""
    parts = [p for p in re.split(r"(\d+|[a-z]+|\.)", text) if p and p != "."]
    return [int(p) if p.isdigit() else p for p in parts]


@_cache
def is_version_greater_equal_than(ver, target):
    """Whether version ``ver`` is at least ``target`` (``major.minor.patch``), in Horovod's
    ordering (LooseVersion's: ``2.11.0rc1`` counts as at least ``2.11.0``). ValueError for an
    argument that is not a str, or a target that is not three dot-separated parts."""
    if not isinstance(ver, str) or not isinstance(target, str):
        raise ValueError("is_version_greater_equal_than takes two str, got ver {!r} ({}) and "
                         "target {!r} ({})".format(ver, type(ver), target, type(target)))
    if len(target.split(".")) != 3:
        raise ValueError("the target version must have the form major.minor.patch, got "
                         "{!r}".format(target))
    return _loose_version(ver) >= _loose_version(target)


def support_non_legacy_keras_optimizers(k):
    """Whether the Keras module ``k`` (keras, tf_keras, tf.keras) makes the reworked optimizers
    its default ones, as Keras 2.11 and later do (Keras 3 has no others). A module without its
    own ``__version__`` is TensorFlow's and has TensorFlow's version."""
    version = getattr(k, "__version__", None)
    if version is None:
        import tensorflow as tf
        version = tf.__version__
    return is_version_greater_equal_than(version, "2.11.0")


__all__ = ["EXTENSIONS", "get_ext_suffix", "get_extension_full_path", "check_extension",
           "extension_available", "gpu_available", "mpi_built", "gloo_built", "nccl_built",
           "ddl_built", "ccl_built", "env", "get_average_backwards_compatibility_fun",
           "num_rank_is_power_2", "split_list", "check_installed_version", "is_iterable",
           "is_version_greater_equal_than", "support_non_legacy_keras_optimizers"]
