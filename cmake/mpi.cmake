# The MPI backend (src/collectives/mpi): KRUG_CPU_OPERATIONS=mpi, and init() under a plain
# `mpirun`. KRUG_WITH_MPI (AUTO, ON, OFF): AUTO builds it when MPI's C bindings are found
# (Debian: libopenmpi-dev) and says so otherwise; ON fails the configuration instead.
# KRUG_WITH_MPI=1 / KRUG_WITHOUT_MPI=1 in the environment do the same (cmake/build_env.cmake).
#
# Without it, src/collectives/mpi_absent/mpi_absent.cc stands in: the same functions, each throwing an
# error that says how to get the backend, so the engine and init() need no #ifdef.
# Sets KRUG_MPI_ENABLED and, when enabled, KRUG_MPIEXEC (mpirun) and KRUG_MPIRUN_ENV for the
# tests.

set(KRUG_MPI_ENABLED OFF)
string(TOUPPER "${KRUG_WITH_MPI}" KRUG_WITH_MPI)
if(KRUG_WITH_MPI MATCHES "^(ON|YES|TRUE|Y|1)$")
  set(KRUG_WITH_MPI ON)
elseif(KRUG_WITH_MPI MATCHES "^(OFF|NO|FALSE|N|0)$")
  set(KRUG_WITH_MPI OFF)
elseif(NOT KRUG_WITH_MPI STREQUAL "AUTO")
  message(FATAL_ERROR "KRUG_WITH_MPI must be ON, OFF or AUTO, not '${KRUG_WITH_MPI}'")
endif()
krug_apply_env_choice(KRUG_WITH_MPI MPI)

if(KRUG_WITH_MPI STREQUAL "OFF")
  message(STATUS "krug: MPI backend disabled (KRUG_WITH_MPI=OFF)")
else()
  # FindMPI looks only for the bindings of enabled languages; krug calls MPI's C API.
  enable_language(C)
  find_package(MPI QUIET COMPONENTS C)
  if(MPI_C_FOUND AND MPIEXEC_EXECUTABLE)
    set(KRUG_MPI_ENABLED ON)
    set(KRUG_MPIEXEC ${MPIEXEC_EXECUTABLE})
    # For tests that run mpirun directly: it refuses to run as root (containers) unless told;
    # these tell it, and change nothing for other users. (krugrun --mpi and krug_mpirun_tests
    # pass --allow-run-as-root themselves when root.)
    set(KRUG_MPIRUN_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
    # Open MPI 4 keeps every job's session directory under one directory per user
    # (/tmp/ompi.<host>.<uid>), which a job that ends removes: a job starting at that moment
    # fails to create its own (open-mpi/ompi#8510), as ctest -j starts mpirun jobs side by
    # side. krug_mpi_session_env(TEST VAR): VAR, the environment entry that gives the test's
    # jobs a directory of their own. (The gtest binaries' jobs get one from krugrun_process.h.)
    function(krug_mpi_session_env test_name out_var)
      set(dir ${CMAKE_BINARY_DIR}/ompi-session/${test_name})
      file(MAKE_DIRECTORY ${dir})
      set(${out_var} "OMPI_MCA_orte_tmpdir_base=${dir}" PARENT_SCOPE)
    endfunction()
    message(STATUS "krug: MPI backend enabled (MPI ${MPI_C_VERSION}, ${MPIEXEC_EXECUTABLE})")
  elseif(KRUG_WITH_MPI STREQUAL "ON")
    message(FATAL_ERROR "KRUG_WITH_MPI=ON but MPI's C bindings or mpirun were not found. "
      "Install libopenmpi-dev and openmpi-bin (scripts/install-deps) or configure with "
      "-DKRUG_WITH_MPI=OFF.")
  else()
    message(STATUS "krug: MPI backend not built: MPI not found (install libopenmpi-dev and "
      "openmpi-bin)")
  endif()
endif()

# The layer krug_collectives_mpi: src/collectives/mpi's headers (mpi_backend.h) either way, and
# its sources or mpi_absent.cc's.
if(KRUG_MPI_ENABLED)
  file(GLOB KRUG_MPI_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/collectives/mpi/*.cc)
  krug_layer(collectives_mpi FOLDER collectives/mpi SOURCES ${KRUG_MPI_SOURCES}
    PUBLIC collectives LIBS fmt::fmt MPI::MPI_C)
  # mpi.h compiled as C++ would pull in MPI's long-deprecated C++ bindings (and need their
  # library); krug uses the C API only.
  target_compile_definitions(krug_collectives_mpi PRIVATE OMPI_SKIP_MPICXX MPICH_SKIP_MPICXX)
  # MPI's headers and library stay private to libkrug: only src/collectives/mpi/ includes
  # mpi.h, and its interface (mpi_backend.h) names no MPI type, so nothing else needs MPI to
  # compile and no #ifdef is needed (mpi_absent.cc has the same functions).
  set(KRUG_MPI_LINK MPI::MPI_C)
else()
  krug_layer(collectives_mpi FOLDER collectives/mpi
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/collectives/mpi_absent/mpi_absent.cc
    PUBLIC collectives LIBS fmt::fmt)
  set(KRUG_MPI_LINK "")
endif()
