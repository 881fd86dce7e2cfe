"""Prints, as JSON, what cmake/jax.cmake needs to build krug's JAX binding against the JAX of
this interpreter: its version, the directory of XLA's FFI headers (jax.ffi.include_dir(), shipped
in jaxlib) and pybind11's CMake directory.
"""
import json
import sys

out = {"python": sys.executable}
try:
    import jax
    import jax.ffi
    out["version"] = jax.__version__
    out["include_dir"] = jax.ffi.include_dir()
except Exception as e:  # noqa: BLE001 (any failure means: no usable JAX here)
    out["error"] = "%s: %s" % (type(e).__name__, e)
    print(json.dumps(out))
    sys.exit(0)
try:
    import pybind11
    out["pybind11_cmake_dir"] = pybind11.get_cmake_dir()
except ImportError:
    pass
print(json.dumps(out))
