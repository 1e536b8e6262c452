# Builds the GPU stage exercises' solutions (target flashstep_exercise_stage_solutions)
# where a GPU can run them; elsewhere says SKIPPED rather than spending minutes of nvcc.
#   cmake -DBUILD_DIR=<build> -P build_stage_solutions.cmake
if(NOT EXISTS /dev/nvidiactl AND NOT EXISTS /dev/nvidia0)
  message("SKIPPED: no NVIDIA GPU here, so the stage exercises' solutions are not built")
  return()
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target flashstep_exercise_stage_solutions
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building flashstep_exercise_stage_solutions failed")
endif()
