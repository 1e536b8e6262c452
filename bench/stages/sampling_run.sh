#!/usr/bin/env bash
# Stage 06 on a GPU machine, in one go: the token-equality suite, the GPU statistics,
# the exercise (must FAIL as shipped), compute-sanitizer (memcheck, racecheck, initcheck)
# on the bad-row, speculative and small-grid cases, then flashstep_sampling_bench and
# bench/peers/sampling.py on bench/shapes_sampling.csv. Logs and JSON go to OUTDIR.
#
#     bench/stages/sampling_run.sh BINDIR OUTDIR [--no-peers] [--no-sanitizers]
#
# BINDIR holds flashstep_sampling_tests, flashstep_sampling_statistics_gpu,
# flashstep_exercise_06_sampling and flashstep_sampling_bench (and, on a machine without
# them, libbenchmark.so.1debian and libcudart.so.13, found through LD_LIBRARY_PATH).
# FlashInfer joins the peers when `import flashinfer` works (see bench/peers/sampling.py);
# with FLASHINFER_BUNDLE set to an offline FlashInfer bundle folder, its install.sh is
# sourced first (its JIT build of the sampling module takes a minute or two).
set -uo pipefail
bin=$(cd "${1:?usage: sampling_run.sh BINDIR OUTDIR}" && pwd)
out=$(mkdir -p "${2:?usage: sampling_run.sh BINDIR OUTDIR}" && cd "$2" && pwd)
shift 2
peers=1 sanitizers=1
for a in "$@"; do
  case $a in
    --no-peers) peers=0 ;;
    --no-sanitizers) sanitizers=0 ;;
  esac
done
cd "$(dirname "$0")/../.."  # the repository root (bench/stages/ is two levels down)
export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0
step() {  # step NAME COMMAND...: run, log to OUTDIR/NAME.log, report the exit code
  local name=$1; shift
  local start=$(date +%s)
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $(( $(date +%s) - start )) s"
  return $rc
}
step tests "$bin/flashstep_sampling_tests" || status=1
step statistics "$bin/flashstep_sampling_statistics_gpu" || status=1
step exercise "$bin/flashstep_exercise_06_sampling"
[ $? -eq 1 ] || { echo "exercise: expected FAIL (exit 1) as shipped"; status=1; }
if [ $sanitizers = 1 ] && command -v compute-sanitizer > /dev/null; then
  # memcheck also on the plain grid (every vocab and batch) and the fused from-logits
  # samplers (f32 and bf16 logits); racecheck and initcheck,
  # much slower, on the cases that reach every kernel: bad rows and speculative
  small='--test-case=bad rows*,chain_speculative*,host-side*'
  step sanitizer_memcheck compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$bin/flashstep_sampling_tests" "$small,sampling_from_probs*,from logits*" || status=1
  for tool in racecheck initcheck; do
    step "sanitizer_$tool" compute-sanitizer --tool "$tool" --error-exitcode 3 \
      "$bin/flashstep_sampling_tests" "$small" || status=1
  done
fi
step bench "$bin/flashstep_sampling_bench" --shapes bench/shapes_sampling.csv \
  --benchmark_repetitions=5 --benchmark_out="$out/sampling_bench.json" --benchmark_out_format=json || status=1
if [ $peers = 1 ]; then
  if [ -n "${FLASHINFER_BUNDLE:-}" ] && [ -f "$FLASHINFER_BUNDLE/install.sh" ]; then
    # shellcheck disable=SC1091
    source "$FLASHINFER_BUNDLE/install.sh" "$FLASHINFER_BUNDLE" > "$out/flashinfer_install.log" 2>&1
  fi
  PYTHONUNBUFFERED=1 step peers python3 bench/peers/sampling.py --shapes bench/shapes_sampling.csv \
    --out "$out/peers_sampling.json" || status=1
fi
grep -h "test cases:\|REJECT\|ERROR SUMMARY\|RACECHECK SUMMARY\|Uninitialized\|^FAIL\|^PASS" "$out"/*.log | sort | uniq -c
exit $status
