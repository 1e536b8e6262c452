#!/usr/bin/env bash
# The FP8 KV cache on a GPU machine, from the repository root, with the build folder that
# scripts/gpu-build.sh made (it builds nothing): the conversion test, the FP8 grids of the
# stage suite, compute-sanitizer on the FP8 subset, the decode tests stages 02 and 03 had
# before (their loop now also serves FP8), and the FP8 benchmark rows with the bf16 rows
# and FlashInfer's FP8 rows of the same shapes in the same run. Prints a PASS/FAIL table
# last, after the FP8 table of bench/reports/fp8_report.py.
#
#   scripts/gpu-fp8.sh [--build DIR] [--out DIR] [STEP...]
#
#   --build  build folder (default $FLASHSTEP_BUILD_DIR or build-gpu)
#   --out    where logs and JSON go (default <build>/gpu-fp8)
#   STEP     any of: tests sanitizer regression bench bench_prefill peers report (default: all)
#
#   tests       flashstep_stage_tests -tc='fp8 conversions*,decode fp8*,split_kv fp8*,04_tensor_core fp8*,
#               append:*,run scales*' and the host cases about FP8 (suite host): bit-for-bit
#               conversions, the FP8 grids of stages 02, 03 and 04, forced splits with partial
#               states, a graph replay, the FP8 append against the reference's encoder, one
#               plan serving runs with other scales (DeviceBatch's k_scale / v_scale)
#   sanitizer   memcheck and racecheck on 'decode fp8: sanitizer subset', the conversions and
#               (memcheck) the append
#   regression  the decode tests of stages 02 and 03 that existed before FP8 (bf16/f16/f32)
#   bench       flashstep_bench on bench/shapes_fp8.csv (stages 02, 03 and 04, ceilings), JSON
#   bench_prefill  flashstep_bench on bench/shapes_fp8_prefill.csv (stage 04: append and
#               prefill on FP8 pools beside bf16), JSON
#   peers       bench/peers/attention.py --peers flashinfer on the same shapes (sources
#               $FLASHINFER_BUNDLE/install.sh first when FLASHINFER_BUNDLE is set)
#   report      bench/reports/fp8_report.py: the table and the speed goals, from the JSON files; writes
#               fp8_results.json (rows and goals, in the results files' one shape) and
#               fp8_table.md (the chapter's table)
#
# Each step is bounded (tests 420 s, sanitizer 450 s, regression 420 s, bench 300 s,
# bench_prefill 200 s, peers 540 s); to stay within a 10-minute command run them in two or
# three calls with the same --out, e.g. `tests sanitizer`, then `regression`, then `bench
# bench_prefill peers report`. The exit status is 0 when every step run passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
BUILD=${FLASHSTEP_BUILD_DIR:-build-gpu}
RESULTS=
steps=()
while (($#)); do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --out) RESULTS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) steps+=("$1"); shift ;;
  esac
done
((${#steps[@]})) || steps=(tests sanitizer regression bench bench_prefill peers report)
B=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "gpu-fp8.sh: no build folder $BUILD (run scripts/gpu-build.sh)" >&2; exit 2; }
RESULTS=${RESULTS:-$B/gpu-fp8}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
export LD_LIBRARY_PATH=$B/bin:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
# the bench JSON's context names the commit the binaries were built from (and a modified tree)
if [ -z "${FLASHSTEP_COMMIT:-}" ] && [ -f "$B/source-state.txt" ]; then
  FLASHSTEP_COMMIT=$(sed -n 's/^commit=//p' "$B/source-state.txt")
  grep -q '^tree=clean' "$B/source-state.txt" || FLASHSTEP_COMMIT="$FLASHSTEP_COMMIT (tree not clean)"
  export FLASHSTEP_COMMIT
fi
TESTS=$B/tests/stages/flashstep_stage_tests
SHAPES=bench/shapes_fp8.csv
FP8_CASES='fp8 conversions*,decode fp8*,split_kv fp8*,04_tensor_core fp8*,append:*,run scales*,*FP8*,tolerance table*'
declare -A verdict

# step NAME SECONDS COMMAND...: runs COMMAND under a time limit, its output to NAME.log
# (appended: a step may run several commands), and records PASS or FAIL (rc) for NAME.
step() {
  local name=$1 limit=$2 rc
  shift 2
  echo "== $name: $*" >> "$RESULTS/$name.log"
  timeout "$limit" "$@" >> "$RESULTS/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then
    [ "${verdict[$name]:-PASS}" = PASS ] && verdict[$name]=PASS
  else
    verdict[$name]="FAIL (rc $rc)"
  fi
  echo "$name: rc=$rc ($*)"
  grep -E "test cases:|ERROR SUMMARY|RACECHECK SUMMARY" "$RESULTS/$name.log" | tail -2
}

step_tests() {
  [ -x "$TESTS" ] || { verdict[tests]="FAIL (no $TESTS)"; return; }
  step tests 420 "$TESTS" -tc="$FP8_CASES"
}

step_sanitizer() {
  [ -x "$TESTS" ] || { verdict[sanitizer]="FAIL (no $TESTS)"; return; }
  for tool in memcheck racecheck; do
    step sanitizer 150 compute-sanitizer --tool "$tool" --error-exitcode 3 "$TESTS" \
      -tc='decode fp8: sanitizer subset,04_tensor_core fp8: sanitizer subset,fp8 conversions: the reference against the device*'
  done
  step sanitizer 150 compute-sanitizer --tool memcheck --error-exitcode 3 "$TESTS" -tc='append:*'
}

step_regression() {
  [ -x "$TESTS" ] || { verdict[regression]="FAIL (no $TESTS)"; return; }
  step regression 420 "$TESTS" -tc='decode:*,split_kv:*,kernels:*' -tce='*fp8*'
}

# A benchmark filter is a regular expression Google Benchmark compiles itself: no
# backslash escapes (it refuses them, and then runs nothing). Each bench step counts the
# rows it timed and fails on none, so a filter that matches nothing cannot pass.
bench_rows() {  # NAME JSON: fails the step NAME when JSON holds no median row
  local n
  n=$(grep -c '"aggregate_name": "median"' "$2" 2> /dev/null)
  echo "$1: ${n:-0} rows timed"
  [ "${n:-0}" -gt 0 ] || verdict[$1]="FAIL (no row timed: check the filter in $RESULTS/$1.log)"
}

step_bench() {
  local bench=$B/bin/flashstep_bench
  [ -x "$bench" ] || { verdict[bench]="FAIL (no $bench)"; return; }
  step bench 300 "$bench" --shapes="$SHAPES" --benchmark_filter='^(ceiling/(copy_d2d|read_only|launch_floor_1)|02_paged/|03_split_kv/|03_split_kv.fp8_cuda_cores./|04_tensor_core/)' \
    --benchmark_out="$RESULTS/bench_fp8.json" --benchmark_out_format=json
  bench_rows bench "$RESULTS/bench_fp8.json"
}

step_bench_prefill() {
  local bench=$B/bin/flashstep_bench
  [ -x "$bench" ] || { verdict[bench_prefill]="FAIL (no $bench)"; return; }
  step bench_prefill 200 "$bench" --shapes=bench/shapes_fp8_prefill.csv --benchmark_filter='^04_tensor_core/' \
    --benchmark_out="$RESULTS/bench_fp8_prefill.json" --benchmark_out_format=json
  bench_rows bench_prefill "$RESULTS/bench_fp8_prefill.json"
}

step_peers() {
  if [ -n "${FLASHINFER_BUNDLE:-}" ] && [ -f "$FLASHINFER_BUNDLE/install.sh" ]; then
    # shellcheck disable=SC1091
    source "$FLASHINFER_BUNDLE/install.sh" "$FLASHINFER_BUNDLE" > "$RESULTS/flashinfer_install.log" 2>&1
  fi
  # bench/peers/attention.py writes its JSON after every shape: a run cut short keeps what it measured
  step peers 540 python3 bench/peers/attention.py --shapes "$SHAPES" --peers flashinfer \
    --flashinfer-timeout 500 --out "$RESULTS/peers_fp8.json"
  grep -c '"median_us"' "$RESULTS/peers_fp8.json" 2>/dev/null | sed 's/^/peers: timed rows: /'
}

step_report() {
  [ -f "$RESULTS/bench_fp8.json" ] || { verdict[report]="FAIL (no bench_fp8.json: run the bench step)"; return; }
  local prefill=()
  [ -f "$RESULTS/bench_fp8_prefill.json" ] && prefill=(--prefill-bench "$RESULTS/bench_fp8_prefill.json")
  step report 60 python3 bench/reports/fp8_report.py --bench "$RESULTS/bench_fp8.json" --peers "$RESULTS/peers_fp8.json" \
    --shapes "$SHAPES" "${prefill[@]}" --json "$RESULTS/fp8_results.json" --markdown "$RESULTS/fp8_table.md"
}

echo "gpu-fp8.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ), build $B ($({ tr '\n' ' ' < "$B/source-state.txt"; } 2>/dev/null | cut -c1-60)), logs in $RESULTS"
for s in "${steps[@]}"; do
  if declare -F "step_$s" > /dev/null; then "step_$s"; else echo "gpu-fp8.sh: no step '$s'" >&2; verdict[$s]="FAIL (no such step)"; fi
done

# The FP8 table (bench/reports/fp8_report.py's output), then the verdicts, last.
[ -f "$RESULTS/report.log" ] && { echo; sed -n '/^== report/,$p' "$RESULTS/report.log" | tail -n +2; }
echo
status=0
printf '%-12s %s\n' step verdict
for s in "${steps[@]}"; do
  printf '%-12s %s\n' "$s" "${verdict[$s]:-FAIL (did not run)}"
  [ "${verdict[$s]:-}" = PASS ] || status=1
done
exit $status
