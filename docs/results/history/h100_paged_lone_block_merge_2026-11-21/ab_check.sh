#!/usr/bin/env bash
# One device call for stage 02's whole-block merge of a lone block (SPLITS = 2):
# flashstep_bench on stage 02 at five shapes, this build (new) and
# build-gpu/bin/flashstep_bench_head (the same tree with HEAD's paged_decode.cuh),
# interleaved new head new head new head; the cuDNN/flash peers on the same shapes;
# ncu kernel duration of both at b16 x kv4096; then the GPU tests + exercises
# (scripts/gpu-run.sh tests) and compute-sanitizer memcheck + racecheck
# (scripts/gpu-run.sh sanitizer) on the new build.
# Usage (repository root, build-gpu/ carried): bash docs/results/history/h100_paged_lone_block_merge_2026-11-21/ab_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/flashstep-out}; mkdir -p "$OUT"
HERE=$(dirname "$0")
B=$PWD/build-gpu
export LD_LIBRARY_PATH=$B/bin:${LD_LIBRARY_PATH:-}
NAMES='b16_kv4096_p16|b16_kv1024_p16|b64_kv8192_p16|b128_kv8192_p16|b1_kv8192_p16'
FILTER="^(ceiling/|02_paged/($NAMES)/)"
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
mkdir -p /tmp/ab
bench() {  # bench BINARY JSON
  timeout 120 "$B/bin/$1" --shapes=bench/shapes.csv --benchmark_filter="$FILTER" \
    --benchmark_out="$2" --benchmark_out_format=json >> "$OUT/bench.log" 2>&1
  echo "$1 -> $(basename "$2"): rc=$? [t=$(( $(date +%s) - start )) s]"
}
for i in 1 2 3; do
  bench flashstep_bench /tmp/ab/new$i.json
  bench flashstep_bench_head /tmp/ab/head$i.json
done
grep -E "^(name|$NAMES)," bench/shapes.csv > /tmp/shapes5.csv
PYTHONUNBUFFERED=1 timeout 150 python3 bench/peers.py --shapes /tmp/shapes5.csv --out /tmp/ab/peers.json >> "$OUT/bench.log" 2>&1
echo "peers: rc=$? [t=$(( $(date +%s) - start )) s]"
for bin in flashstep_bench flashstep_bench_head; do
  timeout 60 ncu --clock-control none --kernel-name regex:paged_decode --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight "$B/bin/$bin" --shapes=bench/shapes.csv --benchmark_filter="^02_paged/b16_kv4096_p16/" 2>&1 |
    sed "s|^|$bin: |"
done > "$OUT/ncu.log" 2>&1
grep -E "Duration|DRAM Throughput" "$OUT/ncu.log"
echo "[t=$(( $(date +%s) - start )) s]"
tar -C /tmp/ab -cf "$OUT/ab.tar" new1.json head1.json new2.json head2.json new3.json head3.json peers.json
scripts/gpu-run.sh tests | grep -v "^name\|NVIDIA\|Build\|torch\|lib"
echo "[t=$(( $(date +%s) - start )) s]"
T=$B/tests/stages/flashstep_stage_tests
echo "sanitizer subset (-tc='*sanitizer*,kernels:*'):"
"$T" -tc='*sanitizer*,kernels:*' --list-test-cases 2>&1 | grep -E "decode|sanitizer" | sed 's/^/  /'
scripts/gpu-run.sh sanitizer | grep -v "^name\|NVIDIA\|Build\|torch\|lib"
grep -E "RACECHECK SUMMARY|Race reported" "$OUT/sanitizer.log"
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 3 "$T" \
  -tc='decode: 02_paged at every block size and pipeline depth*' > "$OUT/racecheck_targeted.log" 2>&1
echo "racecheck (targeted, 02_paged every block size incl. fp32/256/group 7 at 512 threads): rc=$?"
grep -E "RACECHECK SUMMARY|Race reported|test cases:" "$OUT/racecheck_targeted.log"
echo "[t=$(( $(date +%s) - start )) s]"
python3 "$HERE/compare.py" /tmp/ab | tee "$OUT/ab_compare.txt"
