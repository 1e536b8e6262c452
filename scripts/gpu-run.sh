#!/usr/bin/env bash
# Runs the GPU checks and the benchmark on a machine with a GPU, from the repository root
# of a checkout anywhere, with a build folder made by scripts/gpu-build.sh (here, or
# elsewhere and copied here). Writes logs and one results JSON to the output folder.
#
#   scripts/gpu-run.sh [--shapes FILE] [--build DIR] [--out DIR] [STEP...]
#
#   --shapes  benchmark shapes (default bench/shapes.csv); its "# bench-args:" line, if
#             any, adds arguments to flashstep_bench (a filter, --tune)
#   --build   build folder (default $FLASHSTEP_BUILD_DIR or build-gpu)
#   --out     output folder (default <build>/gpu-run)
#   STEP      any of: tests sanitizer bench flashinfer_peers split_kv_tune sampling ncu ncu_split
#             (default: tests sanitizer bench)
#
# A step is the shell function step_NAME below: add one to add a step. `tests` runs CTest's
# `gpu` label, after pointing CTest's files at this checkout and build folder. The bench step
# records this command line, the commit and whether the tree was clean in the JSON; with
# FLASHSTEP_PEERS=sdpa in the environment it times only the SDPA peers, and a second command
# with the same --shapes and --out, `scripts/gpu-run.sh ... flashinfer_peers`, adds
# FlashInfer's to the same results JSON (for a machine that allows no single command that
# long: FlashInfer's kernels compile on first use).
set -uo pipefail
cd "$(dirname "$0")/.."
SHAPES=bench/shapes.csv
BUILD=${FLASHSTEP_BUILD_DIR:-build-gpu}
RESULTS=
steps=()
while (($#)); do
  case $1 in
    --shapes) SHAPES=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --out) RESULTS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) steps+=("$1"); shift ;;
  esac
done
((${#steps[@]})) || steps=(tests sanitizer bench)
# What the results JSON records: this command as run, less --out (where logs go).
build_shown=${BUILD#"$PWD"/}; [[ $build_shown == /* ]] && build_shown=$(basename "$BUILD")
COMMAND="${FLASHSTEP_COMMAND_PREFIX:-}scripts/gpu-run.sh --shapes $SHAPES --build $build_shown ${steps[*]}"
B=$(cd "$BUILD" && pwd) || { echo "gpu-run.sh: no build folder $BUILD (run scripts/gpu-build.sh)" >&2; exit 2; }
RESULTS=${RESULTS:-$B/gpu-run}
mkdir -p "$RESULTS"
export LD_LIBRARY_PATH=$B/bin:${LD_LIBRARY_PATH:-}
# stage 08 opens NCCL at run time: find its runtime, keep NVLink multicast off
source scripts/nccl-env.sh
TESTS=$B/tests/stages/flashstep_stage_tests
# flashstep_bench arguments the shapes file asks for, e.g. "# bench-args: --tune".
BENCH_ARGS=$(sed -n 's/^# bench-args: *//p' "$SHAPES" | head -1)

# CTest's files name the folders the build was configured in (build and source). Where
# this checkout or build folder lives elsewhere (a build copied from another machine),
# rewrite those names to the folders here, once.
relocate_ctest_files() {
  local old_b old_s
  old_b=$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' "$B/CMakeCache.txt")
  old_s=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$B/CMakeCache.txt")
  [ -n "$old_b" ] && [ -n "$old_s" ] || return 0
  [ "$old_b" = "$B" ] && [ "$old_s" = "$PWD" ] && return 0
  echo "CTest files: $old_b -> $B, $old_s -> $PWD"
  find "$B" \( -name CTestTestfile.cmake -o -name '*_include-*.cmake' -o -name '*_tests-*.cmake' \) -print0 |
    xargs -0 sed -i -e "s#$old_b#@FLASHSTEP_BUILD@#g" -e "s#$old_s#@FLASHSTEP_SOURCE@#g" \
                    -e "s#@FLASHSTEP_BUILD@#$B#g" -e "s#@FLASHSTEP_SOURCE@#$PWD#g"
  sed -i -e "s#^CMAKE_CACHEFILE_DIR:INTERNAL=.*#CMAKE_CACHEFILE_DIR:INTERNAL=$B#" \
         -e "s#^CMAKE_HOME_DIRECTORY:INTERNAL=.*#CMAKE_HOME_DIRECTORY:INTERNAL=$PWD#" "$B/CMakeCache.txt"
}

step_tests() {
  relocate_ctest_files
  ( cd "$B" && timeout 300 ctest -L gpu --output-on-failure -j4 --timeout 240 ) > "$RESULTS/tests.log" 2>&1
  echo "tests: rc=$?"; grep -E "tests passed|tests failed|Total Test|\*\*\*Failed|Not Run|Timeout" "$RESULTS/tests.log"
  # Every stage's exercise must build, run and FAIL as shipped (its holes are empty).
  for dir in stages/[0-9][0-9]_*/; do
    ex=flashstep_exercise_$(basename "$dir")
    [ -x "$B/bin/$ex" ] || { echo "$ex: not built (scripts/gpu-build.sh builds every stage's)" | tee -a "$RESULTS/tests.log"; continue; }
    timeout 60 "$B/bin/$ex" > "$RESULTS/exercise.tmp" 2>&1
    echo "$ex as shipped: rc=$? (1 expected): $(tail -1 "$RESULTS/exercise.tmp")" | tee -a "$RESULTS/tests.log"
  done
  rm -f "$RESULTS/exercise.tmp"
}

# compute-sanitizer over every kernel flashstep compiles. memcheck runs each stage's
# sanitizer subset with the kernels/ tests, then the engine's short run (cuBLAS, stage 06,
# POD, CUDA graphs). racecheck runs the same subsets, then the engine's shared-memory
# kernels without cuBLAS (POD attention, on the mixed-step grids), because on an H200 it
# cannot run the engine itself: it reports hazards inside cuBLAS's own kernels
# (nvjet_sm90_*), and with those left out by name (--kernel-name-exclude, below) it faults
# inside the sanitizer ("failed to handle a hardware exception") on the engine's first
# GEMMs. Library kernels are left out of racecheck by a substring of their names; no
# kernel flashstep compiles holds one (tests/docs/test_sanitizer_step.py checks it).
# The engine's elementwise kernels and its argmax are memcheck's only.
RACECHECK_SKIPS=(nvjet xmma cutlass gemm cublas)

step_sanitizer() {
  # Two processes a tool, each with its own limit.
  local subsets=(-tc='*sanitizer*,kernels:*' -tce='09_engine*') engine=(-tc='09_engine: a short run*')
  local pod=(-tc='09_engine mixed step: two calls*,09_engine POD grid*')
  local skips=() failed=0 tool part rc s
  for s in "${RACECHECK_SKIPS[@]}"; do skips+=(--kernel-name-exclude "kns=$s"); done
  for tool in memcheck racecheck; do
    local args=(--tool "$tool" --error-exitcode 3)
    [ "$tool" = racecheck ] && args+=("${skips[@]}")
    for part in subsets engine; do
      if [ "$tool" = racecheck ] && [ $part = engine ]; then local -n cases=pod; else local -n cases=$part; fi
      echo "=== compute-sanitizer ${args[*]} flashstep_stage_tests ${cases[*]}"
      timeout 300 compute-sanitizer "${args[@]}" "$TESTS" "${cases[@]}"
      rc=$?
      echo "=== $tool $part rc=$rc"
      ((rc == 0)) || failed=1
    done
  done > "$RESULTS/sanitizer.log" 2>&1
  grep -E "^=== |ERROR SUMMARY|RACECHECK SUMMARY|test cases:" "$RESULTS/sanitizer.log"
  echo "sanitizer: $( ((failed)) && echo FAIL || echo PASS)"
  return $failed
}

# results.json: bench.json and every peers file of this run, with the command(s) that made them.
merge_results() {
  local peers=(--peers "$RESULTS/peers.json")
  [ -f "$RESULTS/peers_flashinfer.json" ] && peers+=(--peers "$RESULTS/peers_flashinfer.json")
  python3 bench/reports/merge_results.py --bench "$RESULTS/bench.json" "${peers[@]}" --shapes "$SHAPES" \
    --source-state "$B/source-state.txt" --command "$(cat "$RESULTS/command.txt")" --note "${FLASHSTEP_NOTE:-}" \
    --out "$RESULTS/results.json"
}

step_bench() {
  rm -f "$RESULTS/peers_flashinfer.json"  # a new run: no peers of an earlier one
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
  timeout 300 "$B/bin/flashstep_bench" --shapes="$SHAPES" $BENCH_ARGS \
    --benchmark_out="$RESULTS/bench.json" --benchmark_out_format=json > "$RESULTS/bench.log" 2>&1
  echo "bench: rc=$?"
  # bench/peers/attention.py writes its JSON after every shape, so a run cut short by the limit keeps what it measured
  PYTHONUNBUFFERED=1 timeout 420 python3 bench/peers/attention.py --shapes "$SHAPES" --peers "${FLASHSTEP_PEERS:-sdpa,flashinfer}" \
    --out "$RESULTS/peers.json" >> "$RESULTS/bench.log" 2>&1
  echo "peers: rc=$?"
  echo "${FLASHSTEP_PEERS:+FLASHSTEP_PEERS=$FLASHSTEP_PEERS }$COMMAND" > "$RESULTS/command.txt"
  merge_results
  grep -E "median " "$RESULTS/bench.log" | sed -E 's/ +/ /g' | cut -c1-150
}

step_flashinfer_peers() {
  # FlashInfer's peers of a bench step run before with the same --shapes and --out (and
  # FLASHSTEP_PEERS=sdpa), merged into its results.json.
  if [ ! -f "$RESULTS/bench.json" ] || [ ! -f "$RESULTS/command.txt" ]; then
    echo "flashinfer_peers: no bench step in $RESULTS (run it first, with the same --shapes and --out)"; return
  fi
  PYTHONUNBUFFERED=1 timeout 540 python3 bench/peers/attention.py --shapes "$SHAPES" --peers flashinfer --flashinfer-timeout 500 \
    --out "$RESULTS/peers_flashinfer.json" >> "$RESULTS/bench.log" 2>&1
  echo "flashinfer peers: rc=$?"
  echo "$(cat "$RESULTS/command.txt"), then $COMMAND" > "$RESULTS/command.txt"
  merge_results
}

step_split_kv_tune() {
  # Stage 03's knobs (chunk size, CTAs per SM, pipeline depth) and the peers with a clean L2.
  # FLASHSTEP_TUNE_FILTER: a Google Benchmark filter (e.g. a few shapes) for a shorter run.
  timeout 480 "$B/bin/flashstep_split_kv_tune" --shapes="$SHAPES" ${FLASHSTEP_TUNE_FILTER:+--benchmark_filter="$FLASHSTEP_TUNE_FILTER"} \
    --benchmark_out="$RESULTS/tune.json" --benchmark_out_format=json > "$RESULTS/tune.log" 2>&1
  echo "split_kv_tune: rc=$?"
  [ -f "$RESULTS/tune.json" ] && python3 -c 'import json, sys; p = sys.argv[1]; d = json.load(open(p)); d.get("context", {}).pop("executable", None); json.dump(d, open(p, "w"), indent=1)' "$RESULTS/tune.json"
  PYTHONUNBUFFERED=1 timeout 120 python3 bench/peers/attention.py --clean-l2 --shapes "$SHAPES" \
    --out "$RESULTS/clean_l2_peers.json" >> "$RESULTS/tune.log" 2>&1
  echo "clean-L2 peers: rc=$?"
}

step_sampling() {
  # Stage 06's own run (token-equality suite, GPU statistics, sanitizers, sampling bench and
  # peers on bench/shapes_sampling.csv): bench/stages/sampling_run.sh, logs under sampling/.
  bench/stages/sampling_run.sh "$B/bin" "$RESULTS/sampling"
}

step_ncu() {
  # Hardware counters of stage 02 on two shapes of bench/shapes.csv: DRAM throughput, occupancy.
  for shape in b128_kv8192_p16 b16_kv4096_p16; do
    timeout 90 ncu --clock-control none --kernel-name regex:paged_decode --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        "$B/bin/flashstep_bench" --shapes=bench/shapes.csv --sets=target --benchmark_filter="^02_paged/${shape}/"
  done > "$RESULTS/ncu.log" 2>&1
  echo "ncu: rc=$?"; grep -E "DRAM Throughput|Memory Throughput|Achieved Occupancy|Duration|Registers Per" "$RESULTS/ncu.log"
}

step_ncu_split() {
  # Stage 03's kernels at small work (batch 1, kv 1k and 16k; the registry's runner, a graph
  # replay): each kernel's duration, to see where a small call's time goes.
  for shape in b1_kv1024_p16 b1_kv16384_p16; do
    timeout 120 ncu --clock-control none --kernel-name regex:'chunk_decode|merge_states' --launch-skip 6 --launch-count 2 \
        --section SpeedOfLight --section LaunchStats \
        "$B/bin/flashstep_bench" --shapes=bench/shapes_split_kv.csv --benchmark_filter="^03_split_kv/${shape}/"
  done > "$RESULTS/ncu_split.log" 2>&1
  echo "ncu_split: rc=$?"; grep -E "chunk_decode_kernel|merge_states_kernel|Duration|DRAM Throughput" "$RESULTS/ncu_split.log"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv
  nvcc --version | tail -1; python3 -c 'import torch; print("torch", torch.__version__)'
  ldd "$B/bin/flashstep_bench" | grep -E "not found|cublas|cudart|benchmark" | sed "s#$PWD/##"; } > "$RESULTS/device.txt" 2>&1
cat "$RESULTS/device.txt"
status=0
for step in "${steps[@]}"; do
  if declare -F "step_$step" > /dev/null; then "step_$step" || { status=1; echo "gpu-run.sh: step $step failed"; }
  else echo "gpu-run.sh: no step '$step' (steps: $(declare -F | sed -n 's/^declare -f step_//p' | tr '\n' ' '))" >&2; status=2; fi
done
echo "output: $RESULTS"
exit $status
