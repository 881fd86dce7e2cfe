# What this build contains, written once at configure time from CMake's own variables:
#   generated/include/krug/version.h  public: KRUG_VERSION_* (installed with the headers)
#   generated/run/cli/build_config.h  krugrun --check-build: the bindings built and why not
#   python/krug/_build_info.py        krug.__version__, python -m krug.info and krug.torch's
#                                     import error (a second copy, with install paths, is
#                                     installed by cmake/install.cmake)
set(KRUG_GENERATED_DIR ${CMAKE_BINARY_DIR}/generated)
configure_file(${CMAKE_CURRENT_LIST_DIR}/templates/version.h.in
  ${KRUG_GENERATED_DIR}/include/krug/version.h @ONLY)
target_include_directories(krug PUBLIC $<BUILD_INTERFACE:${KRUG_GENERATED_DIR}/include>)

if(KRUG_TORCH_ENABLED)
  set(KRUG_TORCH_BUILT_VERSION ${KRUG_TORCH_VERSION})
else()
  set(KRUG_TORCH_BUILT_VERSION "")
endif()
if(KRUG_TENSORFLOW_ENABLED)
  set(KRUG_TENSORFLOW_BUILT_VERSION ${KRUG_TENSORFLOW_VERSION})
else()
  set(KRUG_TENSORFLOW_BUILT_VERSION "")
endif()
if(KRUG_JAX_ENABLED)
  set(KRUG_JAX_BUILT_VERSION ${KRUG_JAX_VERSION})
else()
  set(KRUG_JAX_BUILT_VERSION "")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/templates/build_config.h.in
  ${KRUG_GENERATED_DIR}/run/cli/build_config.h @ONLY)
target_include_directories(krugrun_lib PRIVATE ${KRUG_GENERATED_DIR})

# The Python build information: in the build tree krugrun and libkrug.so are in build/, next to
# python/.
function(krug_write_python_build_info path krugrun_relpath libkrug_relpath)
  if(KRUG_TORCH_ENABLED)
    set(KRUG_PY_TORCH_BUILT True)
  else()
    set(KRUG_PY_TORCH_BUILT False)
  endif()
  if(KRUG_TENSORFLOW_ENABLED)
    set(KRUG_PY_TENSORFLOW_BUILT True)
  else()
    set(KRUG_PY_TENSORFLOW_BUILT False)
  endif()
  if(KRUG_JAX_ENABLED)
    set(KRUG_PY_JAX_BUILT True)
  else()
    set(KRUG_PY_JAX_BUILT False)
  endif()
  set(KRUG_PY_KRUGRUN ${krugrun_relpath})
  set(KRUG_PY_LIBKRUG ${libkrug_relpath})
  configure_file(${CMAKE_CURRENT_FUNCTION_LIST_DIR}/templates/_build_info.py.in ${path} @ONLY)
endfunction()
krug_write_python_build_info(${KRUG_PYTHON_DIR}/krug/_build_info.py ../../krugrun
  ../../libkrug.so)
