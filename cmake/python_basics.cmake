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
