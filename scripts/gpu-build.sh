#!/usr/bin/env bash
# Builds what the GPU machine runs into build-gpu/ (preset gpu: sm_90a, no Python, no
# docs) and places beside the binaries the shared libraries the GPU image lacks
# (Debian's Google Benchmark, and the CUDA runtime the binaries were linked against),
# so `run` can carry build-gpu/ alone. Prints the CUDA build time and the carry size.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset gpu > /dev/null
# Every stage's exercise and every tuning program, found in the build system rather than
# listed here, so a new stage folder (with its flashstep_exercise_NN_name target) or a
# new bench/*_tune program is built without editing this script.
available=$(cmake --build build-gpu --target help | grep -oE '\bflashstep_[A-Za-z0-9_]+\b' | sort -u)
targets=(flashstep_stage_tests flashstep_bench)
for dir in stages/[0-9][0-9]_*/; do
  exercise=flashstep_exercise_$(basename "$dir")
  if grep -qx "$exercise" <<< "$available"; then
    targets+=("$exercise")
  else
    echo "gpu-build.sh: stage $(basename "$dir") has no $exercise target" >&2
  fi
done
mapfile -t tuners < <(grep -E '_tune$' <<< "$available" || true)
targets+=("${tuners[@]}")
echo "building: ${targets[*]}"
start=$(date +%s)
cmake --build build-gpu -j2 --target "${targets[@]}"
echo "build time: $(( $(date +%s) - start )) s"
cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian build-gpu/bin/
cp -L "$(ldconfig -p | awk '/libcudart.so.13 /{print $NF; exit}' || true)" build-gpu/bin/ 2>/dev/null ||
  cp -L /usr/local/cuda/lib64/libcudart.so.13 build-gpu/bin/
du -sh build-gpu
