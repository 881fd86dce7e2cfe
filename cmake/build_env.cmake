# What to build, chosen by environment variables as Horovod's `pip install` does: pip passes no
# CMake arguments, so KRUG_WITH_<X>=1 / KRUG_WITHOUT_<X>=1 (and Horovod's HOROVOD_WITH_<X> /
# HOROVOD_WITHOUT_<X>) say whether part <X> must be built or must be left out.
#   PYTORCH  the torch binding (KRUG_BUILD_TORCH)     MPI  the MPI backend (KRUG_WITH_MPI)
#   TENSORFLOW  the TensorFlow and Keras binding (KRUG_BUILD_TENSORFLOW)
#   JAX      the JAX binding (KRUG_BUILD_JAX)
#   GLOO     always built (krug's TCP data plane); WITHOUT_GLOO is an error
#   MXNET: no binding; WITH_MXNET is an error, WITHOUT_MXNET is accepted

# The value of a WITH/WITHOUT switch: whether KRUG_<kind>_<part> or HOROVOD_<kind>_<part> is set
# to something other than empty or 0.
function(_krug_env_switch kind part out_var out_name)
  set(${out_var} OFF PARENT_SCOPE)
  foreach(prefix KRUG HOROVOD)
    set(name ${prefix}_${kind}_${part})
    if(DEFINED ENV{${name}} AND NOT "$ENV{${name}}" MATCHES "^(0|)$")
      set(${out_var} ON PARENT_SCOPE)
      set(${out_name} ${name} PARENT_SCOPE)
      return()
    endif()
  endforeach()
endfunction()

# Sets the normalized option `var` (ON, OFF or AUTO) from KRUG_WITH_<part> / KRUG_WITHOUT_<part>
# (or HOROVOD_...). A switch that contradicts an explicit -D<var> is an error.
function(krug_apply_env_choice var part)
  _krug_env_switch(WITH ${part} with with_name)
  _krug_env_switch(WITHOUT ${part} without without_name)
  if(with AND without)
    message(FATAL_ERROR "krug: both ${with_name} and ${without_name} are set; unset one")
  endif()
  if(NOT with AND NOT without)
    return()
  endif()
  if(with)
    set(wanted ON)
    set(name ${with_name})
  else()
    set(wanted OFF)
    set(name ${without_name})
  endif()
  if(NOT ${var} STREQUAL "AUTO" AND NOT ${var} STREQUAL wanted)
    message(FATAL_ERROR "krug: ${name} is set, but ${var}=${${var}}; unset one of them")
  endif()
  message(STATUS "krug: ${var}=${wanted} (${name})")
  set(${var} ${wanted} PARENT_SCOPE)
endfunction()

# Normalizes the AUTO/ON/OFF option `var` (a framework binding's: KRUG_BUILD_TENSORFLOW, ...) to
# ON, OFF or AUTO, then applies KRUG_WITH_<part> / KRUG_WITHOUT_<part> to it.
function(krug_build_choice var part)
  string(TOUPPER "${${var}}" value)
  if(value MATCHES "^(ON|YES|TRUE|Y|1)$")
    set(value ON)
  elseif(value MATCHES "^(OFF|NO|FALSE|N|0)$")
    set(value OFF)
  elseif(NOT value STREQUAL "AUTO")
    message(FATAL_ERROR "${var} must be ON, OFF or AUTO, not '${${var}}'")
  endif()
  set(${var} ${value})
  krug_apply_env_choice(${var} ${part})
  set(${var} ${${var}} PARENT_SCOPE)
endfunction()

# Sets out_problem to a message that names the version found and the supported range, or to ""
# when the version is supported (every binding's CMake uses it, so it lives here, not with one).
function(krug_check_framework_version framework version min limit out_problem)
  if(version VERSION_LESS min OR NOT version VERSION_LESS limit)
    string(CONCAT problem_text "${framework} ${version} is not supported: krug supports "
      "${framework} ${min} or newer, older than ${limit}")
    set(${out_problem} "${problem_text}" PARENT_SCOPE)
  else()
    set(${out_problem} "" PARENT_SCOPE)
  endif()
endfunction()

# Runs cmake/<script> (a query that prints JSON, with an "error" key when the framework is not
# importable) with `python`. Under pip's build isolation PYTHONPATH hides the environment's
# frameworks: when the first answer is an error, it asks again without pip's PYTHONPATH and
# PYTHONNOUSERSITE. Sets out_json and out_rc (the script's exit status).
function(krug_query_python python script out_json out_rc)
  execute_process(COMMAND ${python} ${script} OUTPUT_VARIABLE json ERROR_QUIET
    RESULT_VARIABLE rc)
  string(JSON error ERROR_VARIABLE none GET "${json}" error)
  if(NOT rc EQUAL 0 OR error)
    execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH
      --unset=PYTHONNOUSERSITE ${python} ${script}
      OUTPUT_VARIABLE json ERROR_QUIET RESULT_VARIABLE rc)
    string(JSON error ERROR_VARIABLE none GET "${json}" error)
    if(rc EQUAL 0 AND NOT error)
      get_filename_component(name ${script} NAME)
      message(STATUS "krug: ${name} found its framework outside the build's isolated environment")
    endif()
  endif()
  set(${out_json} "${json}" PARENT_SCOPE)
  set(${out_rc} ${rc} PARENT_SCOPE)
endfunction()

# The parts krug has no choice about: Gloo is always built; bindings that do not exist yet.
_krug_env_switch(WITHOUT GLOO without name)
if(without)
  message(FATAL_ERROR "krug: ${name} is set, but krug cannot be built without Gloo: it is the "
    "data plane across hosts (install libgloo-dev)")
endif()
_krug_env_switch(WITH MXNET with name)
if(with)
  message(FATAL_ERROR "krug: ${name} is set, but krug has no MXNet binding (PyTorch's, "
    "TensorFlow's and JAX's); unset it")
endif()
