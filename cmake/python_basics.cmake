# What the TensorFlow and JAX bindings (no pybind11 module of their own) share: finding their
# framework, their op library, and krug.common._basics.
#
# krug.common._basics (src/frameworks/python/basics_module.cc): lifecycle, topology, process sets
# and elastic calls for the Python frontends without a pybind11 module of their own (TensorFlow,
# Keras, JAX). Made once, by whichever of them is built first; pybind11 must be found already.
function(krug_add_python_basics)
  if(TARGET _basics)
    return()
  endif()
  pybind11_add_module(_basics MODULE ${PROJECT_SOURCE_DIR}/src/frameworks/python/basics_module.cc)
  target_link_libraries(_basics PRIVATE krug krug_frameworks_python_headers fmt::fmt)
  set_target_properties(_basics PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${KRUG_PYTHON_DIR}/krug/common
    BUILD_RPATH "$ORIGIN/../../..;${CMAKE_BINARY_DIR}"
    INSTALL_RPATH "$ORIGIN/../../..")
  if(TARGET krug_python)
    add_dependencies(_basics krug_python)
  endif()
endfunction()

# What the bindings without a pybind11 module of their own (TensorFlow, JAX) look for: Python 3's
# development files, the framework as cmake/<query> reports it (krug_query_python), a version
# in [min, limit) and pybind11, unless KRUG_BUILD_<part> is OFF, or AUTO in a sanitizer build.
# Sets KRUG_<part>_VERSION, KRUG_<part>_PROBLEM (why the binding cannot be built; empty when it
# can) and <out_json>, the query's answer, for the binding's own checks. A macro, so that what
# find_package sets (Python_*, pybind11's targets) reaches the caller. `name` is the framework's
# name in messages.
macro(krug_find_python_binding part name query min limit out_json)
  set(KRUG_${part}_VERSION "")
  set(KRUG_${part}_PROBLEM "")
  set(${out_json} "")
  if(KRUG_BUILD_${part} STREQUAL "AUTO" AND KRUG_SANITIZE)
    set(KRUG_${part}_PROBLEM "not built with KRUG_SANITIZE=${KRUG_SANITIZE}")
  elseif(KRUG_BUILD_${part} STREQUAL "OFF")
    set(KRUG_${part}_PROBLEM "disabled (KRUG_BUILD_${part}=OFF or KRUG_WITHOUT_${part})")
  else()
    find_package(Python 3 QUIET COMPONENTS Interpreter Development.Module)
    if(NOT Python_FOUND)
      set(KRUG_${part}_PROBLEM "Python 3 development files (python3-dev) not found")
    else()
      krug_query_python(${Python_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/${query} ${out_json}
        _krug_query_rc)
      string(JSON _krug_query_error ERROR_VARIABLE _krug_none GET "${${out_json}}" error)
      if(NOT _krug_query_rc EQUAL 0)
        set(KRUG_${part}_PROBLEM "${Python_EXECUTABLE} cannot run cmake/${query}")
      elseif(_krug_query_error)
        set(KRUG_${part}_PROBLEM
          "${name} is not importable by ${Python_EXECUTABLE} (${_krug_query_error})")
      else()
        string(JSON KRUG_${part}_VERSION GET "${${out_json}}" version)
        krug_check_framework_version(${name} ${KRUG_${part}_VERSION} ${min} ${limit}
          KRUG_${part}_PROBLEM)
        string(JSON _krug_pybind11 ERROR_VARIABLE _krug_none GET "${${out_json}}"
          pybind11_cmake_dir)
        set(PYBIND11_FINDPYTHON ON)
        find_package(pybind11 CONFIG QUIET HINTS ${_krug_pybind11})
        if(NOT KRUG_${part}_PROBLEM AND NOT pybind11_FOUND)
          set(KRUG_${part}_PROBLEM
            "pybind11 not found (pip install pybind11, or Debian's pybind11-dev)")
        endif()
      endif()
    endif()
  endif()
endmacro()

# After krug_find_python_binding and the binding's own checks: sets KRUG_<part>_ENABLED and says
# whether the binding is built; a binding that was required (KRUG_BUILD_<part>=ON) but cannot be
# is a configuration error.
macro(krug_settle_python_binding part name)
  set(KRUG_${part}_ENABLED OFF)
  if(KRUG_${part}_PROBLEM AND KRUG_BUILD_${part} STREQUAL "ON")
    message(FATAL_ERROR "krug: the ${name} binding was required (KRUG_BUILD_${part}=ON or "
      "KRUG_WITH_${part}=1) but cannot be built: ${KRUG_${part}_PROBLEM}.")
  endif()
  if(KRUG_${part}_PROBLEM)
    message(STATUS "krug: ${name} frontend not built: ${KRUG_${part}_PROBLEM}")
  else()
    set(KRUG_${part}_ENABLED ON)
    message(STATUS "krug: ${name} frontend enabled (${name} ${KRUG_${part}_VERSION}, "
      "Python ${Python_VERSION}: ${Python_EXECUTABLE})")
  endif()
endmacro()

# A binding's op library `target` (a MODULE of `sources`) for krug.<package>: built into
# ${KRUG_PYTHON_DIR}/krug/<package>, where the Python package loads it, seeing the frontend seam
# and src/frameworks/<package> only (like every binding, no core layer), finding libkrug three
# directories up when installed; krug.common._basics is built with it.
function(krug_add_binding_module target package)
  krug_layer_view(frameworks_${package} frameworks/${package})
  add_library(${target} MODULE ${ARGN})
  target_link_libraries(${target} PRIVATE krug krug_frameworks_${package}_headers fmt::fmt)
  set_target_properties(${target} PROPERTIES PREFIX ""
    LIBRARY_OUTPUT_DIRECTORY ${KRUG_PYTHON_DIR}/krug/${package}
    BUILD_RPATH "$ORIGIN/../../..;${CMAKE_BINARY_DIR}"
    INSTALL_RPATH "$ORIGIN/../../..")
  krug_add_python_basics()
  if(TARGET krug_python)
    add_dependencies(${target} krug_python)
  endif()
endfunction()
