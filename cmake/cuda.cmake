# GPU support: the CUDA device layer (src/device: streams, events, pinned and device buffers,
# copy and scale kernels) and the NCCL data plane (src/collectives/nccl).
#
#   KRUG_WITH_CUDA  AUTO (default), ON or OFF. AUTO builds it when nvcc and the CUDA runtime are
#                   found; ON fails the configuration otherwise. KRUG_WITH_CUDA=1 /
#                   KRUG_WITHOUT_CUDA=1 (HOROVOD_WITH_CUDA, HOROVOD_GPU=CUDA) in the environment.
#   KRUG_WITH_NCCL  AUTO, ON or OFF; needs CUDA. KRUG_WITH_NCCL=1 / KRUG_WITHOUT_NCCL=1, and
#                   Horovod's HOROVOD_GPU_OPERATIONS=NCCL or HOROVOD_GPU_ALLREDUCE=NCCL.
#   KRUG_NCCL_HOME  (or HOROVOD_NCCL_HOME, env or -D): where nccl.h and libnccl are.
#   CUDAToolkit_ROOT / HOROVOD_CUDA_HOME: the toolkit, when nvcc is not on PATH.
#
# Without them src/device_absent and src/collectives/nccl_absent stand in: the same functions,
# each saying how to get the feature, so the engine needs no #ifdef.
# Sets KRUG_CUDA_ENABLED, KRUG_CUDA_VERSION, KRUG_NCCL_ENABLED, KRUG_NCCL_VERSION, KRUG_GPU_LINK.

function(_krug_normalize_choice var)
  string(TOUPPER "${${var}}" v)
  if(v MATCHES "^(ON|YES|TRUE|Y|1)$")
    set(v ON)
  elseif(v MATCHES "^(OFF|NO|FALSE|N|0)$")
    set(v OFF)
  elseif(NOT v STREQUAL "AUTO")
    message(FATAL_ERROR "${var} must be ON, OFF or AUTO, not '${${var}}'")
  endif()
  set(${var} ${v} PARENT_SCOPE)
endfunction()

set(KRUG_WITH_CUDA AUTO CACHE STRING "Build the CUDA device layer: ON, OFF or AUTO")
set_property(CACHE KRUG_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)
set(KRUG_WITH_NCCL AUTO CACHE STRING "Build the NCCL data plane: ON, OFF or AUTO")
set_property(CACHE KRUG_WITH_NCCL PROPERTY STRINGS AUTO ON OFF)
_krug_normalize_choice(KRUG_WITH_CUDA)
_krug_normalize_choice(KRUG_WITH_NCCL)
krug_apply_env_choice(KRUG_WITH_CUDA CUDA)
krug_apply_env_choice(KRUG_WITH_NCCL NCCL)
# Horovod's spellings of the same choices.
if(KRUG_WITH_CUDA STREQUAL "AUTO" AND "$ENV{HOROVOD_GPU}" STREQUAL "CUDA")
  set(KRUG_WITH_CUDA ON)
endif()
foreach(name HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE)
  if(KRUG_WITH_NCCL STREQUAL "AUTO" AND "$ENV{${name}}" STREQUAL "NCCL")
    message(STATUS "krug: KRUG_WITH_NCCL=ON (${name}=NCCL)")
    set(KRUG_WITH_NCCL ON)
  endif()
endforeach()
if(KRUG_WITH_NCCL STREQUAL "ON" AND KRUG_WITH_CUDA STREQUAL "OFF")
  message(FATAL_ERROR "krug: KRUG_WITH_NCCL=ON needs CUDA, but KRUG_WITH_CUDA=OFF")
endif()
if(NOT CUDAToolkit_ROOT AND DEFINED ENV{HOROVOD_CUDA_HOME})
  set(CUDAToolkit_ROOT $ENV{HOROVOD_CUDA_HOME})
endif()

set(KRUG_CUDA_ENABLED OFF)
set(KRUG_CUDA_VERSION "")
set(KRUG_CUDA_PROBLEM "")
set(KRUG_NCCL_ENABLED OFF)
set(KRUG_NCCL_VERSION "")
set(KRUG_NCCL_PROBLEM "")
set(KRUG_GPU_LINK "")

if(KRUG_WITH_CUDA STREQUAL "OFF")
  set(KRUG_CUDA_PROBLEM "disabled (KRUG_WITH_CUDA=OFF)")
else()
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(_krug_nvcc nvcc HINTS ${CUDAToolkit_ROOT}/bin /usr/local/cuda/bin)
    if(_krug_nvcc)
      set(CMAKE_CUDA_COMPILER ${_krug_nvcc})
    endif()
  endif()
  check_language(CUDA)
  find_package(CUDAToolkit QUIET)
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
    # C++17 for the kernels: CMake before 3.26 knows no C++20 flag for nvcc (the kernel file
    # includes only C++17-clean headers).
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    # Architectures, unless the user chose: A100 (sm_80) and H100 / H200 (sm_90, where krug is
    # checked), with PTX for newer GPUs. Each one is a compile of the kernels.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "80-real;90")
    endif()
    enable_language(CUDA)
    set(KRUG_CUDA_ENABLED ON)
    set(KRUG_CUDA_VERSION ${CUDAToolkit_VERSION})
    message(STATUS "krug: CUDA enabled (CUDA ${CUDAToolkit_VERSION}, ${CMAKE_CUDA_COMPILER})")
  else()
    set(KRUG_CUDA_PROBLEM "nvcc or the CUDA runtime was not found (install the CUDA toolkit or "
      "set CUDAToolkit_ROOT)")
    if(KRUG_WITH_CUDA STREQUAL "ON")
      message(FATAL_ERROR "KRUG_WITH_CUDA=ON but ${KRUG_CUDA_PROBLEM}")
    endif()
    message(STATUS "krug: CUDA not built: ${KRUG_CUDA_PROBLEM}")
  endif()
endif()

if(KRUG_CUDA_ENABLED)
  file(GLOB KRUG_DEVICE_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/device/*.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/src/device/*.cu)
  krug_layer(device FOLDER device SOURCES ${KRUG_DEVICE_SOURCES} LIBS fmt::fmt CUDA::cudart)
  target_compile_options(krug_device PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra$<$<BOOL:${KRUG_WERROR}>:,-Werror>>)
  list(APPEND KRUG_GPU_LINK CUDA::cudart)
else()
  krug_layer(device FOLDER device
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/device_absent/no_cuda.cc LIBS fmt::fmt)
endif()

if(KRUG_CUDA_ENABLED AND NOT KRUG_WITH_NCCL STREQUAL "OFF")
  set(_krug_nccl_home ${KRUG_NCCL_HOME})
  if(NOT _krug_nccl_home)
    set(_krug_nccl_home $ENV{KRUG_NCCL_HOME} $ENV{HOROVOD_NCCL_HOME})
  endif()
  if(NOT _krug_nccl_home AND Python_EXECUTABLE)
    # The NCCL the build's torch loads (PyPI's nvidia-nccl wheel), when it has one: a process
    # holds one libnccl.so.2, so libkrug and libtorch_cuda must agree on which, or the one
    # loaded second misses the symbols of the newer (the link of LibTorch programs fails).
    execute_process(
      COMMAND ${Python_EXECUTABLE} -c "import nvidia.nccl as n; print(list(n.__path__)[0])"
      OUTPUT_VARIABLE _krug_torch_nccl OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
      RESULT_VARIABLE _krug_torch_nccl_rc)
    if(_krug_torch_nccl_rc EQUAL 0 AND EXISTS "${_krug_torch_nccl}/include/nccl.h")
      set(_krug_nccl_home ${_krug_torch_nccl})
    endif()
  endif()
  # Header and library from one place: a given KRUG_NCCL_HOME first and alone (a torch
  # environment's nvidia/nccl has only libnccl.so.2), then the usual places.
  if(_krug_nccl_home)
    find_path(KRUG_NCCL_INCLUDE_DIR nccl.h PATHS ${_krug_nccl_home} PATH_SUFFIXES include
      NO_DEFAULT_PATH)
    find_library(KRUG_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
      PATHS ${_krug_nccl_home} PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
  endif()
  find_path(KRUG_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(KRUG_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
    HINTS ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
  if(KRUG_NCCL_INCLUDE_DIR AND KRUG_NCCL_LIBRARY)
    file(STRINGS ${KRUG_NCCL_INCLUDE_DIR}/nccl.h _krug_nccl_defs
      REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
    foreach(part MAJOR MINOR PATCH)
      string(REGEX MATCH "NCCL_${part} ([0-9]+)" _m "${_krug_nccl_defs}")
      set(_krug_nccl_${part} ${CMAKE_MATCH_1})
    endforeach()
    set(KRUG_NCCL_VERSION "${_krug_nccl_MAJOR}.${_krug_nccl_MINOR}.${_krug_nccl_PATCH}")
    set(KRUG_NCCL_ENABLED ON)
    add_library(krug_nccl_lib INTERFACE)
    target_include_directories(krug_nccl_lib INTERFACE ${KRUG_NCCL_INCLUDE_DIR})
    target_link_libraries(krug_nccl_lib INTERFACE ${KRUG_NCCL_LIBRARY})
    message(STATUS "krug: NCCL enabled (NCCL ${KRUG_NCCL_VERSION}, ${KRUG_NCCL_LIBRARY})")
  else()
    set(KRUG_NCCL_PROBLEM "nccl.h or libnccl was not found (set KRUG_NCCL_HOME)")
    if(KRUG_WITH_NCCL STREQUAL "ON")
      message(FATAL_ERROR "KRUG_WITH_NCCL=ON but ${KRUG_NCCL_PROBLEM}")
    endif()
    message(STATUS "krug: NCCL not built: ${KRUG_NCCL_PROBLEM}")
  endif()
elseif(KRUG_WITH_NCCL STREQUAL "OFF")
  set(KRUG_NCCL_PROBLEM "disabled (KRUG_WITH_NCCL=OFF)")
else()
  set(KRUG_NCCL_PROBLEM "needs CUDA")
endif()

if(KRUG_NCCL_ENABLED)
  file(GLOB KRUG_NCCL_SOURCES CONFIGURE_DEPENDS
    ${CMAKE_CURRENT_SOURCE_DIR}/src/collectives/nccl/*.cc)
  krug_layer(collectives_nccl FOLDER collectives/nccl SOURCES ${KRUG_NCCL_SOURCES}
    PUBLIC collectives device LIBS fmt::fmt krug_nccl_lib CUDA::cudart)
  list(APPEND KRUG_GPU_LINK krug_nccl_lib)
else()
  krug_layer(collectives_nccl FOLDER collectives/nccl
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/collectives/nccl_absent/nccl_absent.cc
    PUBLIC collectives device LIBS fmt::fmt)
endif()
