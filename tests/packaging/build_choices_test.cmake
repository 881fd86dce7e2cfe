# cmake -P: the framework version check (cmake/build_env.cmake) names the version and the
# supported range; KRUG_WITH_* / HOROVOD_WITHOUT_* (cmake/build_env.cmake) set the options.
include(${KRUG_SOURCE_DIR}/cmake/find_torch.cmake)
include(${KRUG_SOURCE_DIR}/cmake/build_env.cmake)

function(expect_eq actual expected what)
  if(NOT "${actual}" STREQUAL "${expected}")
    message(FATAL_ERROR "${what}: got '${actual}', expected '${expected}'")
  endif()
endfunction()

foreach(good 1.13.0 1.13.1 2.0.0 2.15.0 2.99.1)
  krug_check_framework_version(torch ${good} ${KRUG_TORCH_MIN_VERSION}
    ${KRUG_TORCH_VERSION_LIMIT} problem)
  expect_eq("${problem}" "" "torch ${good}")
endforeach()
foreach(bad 1.12.1 3.0.0)
  krug_check_framework_version(torch ${bad} ${KRUG_TORCH_MIN_VERSION}
    ${KRUG_TORCH_VERSION_LIMIT} problem)
  expect_eq("${problem}"
    "torch ${bad} is not supported: krug supports torch 1.13 or newer, older than 3.0"
    "torch ${bad}")
endforeach()

set(KRUG_BUILD_TORCH AUTO)
set(ENV{HOROVOD_WITH_PYTORCH} 1)
krug_apply_env_choice(KRUG_BUILD_TORCH PYTORCH)
expect_eq(${KRUG_BUILD_TORCH} ON "HOROVOD_WITH_PYTORCH=1")
unset(ENV{HOROVOD_WITH_PYTORCH})

set(KRUG_BUILD_TORCH AUTO)
set(ENV{KRUG_WITHOUT_PYTORCH} 1)
krug_apply_env_choice(KRUG_BUILD_TORCH PYTORCH)
expect_eq(${KRUG_BUILD_TORCH} OFF "KRUG_WITHOUT_PYTORCH=1")
unset(ENV{KRUG_WITHOUT_PYTORCH})

set(KRUG_BUILD_TENSORFLOW AUTO)
set(ENV{HOROVOD_WITH_TENSORFLOW} 1)
krug_apply_env_choice(KRUG_BUILD_TENSORFLOW TENSORFLOW)
expect_eq(${KRUG_BUILD_TENSORFLOW} ON "HOROVOD_WITH_TENSORFLOW=1")
unset(ENV{HOROVOD_WITH_TENSORFLOW})

set(KRUG_BUILD_TENSORFLOW AUTO)
set(ENV{KRUG_WITHOUT_TENSORFLOW} 1)
krug_apply_env_choice(KRUG_BUILD_TENSORFLOW TENSORFLOW)
expect_eq(${KRUG_BUILD_TENSORFLOW} OFF "KRUG_WITHOUT_TENSORFLOW=1")
unset(ENV{KRUG_WITHOUT_TENSORFLOW})

set(KRUG_BUILD_JAX AUTO)
set(ENV{HOROVOD_WITH_JAX} 1)
krug_apply_env_choice(KRUG_BUILD_JAX JAX)
expect_eq(${KRUG_BUILD_JAX} ON "HOROVOD_WITH_JAX=1")
unset(ENV{HOROVOD_WITH_JAX})

set(KRUG_BUILD_JAX AUTO)
set(ENV{KRUG_WITHOUT_JAX} 1)
krug_apply_env_choice(KRUG_BUILD_JAX JAX)
expect_eq(${KRUG_BUILD_JAX} OFF "KRUG_WITHOUT_JAX=1")
unset(ENV{KRUG_WITHOUT_JAX})

set(KRUG_WITH_MPI AUTO)
set(ENV{HOROVOD_WITHOUT_MPI} 1)
krug_apply_env_choice(KRUG_WITH_MPI MPI)
expect_eq(${KRUG_WITH_MPI} OFF "HOROVOD_WITHOUT_MPI=1")
set(ENV{HOROVOD_WITHOUT_MPI} 0)
set(KRUG_WITH_MPI AUTO)
krug_apply_env_choice(KRUG_WITH_MPI MPI)
expect_eq(${KRUG_WITH_MPI} AUTO "HOROVOD_WITHOUT_MPI=0 changes nothing")
message(STATUS "build choices: all checks passed")
