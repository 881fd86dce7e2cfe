"""Loading a framework binding (a compiled module of krug) with an error that says how to fix it.

A binding is built only when its framework was importable while krug was built, and it works
only with the framework version it was built against; either failure ends in an ImportError
that names what happened and the command that rebuilds krug for this environment.
"""

import ctypes
import importlib
import os
import sys

from krug import _build_info

REBUILD = ("KRUG_WITH_{part}=1 {python} -m pip install --no-cache-dir --force-reinstall "
           "--no-deps <krug source: a clone or sdist>  (from a clone for development: "
           "scripts/build)")


def load_torch_core():
    """krug.torch._torch_core, or an ImportError that explains why it cannot be loaded."""
    try:
        _load_core_first()
        return importlib.import_module("krug.torch._torch_core")
    except ImportError as e:
        raise ImportError(torch_core_error(e, _torch_version())) from e


def _load_core_first():
    """Loads libkrug.so on its own, every symbol bound at once, before the torch module.

    PyPI's torch carries its own Gloo inside libtorch_cpu.so and exports it. Loaded as a
    dependency of the torch module, libkrug would find torch's Gloo before its own libgloo (the
    module needs libtorch_cpu first) and call into another Gloo version: a crash. Loaded first,
    libkrug's calls bind to its own libgloo; the module then reuses this libkrug.
    """
    here = os.path.dirname(os.path.abspath(_build_info.__file__))
    path = os.path.normpath(os.path.join(here, _build_info.libkrug))
    if os.path.exists(path):
        ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)


def _torch_version():
    torch = sys.modules.get("torch")
    return getattr(torch, "__version__", "unknown")


def torch_core_error(cause, torch_here):
    rebuild = REBUILD.format(part="PYTORCH", python=sys.executable)
    if not _build_info.torch_built:
        return ("krug.torch is not available: this krug was built without its PyTorch binding "
                "(%s). Install torch into this environment, then rebuild krug: %s"
                % (_build_info.torch_problem, rebuild))
    return ("krug.torch's binding does not load (%s). It was built against torch %s for %s; "
            "this environment has torch %s (%s). Rebuild krug against this torch: %s"
            % (cause, _build_info.torch_version, _build_info.python, torch_here,
               sys.executable, rebuild))


def load_basics():
    """krug.common._basics, the framework-free module of the TensorFlow and JAX bindings (it is
    built with either), or an ImportError."""
    _load_core_first()
    return importlib.import_module("krug.common._basics")


def load_jax_ops():
    """(krug.common._basics, the path of the JAX FFI handler library), or an ImportError that
    explains why they cannot be loaded."""
    import jax
    rebuild = REBUILD.format(part="JAX", python=sys.executable)
    if not _build_info.jax_built:
        raise ImportError("krug.jax is not available: this krug was built without its JAX "
                          "binding (%s). Install jax into this environment, then rebuild krug: "
                          "%s" % (_build_info.jax_problem, rebuild))
    here = os.path.dirname(os.path.abspath(_build_info.__file__))
    path = os.path.join(here, "jax", "_jax_ops.so")
    try:
        basics = load_basics()
        ctypes.CDLL(path)  # loads here, so that a missing library fails at import
    except (ImportError, OSError) as e:
        raise ImportError("krug.jax's binding does not load (%s). It was built against JAX %s "
                          "for %s; this environment has JAX %s (%s). Rebuild krug against this "
                          "JAX: %s" % (e, _build_info.jax_version, _build_info.python,
                                       jax.__version__, sys.executable, rebuild)) from e
    return basics, path


def load_tensorflow_ops():
    """(krug.common._basics, the loaded TensorFlow op library), or an ImportError that explains
    why they cannot be loaded."""
    import tensorflow as tf
    rebuild = REBUILD.format(part="TENSORFLOW", python=sys.executable)
    if not _build_info.tensorflow_built:
        raise ImportError("krug.tensorflow is not available: this krug was built without its "
                          "TensorFlow binding (%s). Install tensorflow into this environment, "
                          "then rebuild krug: %s" % (_build_info.tensorflow_problem, rebuild))
    try:
        basics = load_basics()
        here = os.path.dirname(os.path.abspath(_build_info.__file__))
        ops = tf.load_op_library(os.path.join(here, "tensorflow", "_tensorflow_ops.so"))
    except (ImportError, tf.errors.NotFoundError, OSError) as e:
        raise ImportError("krug.tensorflow's binding does not load (%s). It was built against "
                          "TensorFlow %s for %s; this environment has TensorFlow %s (%s). "
                          "Rebuild krug against this TensorFlow: %s"
                          % (e, _build_info.tensorflow_version, _build_info.python,
                             tf.__version__, sys.executable, rebuild)) from e
    return basics, ops
