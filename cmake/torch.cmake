# The PyTorch frontends:
#   krug_torch    libkrug_torch.so: the torch adapter (src/frameworks/torch), shared by the
#                 Python module and the LibTorch C++ API (include/krug/torch.h)
#   _torch_core   the pybind11 module, built into ${CMAKE_BINARY_DIR}/python/krug/torch/
#   krug_python   ${CMAKE_BINARY_DIR}/python: the Python package tree (python/krug/**/*.py
#                 symlinked), importable with PYTHONPATH=build/python; krugrun puts it on every
#                 rank's PYTHONPATH.
# KRUG_BUILD_TORCH (AUTO, ON, OFF): AUTO builds them when LibTorch, Python 3 and pybind11 are
# found and says why not otherwise; ON fails the configuration instead.

set(KRUG_TORCH_ENABLED OFF)
string(TOUPPER "${KRUG_BUILD_TORCH}" KRUG_BUILD_TORCH)
if(KRUG_BUILD_TORCH MATCHES "^(ON|YES|TRUE|Y|1)$")
  set(KRUG_BUILD_TORCH ON)
elseif(KRUG_BUILD_TORCH MATCHES "^(OFF|NO|FALSE|N|0)$")
  set(KRUG_BUILD_TORCH OFF)
elseif(NOT KRUG_BUILD_TORCH STREQUAL "AUTO")
  message(FATAL_ERROR "KRUG_BUILD_TORCH must be ON, OFF or AUTO, not '${KRUG_BUILD_TORCH}'")
endif()
set(KRUG_PYTHON_DIR ${CMAKE_BINARY_DIR}/python)

if(KRUG_BUILD_TORCH STREQUAL "AUTO" AND KRUG_SANITIZE)
  # A sanitized module cannot be loaded into the (unsanitized) Python interpreter.
  message(STATUS "krug: PyTorch frontends not built with KRUG_SANITIZE=${KRUG_SANITIZE} "
    "(set KRUG_BUILD_TORCH=ON to force)")
elseif(KRUG_BUILD_TORCH STREQUAL "OFF")
  message(STATUS "krug: PyTorch frontends disabled (KRUG_BUILD_TORCH=OFF)")
else()
  set(_krug_torch_missing "")
  # Debian's interpreter is the one with python3-torch; another python3 may come first on PATH.
  if(NOT Python_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "Python interpreter for the torch module")
  endif()
  find_package(Python 3 QUIET COMPONENTS Interpreter Development.Module)
  if(NOT Python_FOUND)
    list(APPEND _krug_torch_missing "Python 3 development files (python3-dev)")
  endif()
  if(Python_FOUND)
    set(PYBIND11_FINDPYTHON ON)
    find_package(pybind11 CONFIG QUIET)
    if(NOT pybind11_FOUND)
      list(APPEND _krug_torch_missing "pybind11 (pybind11-dev)")
    endif()
  endif()
  find_package(Torch QUIET)
  if(NOT Torch_FOUND AND NOT TORCH_FOUND)
    list(APPEND _krug_torch_missing "LibTorch (libtorch-dev)")
  else()
    find_library(KRUG_TORCH_PYTHON_LIBRARY torch_python
      HINTS ${TORCH_INSTALL_PREFIX}/lib /usr/lib/x86_64-linux-gnu)
    if(NOT KRUG_TORCH_PYTHON_LIBRARY)
      list(APPEND _krug_torch_missing "libtorch_python.so (python3-torch)")
    endif()
  endif()

  if(_krug_torch_missing)
    list(JOIN _krug_torch_missing ", " _krug_torch_missing_text)
    if(KRUG_BUILD_TORCH STREQUAL "ON")
      message(FATAL_ERROR "KRUG_BUILD_TORCH=ON but not found: ${_krug_torch_missing_text}. "
        "Install them (scripts/install-deps) or configure with -DKRUG_BUILD_TORCH=OFF.")
    endif()
    message(STATUS "krug: PyTorch frontends not built; missing ${_krug_torch_missing_text} "
      "(scripts/install-deps installs them)")
  else()
    set(KRUG_TORCH_ENABLED ON)
    message(STATUS "krug: PyTorch frontends enabled (torch ${Torch_VERSION}, "
      "Python ${Python_VERSION}: ${Python_EXECUTABLE})")
  endif()
endif()

if(KRUG_TORCH_ENABLED)
  # Warnings of torch's own headers are not ours: its include directories come from the
  # imported target and are used as SYSTEM directories.
  file(GLOB KRUG_TORCH_SOURCES CONFIGURE_DEPENDS src/frameworks/torch/*.cc)
  list(FILTER KRUG_TORCH_SOURCES EXCLUDE REGEX ".*/python_module\\.cc$")
  add_library(krug_torch SHARED ${KRUG_TORCH_SOURCES})
  # A binding is a layer of its own (cmake/layers.cmake): it sees its folder and what it declares.
  krug_layer_view(frameworks_torch frameworks/torch)
  # No dependency on any core layer: a binding uses the frontend seam (include/krug/frontend.h)
  # and the public API only, so including a header from src/engine or src/controller here fails.
  target_link_libraries(krug_torch PUBLIC krug torch PRIVATE krug_frameworks_torch_headers
    fmt::fmt)
  target_link_options(krug_torch PRIVATE -Wl,--no-undefined)

  pybind11_add_module(_torch_core MODULE src/frameworks/torch/python_module.cc)
  target_link_libraries(_torch_core PRIVATE krug_torch krug_frameworks_torch_headers torch
    ${KRUG_TORCH_PYTHON_LIBRARY} fmt::fmt)
  # What torch.utils.cpp_extension defines, so pybind11 types interoperate with torch._C.
  target_compile_definitions(_torch_core PRIVATE TORCH_API_INCLUDE_EXTENSION_H
    TORCH_EXTENSION_NAME=_torch_core PYBIND11_COMPILER_TYPE="_gcc"
    PYBIND11_STDLIB="_libstdcpp" PYBIND11_BUILD_ABI="_cxxabi1011")
  set_target_properties(_torch_core PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${KRUG_PYTHON_DIR}/krug/torch
    # libkrug.so / libkrug_torch.so: the build tree (CMake adds it) or, relocated, three levels up.
    BUILD_RPATH "$ORIGIN/../../..;${CMAKE_BINARY_DIR}"
    INSTALL_RPATH "$ORIGIN/../../..")
endif()

# The Python package tree: every python/**/*.py symlinked into build/python (edits show at once;
# new files appear on the next build, which re-globs).
file(GLOB_RECURSE KRUG_PYTHON_FILES CONFIGURE_DEPENDS
  RELATIVE ${CMAKE_CURRENT_SOURCE_DIR}/python ${CMAKE_CURRENT_SOURCE_DIR}/python/*.py)
set(_krug_python_links "")
foreach(f ${KRUG_PYTHON_FILES})
  set(_src ${CMAKE_CURRENT_SOURCE_DIR}/python/${f})
  set(_dst ${KRUG_PYTHON_DIR}/${f})
  get_filename_component(_dir ${_dst} DIRECTORY)
  add_custom_command(OUTPUT ${_dst}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${_dir}
    COMMAND ${CMAKE_COMMAND} -E create_symlink ${_src} ${_dst}
    DEPENDS ${_src}
    COMMENT "Linking python/${f} into ${KRUG_PYTHON_DIR}" VERBATIM)
  list(APPEND _krug_python_links ${_dst})
endforeach()
if(_krug_python_links)
  add_custom_target(krug_python ALL DEPENDS ${_krug_python_links})
  if(TARGET _torch_core)
    add_dependencies(_torch_core krug_python)
  endif()
endif()
