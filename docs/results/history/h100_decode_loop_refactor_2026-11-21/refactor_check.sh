#!/usr/bin/env bash
# One device call for the decode-loop refactor (kernels/flashstep/kernels/decode_loop.cuh):
# GPU tests + exercises, flashstep_bench on stages 02/03 at the four target shapes
# (this build, A, and bin/flashstep_bench_head built from the commit before the refactor,
# B, interleaved A B A B in one process order), the cuDNN/flash peers on the same shapes,
# then compute-sanitizer memcheck + racecheck on the sanitizer subsets.
# Usage (repository root): build-gpu/refactor_check.sh COMMIT
set -uo pipefail
OUT=${OUT:-/tmp/flashstep-out}; mkdir -p "$OUT"
B=$PWD/build-gpu
export LD_LIBRARY_PATH=$B/bin:${LD_LIBRARY_PATH:-}
export FLASHSTEP_COMMIT=$1
SHAPES=bench/shapes_split_kv.csv
NAMES='b128_kv8192_p16|b16_kv4096_p16|b1_kv16384_p16|b1_kv131072_p16'
FILTER="^(ceiling/|(02_paged|03_split_kv)/($NAMES)/)"
start=$(date +%s)
scripts/gpu-run.sh tests
echo "[t=$(( $(date +%s) - start )) s]"
bench() {  # bench BINARY JSON
  timeout 120 "$B/bin/$1" --shapes=$SHAPES --benchmark_filter="$FILTER" \
    --benchmark_out="$2" --benchmark_out_format=json >> "$OUT/bench.log" 2>&1
  echo "$1 -> $(basename "$2"): rc=$?"
}
mkdir -p /tmp/ab
bench flashstep_bench "$OUT/bench.json"
bench flashstep_bench_head /tmp/ab/head1.json
bench flashstep_bench /tmp/ab/new2.json
bench flashstep_bench_head /tmp/ab/head2.json
echo "[t=$(( $(date +%s) - start )) s]"
grep -E "^(name|$NAMES)," $SHAPES > /tmp/shapes4.csv
PYTHONUNBUFFERED=1 timeout 120 python3 bench/peers.py --shapes /tmp/shapes4.csv --out "$OUT/peers.json" >> "$OUT/bench.log" 2>&1
echo "peers: rc=$?"
python3 bench/merge_results.py --bench "$OUT/bench.json" --peers "$OUT/peers.json" --shapes $SHAPES \
  --commit "$1" --dirty --note "decode loop of stages 02 and 03 in kernels/decode_loop.cuh (v2, refactor check on H100: 4 shapes)" \
  --out "$OUT/results.json" && rm -f "$OUT/bench.json"
tar -C /tmp/ab -cf "$OUT/ab.tar" head1.json new2.json head2.json
grep -E "median " "$OUT/bench.log" | sed -E 's/ +/ /g' | cut -c1-120
echo "[t=$(( $(date +%s) - start )) s]"
scripts/gpu-run.sh sanitizer
echo "[t=$(( $(date +%s) - start )) s]"
