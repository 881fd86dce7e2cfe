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

krug_build_choice(KRUG_BUILD_TENSORFLOW TENSORFLOW)
krug_find_python_binding(TENSORFLOW TensorFlow query_tensorflow.py ${KRUG_TENSORFLOW_MIN_VERSION}
  ${KRUG_TENSORFLOW_VERSION_LIMIT} _tf_json)
krug_settle_python_binding(TENSORFLOW TensorFlow)
if(NOT KRUG_TENSORFLOW_ENABLED)
  return()
endif()

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

file(GLOB KRUG_TENSORFLOW_SOURCES CONFIGURE_DEPENDS src/frameworks/tensorflow/*.cc)
krug_add_binding_module(_tensorflow_ops tensorflow ${KRUG_TENSORFLOW_SOURCES})
target_include_directories(_tensorflow_ops SYSTEM PRIVATE ${_tf_includes})
target_compile_definitions(_tensorflow_ops PRIVATE ${_tf_definitions})
target_link_libraries(_tensorflow_ops PRIVATE ${_tf_link})
set_property(TARGET _tensorflow_ops APPEND PROPERTY BUILD_RPATH ${KRUG_TENSORFLOW_LIBRARY_DIR})
