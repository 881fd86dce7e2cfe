"""Prints, as JSON, what cmake/jax.cmake needs to build krug's JAX binding against the JAX of
this interpreter: its version, the directory of XLA's FFI headers (jax.ffi.include_dir(), shipped
in jaxlib) and pybind11's CMake directory.
"""
from query_common import report


def describe():
    import jax
    import jax.ffi
    return {"version": jax.__version__, "include_dir": jax.ffi.include_dir()}


report(describe)
