# One exercise, proven both ways: the program built from the shipped exercise must FAIL
# (exit 1, a line starting with FAIL), the one built with its solution must PASS (exit 0,
# a line starting with PASS). A program that cannot run here (exit 77: no GPU) makes the
# test print SKIPPED, which its SKIP_REGULAR_EXPRESSION turns into a skip.
#   cmake -DATTEMPT=<program> -DSOLUTION=<program> -P check_exercise.cmake
if(NOT EXISTS "${ATTEMPT}")
  message(FATAL_ERROR "${ATTEMPT} is not built")
endif()
if(NOT EXISTS "${SOLUTION}")
  message("SKIPPED: ${SOLUTION} is not built (build target flashstep_exercise_stage_solutions; "
          "scripts/gpu-build.sh builds it)")
  return()
endif()
foreach(kind ATTEMPT SOLUTION)
  execute_process(COMMAND ${${kind}} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  message("---- ${kind}: ${${kind}} (exit ${rc})\n${out}${err}")
  if(rc EQUAL 77)
    message("SKIPPED: the exercise cannot run here (its reason is above)")
    return()
  endif()
  if(kind STREQUAL "ATTEMPT" AND NOT (rc EQUAL 1 AND out MATCHES "(^|\n)FAIL"))
    message(FATAL_ERROR "the exercise as shipped should FAIL with exit code 1")
  endif()
  if(kind STREQUAL "SOLUTION" AND NOT (rc EQUAL 0 AND out MATCHES "(^|\n)PASS"))
    message(FATAL_ERROR "the exercise with its solution should PASS with exit code 0")
  endif()
endforeach()
