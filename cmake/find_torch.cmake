# Finds PyTorch through the Python interpreter that will import krug.torch (Python_EXECUTABLE),
# as torch.utils.cpp_extension does: the same torch for the Python module and the C++ library,
# Debian's (python3-torch, 1.13) or a wheel from PyPI (2.x), with or without CUDA toolkit.
#
# krug_find_torch(<python>) sets, in the caller's scope:
#   KRUG_TORCH_VERSION        the version found ("" when none)
#   KRUG_TORCH_PROBLEM        why the binding cannot be built ("" when it can)
# and when it can, defines the imported target `torch` (headers, libc10/libtorch/libtorch_cpu,
# the C++ ABI torch was built with) and sets KRUG_TORCH_PYTHON_LIBRARY, KRUG_TORCH_LIBRARY_DIR
# KRUG_TORCH_PYBIND11_DEFINITIONS (the ABI tags of torch._C, so pybind11 types of both modules
# interoperate) and KRUG_PYBIND11_HINT (where the interpreter's pybind11 keeps its CMake files).

# The torch releases krug.torch supports: from Debian 12's 1.13 up to, not including, 3.0.
set(KRUG_TORCH_MIN_VERSION 1.13)
set(KRUG_TORCH_VERSION_LIMIT 3.0)

function(krug_find_torch python)
  set(KRUG_TORCH_VERSION "" PARENT_SCOPE)
  krug_query_python(${python} ${CMAKE_CURRENT_LIST_DIR}/query_torch.py json rc)
  string(JSON error ERROR_VARIABLE none GET "${json}" error)
  if(NOT rc EQUAL 0 OR json STREQUAL "" OR error)
    string(CONCAT problem_text "torch is not importable by ${python} (${error}); install "
      "torch into that environment first (pip install torch, or Debian's python3-torch)")
    set(KRUG_TORCH_PROBLEM "${problem_text}" PARENT_SCOPE)
    return()
  endif()
  string(JSON version GET "${json}" version)
  set(KRUG_TORCH_VERSION ${version} PARENT_SCOPE)
  krug_check_framework_version(torch ${version} ${KRUG_TORCH_MIN_VERSION}
    ${KRUG_TORCH_VERSION_LIMIT} problem)
  if(problem)
    set(KRUG_TORCH_PROBLEM "${problem}" PARENT_SCOPE)
    return()
  endif()
  string(JSON abi GET "${json}" cxx11_abi)
  if(NOT abi)
    # libkrug's API passes std::string: both sides must use the same libstdc++ ABI.
    string(CONCAT problem_text "torch ${version} was built with the pre-C++11 libstdc++ ABI "
      "(_GLIBCXX_USE_CXX11_ABI=0); krug needs a torch built with the C++11 ABI (PyPI's since "
      "2.7, Debian's)")
    set(KRUG_TORCH_PROBLEM "${problem_text}" PARENT_SCOPE)
    return()
  endif()

  string(JSON libdir GET "${json}" library_dir)
  foreach(name c10 torch torch_cpu torch_python)
    find_library(KRUG_TORCH_LIB_${name} ${name} PATHS ${libdir} NO_DEFAULT_PATH NO_CACHE)
    if(NOT KRUG_TORCH_LIB_${name})
      set(KRUG_TORCH_PROBLEM "lib${name}.so not found in ${libdir}" PARENT_SCOPE)
      return()
    endif()
  endforeach()

  string(JSON include0 GET "${json}" include_dirs 0)
  string(JSON include1 GET "${json}" include_dirs 1)
  if(NOT TARGET torch)
    add_library(torch INTERFACE IMPORTED GLOBAL)
    # SYSTEM: warnings in torch's headers are not ours.
    set_target_properties(torch PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${include0};${include1}"
      INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${include0};${include1}"
      INTERFACE_LINK_LIBRARIES
        "${KRUG_TORCH_LIB_torch};${KRUG_TORCH_LIB_torch_cpu};${KRUG_TORCH_LIB_c10}"
      INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=1")
    # PyPI's torch bundles fmt's headers (a newer fmt than the system's libfmt), and its include
    # directory comes before the system's: code that includes torch's headers uses that fmt,
    # header-only, so it needs no libfmt of that version (its symbols are in another inline
    # namespace than libkrug's fmt).
    if(EXISTS ${include0}/fmt/format.h)
      set_property(TARGET torch APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS FMT_HEADER_ONLY=1)
    endif()
    # Full debug information about torch's templates nearly doubles the compile time of every
    # file that includes torch's headers (the torch binding's torch_api.cc: 47 s of CPU with -g,
    # 26 s with -g1), the longest part of a first build. In RelWithDebInfo, the default, those
    # files get line tables only (-g1: backtraces name functions, files and lines); a Debug
    # build keeps full -g.
    set_property(TARGET torch APPEND PROPERTY INTERFACE_COMPILE_OPTIONS
      "$<$<AND:$<CONFIG:RelWithDebInfo>,$<COMPILE_LANGUAGE:CXX>>:-g1>")
  endif()
  set(defs TORCH_API_INCLUDE_EXTENSION_H)
  foreach(key COMPILER_TYPE STDLIB BUILD_ABI)
    string(JSON value ERROR_VARIABLE none GET "${json}" pybind11_abi ${key})
    if(value)
      list(APPEND defs "PYBIND11_${key}=\"${value}\"")
    endif()
  endforeach()
  # pybind11's CMake package as the interpreter sees it (PyPI's, in pip's build environment or
  # the project's venv); empty when only the system's (Debian's pybind11-dev) is there.
  string(JSON pybind11_dir ERROR_VARIABLE none GET "${json}" pybind11_cmake_dir)
  set(KRUG_PYBIND11_HINT "${pybind11_dir}" PARENT_SCOPE)
  set(KRUG_TORCH_PYBIND11_DEFINITIONS "${defs}" PARENT_SCOPE)
  set(KRUG_TORCH_PYTHON_LIBRARY ${KRUG_TORCH_LIB_torch_python} PARENT_SCOPE)
  set(KRUG_TORCH_LIBRARY_DIR ${libdir} PARENT_SCOPE)
  set(KRUG_TORCH_PROBLEM "" PARENT_SCOPE)
endfunction()
