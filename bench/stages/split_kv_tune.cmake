# flashstep_split_kv_tune: stage 03's knobs (pipeline depth, PDL, planner occupancy,
# minimum chunk, CUDA graph replay) timed with the same harness as flashstep_bench.
# Included from bench/CMakeLists.txt.
add_executable(flashstep_split_kv_tune stages/split_kv_tune.cpp stages/split_kv_flush.cu stages/device_fill.cu
               stages/shapes.cpp stages/timing.cpp)
target_include_directories(flashstep_split_kv_tune PRIVATE ${bench_dirs})
target_link_libraries(flashstep_split_kv_tune PRIVATE flashstep::stages benchmark::benchmark)
set_target_properties(flashstep_split_kv_tune PROPERTIES
  RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin
  BUILD_RPATH "$ORIGIN")
