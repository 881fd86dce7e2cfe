# The PyTorch frontends:
#   krug_torch    libkrug_torch.so: the torch adapter (src/frameworks/torch), shared by the
#                 Python module and the LibTorch C++ API (include/krug/torch.h)
#   _torch_core   the pybind11 module, built into ${CMAKE_BINARY_DIR}/python/krug/torch/
#   krug_python   ${CMAKE_BINARY_DIR}/python: the Python package tree (python/krug/**/*.py
#                 symlinked), importable with PYTHONPATH=build/python; krugrun puts it on every
#                 rank's PYTHONPATH.
# KRUG_BUILD_TORCH (AUTO, ON, OFF; or KRUG_WITH_PYTORCH=1 / KRUG_WITHOUT_PYTORCH=1 in the
# environment, cmake/build_env.cmake): AUTO builds them when Python 3, a supported torch and
# pybind11 are found (cmake/find_torch.cmake) and says why not otherwise; ON fails the
# configuration instead.

set(KRUG_TORCH_ENABLED OFF)
string(TOUPPER "${KRUG_BUILD_TORCH}" KRUG_BUILD_TORCH)
if(KRUG_BUILD_TORCH MATCHES "^(ON|YES|TRUE|Y|1)$")
  set(KRUG_BUILD_TORCH ON)
elseif(KRUG_BUILD_TORCH MATCHES "^(OFF|NO|FALSE|N|0)$")
  set(KRUG_BUILD_TORCH OFF)
elseif(NOT KRUG_BUILD_TORCH STREQUAL "AUTO")
  message(FATAL_ERROR "KRUG_BUILD_TORCH must be ON, OFF or AUTO, not '${KRUG_BUILD_TORCH}'")
endif()
krug_apply_env_choice(KRUG_BUILD_TORCH PYTORCH)
set(KRUG_PYTHON_DIR ${CMAKE_BINARY_DIR}/python)
# Why the frontends are not built, for the build report and krug.torch's import error.
set(KRUG_TORCH_PROBLEM "")

if(KRUG_BUILD_TORCH STREQUAL "AUTO" AND KRUG_SANITIZE)
  # A sanitized module cannot be loaded into the (unsanitized) Python interpreter.
  set(KRUG_TORCH_PROBLEM "not built with KRUG_SANITIZE=${KRUG_SANITIZE}")
  message(STATUS "krug: PyTorch frontends not built with KRUG_SANITIZE=${KRUG_SANITIZE} "
    "(set KRUG_BUILD_TORCH=ON to force)")
elseif(KRUG_BUILD_TORCH STREQUAL "OFF")
  set(KRUG_TORCH_PROBLEM "disabled (KRUG_BUILD_TORCH=OFF or KRUG_WITHOUT_PYTORCH)")
  message(STATUS "krug: PyTorch frontends disabled (KRUG_BUILD_TORCH=OFF)")
else()
  # Debian's interpreter is the one with python3-torch; another python3 may come first on PATH.
  # An active virtual environment, or the interpreter pip builds for, is taken as it is.
  if(NOT Python_EXECUTABLE AND NOT DEFINED ENV{VIRTUAL_ENV} AND EXISTS /usr/bin/python3)
    set(Python_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "Python interpreter for the torch module")
  endif()
  find_package(Python 3 QUIET COMPONENTS Interpreter Development.Module)
  if(NOT Python_FOUND)
    set(KRUG_TORCH_PROBLEM "Python 3 development files (python3-dev) not found")
  else()
    include(${CMAKE_CURRENT_LIST_DIR}/find_torch.cmake)
    krug_find_torch(${Python_EXECUTABLE})
  endif()
  if(NOT KRUG_TORCH_PROBLEM)
    set(PYBIND11_FINDPYTHON ON)
    find_package(pybind11 CONFIG QUIET HINTS ${KRUG_PYBIND11_HINT})
    if(NOT pybind11_FOUND)
      set(KRUG_TORCH_PROBLEM "pybind11 not found (pip install pybind11, or Debian's pybind11-dev)")
    endif()
  endif()

  if(KRUG_TORCH_PROBLEM)
    if(KRUG_BUILD_TORCH STREQUAL "ON")
      message(FATAL_ERROR "krug: the PyTorch binding was required (KRUG_BUILD_TORCH=ON or "
        "KRUG_WITH_PYTORCH=1) but cannot be built: ${KRUG_TORCH_PROBLEM}.")
    endif()
    # A torch that is there but unusable is worth a warning (pip -v shows it); none at all is not.
    if(KRUG_TORCH_VERSION)
      message(WARNING "krug: PyTorch frontends not built: ${KRUG_TORCH_PROBLEM}")
    else()
      message(STATUS "krug: PyTorch frontends not built: ${KRUG_TORCH_PROBLEM}")
    endif()
  else()
    set(KRUG_TORCH_ENABLED ON)
    message(STATUS "krug: PyTorch frontends enabled (torch ${KRUG_TORCH_VERSION}, "
      "Python ${Python_VERSION}: ${Python_EXECUTABLE}, pybind11 ${pybind11_VERSION})")
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
  # PyPI's torch carries its own Gloo inside libtorch_cpu.so and exports its symbols. A program
  # that loads libtorch_cpu before libgloo would have libkrug's Gloo calls bind to torch's copy,
  # another Gloo version: a crash in the first Gloo collective. So programs that link krug::torch
  # need libgloo ahead of torch's libraries (kept even under --as-needed, since the program itself
  # calls no Gloo). Python takes the other way round (krug/common/binding.py).
  target_link_libraries(krug_torch PUBLIC krug "-Wl,--push-state,--no-as-needed" gloo
    "-Wl,--pop-state" torch PRIVATE krug_frameworks_torch_headers fmt::fmt)
  target_link_options(krug_torch PRIVATE -Wl,--no-undefined)

  pybind11_add_module(_torch_core MODULE src/frameworks/torch/python_module.cc)
  target_link_libraries(_torch_core PRIVATE krug_torch krug_frameworks_torch_headers
    krug_frameworks_python_headers torch
    ${KRUG_TORCH_PYTHON_LIBRARY} fmt::fmt)
  # What torch.utils.cpp_extension defines, so pybind11 types interoperate with torch._C.
  target_compile_definitions(_torch_core PRIVATE TORCH_EXTENSION_NAME=_torch_core
    ${KRUG_TORCH_PYBIND11_DEFINITIONS})
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
