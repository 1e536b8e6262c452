#!/usr/bin/env bash
# Stage 03 on the GPU machine, in the repository root, with build-gpu/ carried (built by
# scripts/gpu-build.sh, which builds every stage's exercise and flashstep_split_kv_tune
# with the tests and the benchmark): the whole GPU suite, compute-sanitizer on the
# sanitizer subsets, the tuning sweep, then flashstep_bench and bench/peers.py on
# bench/shapes_split_kv.csv in the same call, merged into one results JSON.
# Writes under $OUT: device.txt tests.log sanitizer.log tune.json clean.json bench.log peers.json results.json
# Usage: FLASHSTEP_COMMIT=<sha> [FLASHSTEP_DIRTY=1] bench/split_kv_run.sh [tests|sanitizer|tune|bench]...
# (default order: tests bench tune sanitizer, the most needed first)
set -uo pipefail
OUT=${OUT:-/tmp/flashstep-out}
mkdir -p "$OUT"
B=$PWD/build-gpu
export LD_LIBRARY_PATH=$B/bin:${LD_LIBRARY_PATH:-}
steps=${*:-tests bench tune sanitizer}
SHAPES=bench/shapes_split_kv.csv
# CTest files hold this machine's absolute build paths; point that path at this checkout.
if [ "$PWD" != /work/main ] && [ ! -e /work/main ]; then mkdir -p /work && ln -s "$PWD" /work/main; fi

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv
  nvcc --version | tail -1; python3 -c 'import torch; print("torch", torch.__version__)'; } > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

for step in $steps; do
  case $step in
  tests)
    start=$(date +%s)
    ( cd "$B" && timeout 150 ctest -L gpu --output-on-failure -j4 --timeout 120 ) > "$OUT/tests.log" 2>&1
    echo "tests: rc=$? in $(( $(date +%s) - start )) s"; grep -E "tests passed|tests failed|Total Test|\*\*\*Failed|Not Run|Timeout" "$OUT/tests.log"
    # Every stage folder's exercise skeleton must build, run and FAIL as shipped (its holes
    # are empty), as in scripts/gpu-run.sh.
    for dir in stages/[0-9][0-9]_*/; do
      ex=flashstep_exercise_$(basename "$dir")
      [ -x "$B/bin/$ex" ] || { echo "exercise $ex: not built (scripts/gpu-build.sh builds every stage's)" | tee -a "$OUT/tests.log"; continue; }
      timeout 60 "$B/bin/$ex" > "$OUT/exercise.tmp" 2>&1
      echo "exercise $ex as shipped: rc=$? (1 expected): $(tail -1 "$OUT/exercise.tmp")" | tee -a "$OUT/tests.log"
    done
    rm -f "$OUT/exercise.tmp" ;;
  sanitizer)
    t="$B/tests/stages/flashstep_stage_tests"
    { for tool in memcheck racecheck; do
        echo "=== compute-sanitizer --tool $tool"
        timeout 100 compute-sanitizer --tool $tool --error-exitcode 3 "$t" -tc='*sanitizer*'
        echo "=== $tool rc=$?"
      done
    } > "$OUT/sanitizer.log" 2>&1
    grep -E "^=== |ERROR SUMMARY|test cases:|03_split_kv forced" "$OUT/sanitizer.log" ;;
  tune)
    timeout 150 "$B/bin/flashstep_split_kv_tune" --shapes=$SHAPES \
      --benchmark_out="$OUT/tune.json" --benchmark_out_format=json > "$OUT/tune.log" 2>&1
    echo "tune: rc=$?"
    grep -E "_median " "$OUT/tune.log" | sed -E 's/ +/ /g; s#/min_time:0.050/repeats:5/manual_time_median##' | awk '{print $1, $2, $3, $6}'
    PYTHONUNBUFFERED=1 timeout 100 python3 bench/split_kv_clean_peers.py --shapes $SHAPES --out "$OUT/clean.json" >> "$OUT/tune.log" 2>&1
    echo "clean-L2 peers: rc=$?"; grep -E "^peer_clean" "$OUT/tune.log"
    cat "$OUT/tune.log" >> "$OUT/bench.log"; rm -f "$OUT/tune.log" ;;
  bench)
    FLASHSTEP_COMMIT=${FLASHSTEP_COMMIT:-unknown} timeout 200 "$B/bin/flashstep_bench" --shapes=$SHAPES \
      --benchmark_filter='^(ceiling|02_paged|03_split_kv)/' \
      --benchmark_out="$OUT/bench.json" --benchmark_out_format=json > "$OUT/bench.log" 2>&1
    echo "bench: rc=$?"
    PYTHONUNBUFFERED=1 timeout 200 python3 bench/peers.py --shapes $SHAPES --out "$OUT/peers.json" >> "$OUT/bench.log" 2>&1
    echo "peers: rc=$?"
    python3 bench/merge_results.py --bench "$OUT/bench.json" --peers "$OUT/peers.json" \
      --shapes $SHAPES --commit "${FLASHSTEP_COMMIT:-unknown}" ${FLASHSTEP_DIRTY:+--dirty} \
      --out "$OUT/results.json" && rm -f "$OUT/bench.json"
    python3 bench/split_kv_report.py "$OUT/results.json" --targets-only ;;
  esac
done
