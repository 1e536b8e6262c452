#!/usr/bin/env bash
# Builds what the GPU machine runs into build-gpu/ (preset gpu: sm_90a, no Python, no
# docs) and places beside the binaries the shared libraries the GPU image lacks
# (Debian's Google Benchmark, and the CUDA runtime the binaries were linked against),
# so `run` can carry build-gpu/ alone. Prints the CUDA build time and the carry size.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset gpu > /dev/null
start=$(date +%s)
cmake --build build-gpu -j2 --target flashstep_stage_tests flashstep_bench \
  flashstep_exercise_01_naive flashstep_exercise_02_paged
echo "build time: $(( $(date +%s) - start )) s"
cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian build-gpu/bin/
cp -L "$(ldconfig -p | awk '/libcudart.so.13 /{print $NF; exit}' || true)" build-gpu/bin/ 2>/dev/null ||
  cp -L /usr/local/cuda/lib64/libcudart.so.13 build-gpu/bin/
du -sh build-gpu
