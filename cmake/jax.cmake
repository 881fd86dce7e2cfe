# The JAX frontend (src/frameworks/jax, python/krug/jax):
#   _jax_ops  an XLA FFI handler library (no Python in it), built into
#             ${KRUG_PYTHON_DIR}/krug/jax/ and registered by krug.jax with jax.ffi
#   _basics   the framework-free pybind11 module (cmake/python_basics.cmake)
#
# KRUG_BUILD_JAX (AUTO, ON, OFF; or KRUG_WITH_JAX=1 / KRUG_WITHOUT_JAX=1): AUTO builds it when the
# interpreter imports a supported JAX and pybind11 is found. XLA's FFI is a header-only C API
# (jaxlib ships the headers), so the library links nothing of JAX's.
#
# Sets KRUG_JAX_ENABLED, KRUG_JAX_VERSION and KRUG_JAX_PROBLEM (why not, for the build report).

set(KRUG_JAX_MIN_VERSION 0.10)
set(KRUG_JAX_VERSION_LIMIT 1.0)

krug_build_choice(KRUG_BUILD_JAX JAX)
krug_find_python_binding(JAX JAX query_jax.py ${KRUG_JAX_MIN_VERSION} ${KRUG_JAX_VERSION_LIMIT}
  _jax_json)
if(NOT KRUG_JAX_PROBLEM)
  string(JSON _jax_include GET "${_jax_json}" include_dir)
  if(NOT EXISTS ${_jax_include}/xla/ffi/api/ffi.h)
    set(KRUG_JAX_PROBLEM "XLA's FFI headers are not in ${_jax_include} (jaxlib incomplete)")
  endif()
endif()
krug_settle_python_binding(JAX JAX)
if(NOT KRUG_JAX_ENABLED)
  return()
endif()

krug_add_binding_module(_jax_ops jax src/frameworks/jax/ffi_collective.cc)
target_include_directories(_jax_ops SYSTEM PRIVATE ${_jax_include})
