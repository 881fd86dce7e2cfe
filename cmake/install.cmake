# Install rules: `cmake --install build --prefix P` gives C++ users
#   P/include/krug/*.h                    the API (torch.h only when the binding was built)
#   P/lib/libkrug.so, libkrug_torch.so     the core and the LibTorch binding
#   P/lib/cmake/krug/krugConfig.cmake      find_package(krug CONFIG): krug::krug, krug::torch
#   P/lib/pkgconfig/krug.pc                pkg-config --cflags --libs krug
#   P/bin/krugrun                          the launcher
#   P/lib/pythonX.Y/site-packages/krug     the Python package (when Python was found)
# Under pip (scikit-build-core sets SKBUILD) the same tree goes inside the package directory
# site-packages/krug, so the wheel is self-contained: krug/lib, krug/include, krug/bin/krugrun
# (started by the `krugrun` console script), krug/lib/cmake/krug.
include(CMakePackageConfigHelpers)
if(SKBUILD)
  set(CMAKE_INSTALL_LIBDIR krug/lib)
  set(CMAKE_INSTALL_INCLUDEDIR krug/include)
  set(CMAKE_INSTALL_BINDIR krug/bin)
  set(KRUG_INSTALL_PYTHONDIR .)
endif()
include(GNUInstallDirs)
if(NOT DEFINED KRUG_INSTALL_PYTHONDIR AND Python_FOUND)
  set(KRUG_INSTALL_PYTHONDIR
    ${CMAKE_INSTALL_LIBDIR}/python${Python_VERSION_MAJOR}.${Python_VERSION_MINOR}/site-packages)
endif()
set(KRUG_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/krug)

# Run paths relative to each file's own directory, so the tree can be moved (and a wheel
# installed anywhere); system libraries (Gloo, OpenSSL, fmt, MPI) come from the system.
function(krug_relative_rpath out from_dir)
  file(RELATIVE_PATH rel /prefix/${from_dir} /prefix/${CMAKE_INSTALL_LIBDIR})
  set(${out} "$ORIGIN/${rel}" PARENT_SCOPE)
endfunction()
krug_relative_rpath(krugrun_rpath ${CMAKE_INSTALL_BINDIR})
set_target_properties(krugrun PROPERTIES INSTALL_RPATH "${krugrun_rpath}")

install(TARGETS krug EXPORT krugTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS krugrun RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/krug DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h" PATTERN "torch.h" EXCLUDE)
install(FILES ${KRUG_GENERATED_DIR}/include/krug/version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/krug)

if(KRUG_TORCH_ENABLED)
  # libtorch*.so: torch's own directory. In a wheel, torch is a sibling package in
  # site-packages; elsewhere the directory it was built against.
  if(SKBUILD)
    set(torch_rpath "$ORIGIN/../../torch/lib")
  else()
    set(torch_rpath "${KRUG_TORCH_LIBRARY_DIR}")
  endif()
  set_target_properties(krug_torch PROPERTIES EXPORT_NAME torch
    INSTALL_RPATH "$ORIGIN;${torch_rpath}")
  install(TARGETS krug_torch EXPORT krugTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(FILES ${CMAKE_SOURCE_DIR}/include/krug/torch.h
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/krug)
endif()

# The CMake package. krug::torch needs the consumer's `torch` target (find_package(Torch));
# krugConfig.cmake finds it when the consumer has not.
install(EXPORT krugTargets NAMESPACE krug:: DESTINATION ${KRUG_INSTALL_CMAKEDIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/templates/krugConfig.cmake.in
  ${CMAKE_BINARY_DIR}/krugConfig.cmake INSTALL_DESTINATION ${KRUG_INSTALL_CMAKEDIR})
# 0.x: a minor release may change the API.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/krugConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/krugConfig.cmake ${CMAKE_BINARY_DIR}/krugConfigVersion.cmake
  DESTINATION ${KRUG_INSTALL_CMAKEDIR})

# pkg-config, for builds without CMake (the framework-free API). The prefix is found from the
# file's own place (pkg-config's pcfiledir), as `cmake --install --prefix` may move the tree.
file(RELATIVE_PATH KRUG_PC_PREFIX_FROM_PCDIR /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
configure_file(${CMAKE_CURRENT_LIST_DIR}/templates/krug.pc.in ${CMAKE_BINARY_DIR}/krug.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/krug.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The Python package: the sources, the build information with install paths, the modules.
if(DEFINED KRUG_INSTALL_PYTHONDIR)
  install(DIRECTORY ${CMAKE_SOURCE_DIR}/python/krug DESTINATION ${KRUG_INSTALL_PYTHONDIR}
    FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
  file(RELATIVE_PATH krugrun_from_package /prefix/${KRUG_INSTALL_PYTHONDIR}/krug
    /prefix/${CMAKE_INSTALL_BINDIR}/krugrun)
  file(RELATIVE_PATH libkrug_from_package /prefix/${KRUG_INSTALL_PYTHONDIR}/krug
    /prefix/${CMAKE_INSTALL_LIBDIR}/libkrug.so)
  krug_write_python_build_info(${CMAKE_BINARY_DIR}/install-python/_build_info.py
    ${krugrun_from_package} ${libkrug_from_package})
  install(FILES ${CMAKE_BINARY_DIR}/install-python/_build_info.py
    DESTINATION ${KRUG_INSTALL_PYTHONDIR}/krug)
  # Each compiled module of the package finds libkrug.so relative to its own directory; the
  # TensorFlow op library finds TensorFlow's libraries through the interpreter's tensorflow
  # package, loaded before it; the JAX FFI handler library links only libkrug.
  foreach(module _torch_core:torch _tensorflow_ops:tensorflow _jax_ops:jax _basics:common)
    string(REPLACE ":" ";" module ${module})
    list(GET module 0 target)
    list(GET module 1 subdir)
    if(TARGET ${target})
      krug_relative_rpath(module_rpath ${KRUG_INSTALL_PYTHONDIR}/krug/${subdir})
      set_target_properties(${target} PROPERTIES INSTALL_RPATH "${module_rpath}")
      install(TARGETS ${target} LIBRARY DESTINATION ${KRUG_INSTALL_PYTHONDIR}/krug/${subdir})
    endif()
  endforeach()
endif()
