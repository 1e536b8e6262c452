#!/usr/bin/env bash
# On the GPU machine, in the repository root, after scripts/gpu-build.sh ran here and
# build-gpu/ was carried: the GPU tests, compute-sanitizer (memcheck + racecheck) on the
# sanitizer subset, then flashstep_bench and bench/peers.py in the same call, merged into
# one results JSON. Writes under $OUT (at most 8 files come back):
#   device.txt tests.log sanitizer.log bench.log bench.json peers.json results.json ncu.log
# Usage: FLASHSTEP_COMMIT=<sha> [FLASHSTEP_DIRTY=1] [FLASHSTEP_NOTE=<what changed>] scripts/gpu-run.sh [tests|sanitizer|bench|ncu]...
set -uo pipefail
OUT=${OUT:-/tmp/flashstep-out}
mkdir -p "$OUT"
B=$PWD/build-gpu
export LD_LIBRARY_PATH=$B/bin:${LD_LIBRARY_PATH:-}
steps=${*:-tests sanitizer bench}
# CTest files hold this machine's absolute build paths; point that path at this checkout.
if [ "$PWD" != /work/main ] && [ ! -e /work/main ]; then mkdir -p /work && ln -s "$PWD" /work/main; fi

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv
  nvcc --version | tail -1; python3 -c 'import torch; print("torch", torch.__version__)'
  ldd "$B/bin/flashstep_bench" | grep -E "not found|cublas|cudart|benchmark"; } > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

for step in $steps; do
  case $step in
  tests)
    ( cd "$B" && timeout 240 ctest -L gpu --output-on-failure -j4 --timeout 200 ) > "$OUT/tests.log" 2>&1
    echo "tests: rc=$?"; grep -E "tests passed|tests failed|Total Test" "$OUT/tests.log"
    # Every stage's exercise skeleton must build, run, and FAIL as shipped (its holes are
    # empty): one per stage folder, so a stage whose exercise was not built shows here.
    for dir in stages/[0-9][0-9]_*/; do
      ex=$(basename "$dir")
      if [ ! -x "$B/bin/flashstep_exercise_$ex" ]; then
        echo "exercise $ex: not built (scripts/gpu-build.sh builds every stage's)" | tee -a "$OUT/tests.log"
        continue
      fi
      timeout 60 "$B/bin/flashstep_exercise_$ex" > "$OUT/exercise.tmp" 2>&1
      echo "exercise $ex as shipped: rc=$? (1 expected): $(tail -1 "$OUT/exercise.tmp")" | tee -a "$OUT/tests.log"
    done
    rm -f "$OUT/exercise.tmp" ;;
  ncu)
    # Hardware counters of stage 02 on the two target shapes: DRAM throughput, occupancy.
    for shape in b128_kv8192_p16 b16_kv4096_p16; do
      timeout 60 ncu --clock-control none --kernel-name regex:paged_decode --launch-skip 3 --launch-count 1 \
          --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
          "$B/bin/flashstep_bench" --shapes=bench/shapes.csv --sets=target \
          --benchmark_filter="^02_paged/${shape}/"
    done > "$OUT/ncu.log" 2>&1
    echo "ncu: rc=$?"; grep -E "DRAM Throughput|Memory Throughput|Achieved Occupancy|Duration|Registers Per" "$OUT/ncu.log" ;;
  sanitizer)
    t="$B/tests/stages/flashstep_stage_tests"
    { for tool in memcheck racecheck; do
        echo "=== compute-sanitizer --tool $tool"
        timeout 150 compute-sanitizer --tool $tool --error-exitcode 3 "$t" -tc='*sanitizer*,kernels:*'
        echo "=== $tool rc=$?"
      done
    } > "$OUT/sanitizer.log" 2>&1
    grep -E "^=== |ERROR SUMMARY|test cases:" "$OUT/sanitizer.log" ;;
  bench)
    FLASHSTEP_COMMIT=${FLASHSTEP_COMMIT:-unknown} timeout 240 "$B/bin/flashstep_bench" --shapes=bench/shapes.csv --tune \
      --benchmark_out="$OUT/bench.json" --benchmark_out_format=json > "$OUT/bench.log" 2>&1
    echo "bench: rc=$?"
    PYTHONUNBUFFERED=1 timeout 200 python3 bench/peers.py --shapes bench/shapes.csv --out "$OUT/peers.json" >> "$OUT/bench.log" 2>&1
    echo "peers: rc=$?"
    python3 bench/merge_results.py --bench "$OUT/bench.json" --peers "$OUT/peers.json" \
      --shapes bench/shapes.csv --commit "${FLASHSTEP_COMMIT:-unknown}" ${FLASHSTEP_DIRTY:+--dirty} \
      --note "${FLASHSTEP_NOTE:-}" \
      --out "$OUT/results.json"
    grep -E "median " "$OUT/bench.log" | sed -E 's/ +/ /g' | cut -c1-150 ;;
  esac
done
