# The TensorFlow frontend (src/frameworks/tensorflow, python/krug/{tensorflow,keras}):
#   _tensorflow_ops  the op library (asynchronous kernels over the frontend seam), built into
#                    ${KRUG_PYTHON_DIR}/krug/tensorflow/ and loaded with tf.load_op_library
#   _basics          krug.common._basics: the framework-free lifecycle, topology and
#                    process-set calls (src/frameworks/python), a pybind11 module
# KRUG_BUILD_TENSORFLOW (AUTO, ON, OFF; or KRUG_WITH_TENSORFLOW=1 / KRUG_WITHOUT_TENSORFLOW=1,
# HOROVOD_* alike, cmake/build_env.cmake): AUTO builds them when the interpreter imports a
# supported TensorFlow and pybind11 is found, and says why not otherwise; ON fails instead.
#
# TensorFlow is built with its own flags (tf.sysconfig): its include directory, its C++ ABI
# and its Eigen alignment. Those flags apply to the op library only, never to libkrug, which
# the op library links like any other program does.

set(KRUG_TENSORFLOW_MIN_VERSION 2.16)
set(KRUG_TENSORFLOW_VERSION_LIMIT 3.0)

set(KRUG_TENSORFLOW_ENABLED OFF)
set(KRUG_TENSORFLOW_VERSION "")
set(KRUG_TENSORFLOW_PROBLEM "")
krug_build_choice(KRUG_BUILD_TENSORFLOW TENSORFLOW)

if(KRUG_BUILD_TENSORFLOW STREQUAL "AUTO" AND KRUG_SANITIZE)
  set(KRUG_TENSORFLOW_PROBLEM "not built with KRUG_SANITIZE=${KRUG_SANITIZE}")
elseif(KRUG_BUILD_TENSORFLOW STREQUAL "OFF")
  set(KRUG_TENSORFLOW_PROBLEM "disabled (KRUG_BUILD_TENSORFLOW=OFF or KRUG_WITHOUT_TENSORFLOW)")
else()
  find_package(Python 3 QUIET COMPONENTS Interpreter Development.Module)
  if(NOT Python_FOUND)
    set(KRUG_TENSORFLOW_PROBLEM "Python 3 development files (python3-dev) not found")
  else()
    krug_query_python(${Python_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/query_tensorflow.py
      _tf_json _tf_rc)
    string(JSON _tf_error ERROR_VARIABLE _tf_none GET "${_tf_json}" error)
    if(NOT _tf_rc EQUAL 0)
      set(KRUG_TENSORFLOW_PROBLEM "${Python_EXECUTABLE} cannot run cmake/query_tensorflow.py")
    elseif(_tf_error)
      set(KRUG_TENSORFLOW_PROBLEM "TensorFlow is not importable by ${Python_EXECUTABLE} "
        "(${_tf_error})")
    else()
      string(JSON KRUG_TENSORFLOW_VERSION GET "${_tf_json}" version)
      krug_check_framework_version(TensorFlow ${KRUG_TENSORFLOW_VERSION}
        ${KRUG_TENSORFLOW_MIN_VERSION} ${KRUG_TENSORFLOW_VERSION_LIMIT} KRUG_TENSORFLOW_PROBLEM)
      string(JSON _tf_pybind11 ERROR_VARIABLE _tf_none GET "${_tf_json}" pybind11_cmake_dir)
      set(PYBIND11_FINDPYTHON ON)
      find_package(pybind11 CONFIG QUIET HINTS ${_tf_pybind11})
      if(NOT KRUG_TENSORFLOW_PROBLEM AND NOT pybind11_FOUND)
        set(KRUG_TENSORFLOW_PROBLEM "pybind11 not found (pip install pybind11, or Debian's "
          "pybind11-dev)")
      endif()
    endif()
  endif()
  if(KRUG_TENSORFLOW_PROBLEM AND KRUG_BUILD_TENSORFLOW STREQUAL "ON")
    message(FATAL_ERROR "krug: the TensorFlow binding was required (KRUG_BUILD_TENSORFLOW=ON "
      "or KRUG_WITH_TENSORFLOW=1) but cannot be built: ${KRUG_TENSORFLOW_PROBLEM}.")
  endif()
  if(NOT KRUG_TENSORFLOW_PROBLEM)
    set(KRUG_TENSORFLOW_ENABLED ON)
  endif()
endif()

if(NOT KRUG_TENSORFLOW_ENABLED)
  message(STATUS "krug: TensorFlow frontend not built: ${KRUG_TENSORFLOW_PROBLEM}")
  return()
endif()
message(STATUS "krug: TensorFlow frontend enabled (TensorFlow ${KRUG_TENSORFLOW_VERSION}, "
  "Python ${Python_VERSION}: ${Python_EXECUTABLE})")

# TensorFlow's flags, split into include directories (SYSTEM: its headers' warnings are not
# ours), definitions (the C++ ABI, Eigen's alignment) and link options. Its -std is dropped:
# the op library is C++20 like the rest of krug, which TensorFlow's headers accept.
string(JSON _n LENGTH "${_tf_json}" compile_flags)
set(_tf_includes "")
set(_tf_definitions "")
math(EXPR _last "${_n} - 1")
foreach(i RANGE ${_last})
  string(JSON flag GET "${_tf_json}" compile_flags ${i})
  if(flag MATCHES "^-I(.*)")
    list(APPEND _tf_includes ${CMAKE_MATCH_1})
  elseif(flag MATCHES "^-D(.*)")
    list(APPEND _tf_definitions ${CMAKE_MATCH_1})
  endif()
endforeach()
string(JSON _n LENGTH "${_tf_json}" link_flags)
set(_tf_link "")
math(EXPR _last "${_n} - 1")
foreach(i RANGE ${_last})
  string(JSON flag GET "${_tf_json}" link_flags ${i})
  list(APPEND _tf_link ${flag})
  if(flag MATCHES "^-L(.*)")
    set(KRUG_TENSORFLOW_LIBRARY_DIR ${CMAKE_MATCH_1})
  endif()
endforeach()
if("_GLIBCXX_USE_CXX11_ABI=0" IN_LIST _tf_definitions)
  # The seam passes std::string and std::function: both sides need the same C++ ABI.
  message(FATAL_ERROR "krug: TensorFlow ${KRUG_TENSORFLOW_VERSION} was built with the old C++ "
    "ABI (_GLIBCXX_USE_CXX11_ABI=0), libkrug with the new one; build krug with "
    "KRUG_BUILD_TENSORFLOW=OFF or against a TensorFlow of the new ABI (2.9 or newer)")
endif()

krug_layer_view(frameworks_tensorflow frameworks/tensorflow)
file(GLOB KRUG_TENSORFLOW_SOURCES CONFIGURE_DEPENDS src/frameworks/tensorflow/*.cc)
add_library(_tensorflow_ops MODULE ${KRUG_TENSORFLOW_SOURCES})
target_include_directories(_tensorflow_ops SYSTEM PRIVATE ${_tf_includes})
target_compile_definitions(_tensorflow_ops PRIVATE ${_tf_definitions})
# Like the torch binding, no core layer: the frontend seam (include/krug/frontend.h) only.
target_link_libraries(_tensorflow_ops PRIVATE krug krug_frameworks_tensorflow_headers fmt::fmt
  ${_tf_link})
set_target_properties(_tensorflow_ops PROPERTIES PREFIX ""
  LIBRARY_OUTPUT_DIRECTORY ${KRUG_PYTHON_DIR}/krug/tensorflow
  BUILD_RPATH "$ORIGIN/../../..;${CMAKE_BINARY_DIR};${KRUG_TENSORFLOW_LIBRARY_DIR}"
  INSTALL_RPATH "$ORIGIN/../../..")

krug_add_python_basics()
if(TARGET krug_python)
  add_dependencies(_tensorflow_ops krug_python)
endif()
