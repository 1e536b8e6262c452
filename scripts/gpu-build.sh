#!/usr/bin/env bash
# Builds what scripts/gpu-run.sh runs (preset gpu: sm_90a, no Python, no docs) into a
# build folder: the first argument, else $FLASHSTEP_BUILD_DIR, else build-gpu. Copies
# beside the binaries the shared libraries a GPU machine may lack (Debian's Google
# Benchmark, the CUDA runtime they were linked against), so the folder can be built here
# and copied to a GPU machine, and records the commit it was built from and whether the
# tree had changes (source-state.txt, read by bench/reports/merge_results.py). Also builds the C
# library of flashstep.cuda and copies it, with the CUDA runtime and source-state.txt,
# into <folder>-python/ (build-gpu-python/): all that scripts/gpu-python.sh needs.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-${FLASHSTEP_BUILD_DIR:-build-gpu}}
cmake --preset gpu -B "$BUILD" > /dev/null
# Every stage's exercise and every tuning program, found in the build system rather than
# listed here, so a new stage folder (with its flashstep_exercise_NN_name target) or a
# new bench/stages/*_tune program is built without editing this script.
available=$(cmake --build "$BUILD" --target help | grep -oE '\bflashstep_[A-Za-z0-9_]+\b' | sort -u)
# Every test program of the `gpu` CTest label (the stage suite and any other GPU suite a
# stage adds: flashstep_*_tests and *_gpu targets), less the CPU-only suites.
mapfile -t targets < <(grep -E '^flashstep_[A-Za-z0-9_]+_tests$|_gpu$' <<< "$available" |
                       grep -vxE 'flashstep_(reference|statistics|engine)_tests' || true)
# Every benchmark program (flashstep_bench, and any a stage adds, such as stage 06's).
mapfile -t benches < <(grep -E '^flashstep_[A-Za-z0-9_]*bench$' <<< "$available" || true)
targets+=("${benches[@]}")
for dir in stages/[0-9][0-9]_*/; do
  exercise=flashstep_exercise_$(basename "$dir")
  if grep -qx "$exercise" <<< "$available"; then
    targets+=("$exercise")
  else
    echo "gpu-build.sh: stage $(basename "$dir") has no $exercise target" >&2
  fi
done
# the stage exercises' solutions, which the gpu tests of tests/exercises run beside them
if grep -qx flashstep_exercise_stage_solutions <<< "$available"; then targets+=(flashstep_exercise_stage_solutions); fi
mapfile -t tuners < <(grep -E '_tune$' <<< "$available" || true)
targets+=("${tuners[@]}")
# The C interface that the Python layer flashstep.cuda loads (scripts/gpu-python.sh).
if grep -qx flashstep_capi <<< "$available"; then targets+=(flashstep_capi); fi
# the flashstep command, which notebook 11 runs (`flashstep validate --quick`) on a GPU
if grep -qx flashstep_cli <<< "$available"; then targets+=(flashstep_cli); fi
echo "building: ${targets[*]}"
start=$(date +%s)
cmake --build "$BUILD" -j"${FLASHSTEP_JOBS:-2}" --target "${targets[@]}"
echo "build time: $(( $(date +%s) - start )) s"
echo "GPU tests: $(ctest --test-dir "$BUILD" -N -L gpu | sed -n 's/^Total Tests: //p')"
cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian "$BUILD/bin/"
cp -L "$(ldconfig -p | awk '/libcudart.so.13 /{print $NF; exit}' || true)" "$BUILD/bin/" 2>/dev/null ||
  cp -L /usr/local/cuda/lib64/libcudart.so.13 "$BUILD/bin/"
# What these binaries were built from: a results JSON names it, and says "modified" when
# the tree (tracked or untracked files) differed from the commit.
{ echo "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  if ! git rev-parse --git-dir > /dev/null 2>&1; then echo "tree=unknown"
  elif [ -z "$(git status --porcelain)" ]; then echo "tree=clean"
  else echo "tree=modified"; git status --porcelain | sed 's/^/modified /'; fi
} > "$BUILD/source-state.txt"
cat "$BUILD/source-state.txt"
# What scripts/gpu-python.sh needs, and nothing else, in a folder small enough to carry
# to a GPU machine beside the working tree: the C library, the CUDA runtime its RPATH
# ($ORIGIN) finds beside it, the flashstep command and the source state.
if [ -f "$BUILD/bin/libflashstep_capi.so" ]; then
  rm -rf "$BUILD-python" && mkdir -p "$BUILD-python"
  cp "$BUILD/bin/libflashstep_capi.so" "$BUILD/bin/libcudart.so.13" "$BUILD/source-state.txt" "$BUILD-python/"
  [ -f "$BUILD/bin/flashstep" ] && cp "$BUILD/bin/flashstep" "$BUILD-python/"
  du -sh "$BUILD-python"
fi
du -sh "$BUILD"
