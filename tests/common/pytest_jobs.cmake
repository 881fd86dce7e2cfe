# krug_add_pytest_jobs(<prefix> RANKS <counts...> [TIMEOUT <s>] [LABELS <labels...>]
#                      [ENVIRONMENT <VAR=value...>])
# Adds one ctest entry, <prefix>.<stem>.np<N>, per tests file test_*.py of the current source
# directory and rank count N: the file's tests run inside the ranks of a krugrun job,
#   krugrun -np N <Python_EXECUTABLE> -m pytest -q -x <file>
# Each rank runs the same tests in the same order, so their collectives pair up; a failure on
# one rank stops it (-x) and its shutdown fails the other ranks' pending operations, so nothing
# hangs. krugrun puts build/python on every rank's PYTHONPATH.
#
# RANKS is every file's rank counts unless the calling directory sets KRUG_RANKS_<stem> for
# that file: the counts are chosen per file, because each job costs seconds of interpreter and
# framework start-up per rank on CI's two cores, and a count earns its place only where it runs
# code the others do not (one rank: the lone-rank shortcuts; three: uneven splits, a ring that
# is not a pair).
function(krug_add_pytest_jobs prefix)
  cmake_parse_arguments(arg "" "TIMEOUT" "RANKS;LABELS;ENVIRONMENT" ${ARGN})
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 180)
  endif()
  set(environment PYTHONDONTWRITEBYTECODE=1 ${arg_ENVIRONMENT})
  file(GLOB files CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/test_*.py)
  foreach(file ${files})
    get_filename_component(stem ${file} NAME_WE)
    set(counts ${arg_RANKS})
    if(DEFINED KRUG_RANKS_${stem})
      set(counts ${KRUG_RANKS_${stem}})
    endif()
    foreach(np ${counts})
      set(test ${prefix}.${stem}.np${np})
      add_test(NAME ${test}
        COMMAND $<TARGET_FILE:krugrun> -np ${np} ${Python_EXECUTABLE} -m pytest -q -x ${file}
        WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
      set_tests_properties(${test} PROPERTIES
        TIMEOUT ${arg_TIMEOUT}
        LABELS "${arg_LABELS}"
        ENVIRONMENT "${environment}")
    endforeach()
  endforeach()
endfunction()
