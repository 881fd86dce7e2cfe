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

set(KRUG_JAX_ENABLED OFF)
set(KRUG_JAX_VERSION "")
set(KRUG_JAX_PROBLEM "")
krug_build_choice(KRUG_BUILD_JAX JAX)

if(KRUG_BUILD_JAX STREQUAL "AUTO" AND KRUG_SANITIZE)
  set(KRUG_JAX_PROBLEM "not built with KRUG_SANITIZE=${KRUG_SANITIZE}")
elseif(KRUG_BUILD_JAX STREQUAL "OFF")
  set(KRUG_JAX_PROBLEM "disabled (KRUG_BUILD_JAX=OFF or KRUG_WITHOUT_JAX)")
else()
  find_package(Python 3 QUIET COMPONENTS Interpreter Development.Module)
  if(NOT Python_FOUND)
    set(KRUG_JAX_PROBLEM "Python 3 development files (python3-dev) not found")
  else()
    krug_query_python(${Python_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/query_jax.py
      _jax_json _jax_rc)
    string(JSON _jax_error ERROR_VARIABLE _jax_none GET "${_jax_json}" error)
    if(NOT _jax_rc EQUAL 0)
      set(KRUG_JAX_PROBLEM "${Python_EXECUTABLE} cannot run cmake/query_jax.py")
    elseif(_jax_error)
      set(KRUG_JAX_PROBLEM "JAX is not importable by ${Python_EXECUTABLE} (${_jax_error})")
    else()
      string(JSON KRUG_JAX_VERSION GET "${_jax_json}" version)
      string(JSON _jax_include GET "${_jax_json}" include_dir)
      krug_check_framework_version(JAX ${KRUG_JAX_VERSION} ${KRUG_JAX_MIN_VERSION}
        ${KRUG_JAX_VERSION_LIMIT} KRUG_JAX_PROBLEM)
      if(NOT KRUG_JAX_PROBLEM AND NOT EXISTS ${_jax_include}/xla/ffi/api/ffi.h)
        set(KRUG_JAX_PROBLEM "XLA's FFI headers are not in ${_jax_include} (jaxlib incomplete)")
      endif()
      string(JSON _jax_pybind11 ERROR_VARIABLE _jax_none GET "${_jax_json}" pybind11_cmake_dir)
      set(PYBIND11_FINDPYTHON ON)
      find_package(pybind11 CONFIG QUIET HINTS ${_jax_pybind11})
      if(NOT KRUG_JAX_PROBLEM AND NOT pybind11_FOUND)
        set(KRUG_JAX_PROBLEM "pybind11 not found (pip install pybind11, or Debian's pybind11-dev)")
      endif()
    endif()
  endif()
  if(KRUG_JAX_PROBLEM AND KRUG_BUILD_JAX STREQUAL "ON")
    message(FATAL_ERROR "krug: the JAX binding was required (KRUG_BUILD_JAX=ON or "
      "KRUG_WITH_JAX=1) but cannot be built: ${KRUG_JAX_PROBLEM}.")
  endif()
  if(NOT KRUG_JAX_PROBLEM)
    set(KRUG_JAX_ENABLED ON)
  endif()
endif()

if(NOT KRUG_JAX_ENABLED)
  message(STATUS "krug: JAX frontend not built: ${KRUG_JAX_PROBLEM}")
  return()
endif()
message(STATUS "krug: JAX frontend enabled (JAX ${KRUG_JAX_VERSION}, Python ${Python_VERSION}: "
  "${Python_EXECUTABLE})")

krug_layer_view(frameworks_jax frameworks/jax)
add_library(_jax_ops MODULE src/frameworks/jax/ffi_collective.cc)
target_include_directories(_jax_ops SYSTEM PRIVATE ${_jax_include})
# Like every binding, no core layer: the frontend seam (include/krug/frontend.h) only.
target_link_libraries(_jax_ops PRIVATE krug krug_frameworks_jax_headers fmt::fmt)
set_target_properties(_jax_ops PROPERTIES PREFIX ""
  LIBRARY_OUTPUT_DIRECTORY ${KRUG_PYTHON_DIR}/krug/jax
  BUILD_RPATH "$ORIGIN/../../..;${CMAKE_BINARY_DIR}"
  INSTALL_RPATH "$ORIGIN/../../..")

krug_add_python_basics()
if(TARGET krug_python)
  add_dependencies(_jax_ops krug_python)
endif()
