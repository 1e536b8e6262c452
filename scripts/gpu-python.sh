#!/usr/bin/env bash
# Runs flashstep.cuda (the stages from Python, python/flashstep/cuda.py and its _cuda_*.py) on a GPU machine,
# from the repository root, with the C library that scripts/gpu-build.sh built:
#
#   scripts/gpu-python.sh [--lib DIR] [--out DIR] [STEP...]
#
#   --lib   folder holding libflashstep_capi.so and libcudart.so.13 (default
#           build-gpu-python, else build-gpu/bin)
#   --out   where the log and the executed notebooks go (default <lib>/run)
#   STEP    any of: tests flashinfer sanitizer notebooks hostcost (default: the first four)
#
#   tests       tests/python/test_cuda_arguments.py, test_cuda_gpu.py, test_cuda_fp8_append.py,
#               test_cuda_default_device.py, test_cuda_mla.py and test_cuda_graph.py
#               (pytest; the graph contract, in-flight re-plans and two streams are the last)
#   flashinfer  tests/python/test_cuda_flashinfer.py and test_cuda_mla.py's FlashInfer cases:
#               the cross-check; source FlashInfer's install.sh first, or it skips with a message
#   sanitizer   a few test_cuda_gpu.py and test_cuda_graph.py cases (graph replays after
#               re-plans among them) under compute-sanitizer memcheck
#   notebooks   notebooks 11 and 12 executed on this GPU (scripts/notebook_exec.py), saved
#               with their outputs, the GPU and the commit to <out>/notebooks/; copy them
#               to docs/results/notebooks/ to show them on the docs site
#   hostcost    bench/peers/host_cost.py: plan() and run() host time per call, and the calls an
#               engine makes (run(out=), the samplers), against FlashInfer (source its
#               install.sh first to compare), table and <out>/host_cost.json
#
# It needs python3 with PyTorch and pytest (the GPU machine's image has both), not the
# CPU module _flashstep: PYTHONPATH is the source folder python/. Each step is bounded
# (tests 540 s, flashinfer 420 s, sanitizer 420 s, notebooks 150 s each, hostcost 300 s);
# to stay within a 10-minute command, run one or two steps per call. Exit status: 0 when
# every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."
LIB=
OUTDIR=
steps=()
while (($#)); do
  case $1 in
    --lib) LIB=$2; shift 2 ;;
    --out) OUTDIR=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) steps+=("$1"); shift ;;
  esac
done
((${#steps[@]})) || steps=(tests flashinfer sanitizer notebooks)
if [ -z "$LIB" ]; then
  for d in build-gpu-python build-gpu/bin; do [ -f "$d/libflashstep_capi.so" ] && LIB=$d && break; done
fi
[ -n "$LIB" ] && [ -f "$LIB/libflashstep_capi.so" ] ||
  { echo "gpu-python.sh: no libflashstep_capi.so (run scripts/gpu-build.sh, or pass --lib DIR)" >&2; exit 2; }
LIB=$(cd "$LIB" && pwd)
OUTDIR=${OUTDIR:-$LIB/run}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/gpu-python.log
: > "$LOG"
export FLASHSTEP_CAPI=$LIB/libflashstep_capi.so
# notebook 11 runs the flashstep command when it finds one
[ -x "$LIB/flashstep" ] && export FLASHSTEP_CLI=$LIB/flashstep LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
PYTEST=(python3 -m pytest -q -p no:cacheprovider -rs)

say() { echo "$@" | tee -a "$LOG"; }
run_logged() { "$@" 2>&1 | tee -a "$LOG"; return "${PIPESTATUS[0]}"; }

say "== gpu-python.sh $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "library: $FLASHSTEP_CAPI ($(tr '\n' ' ' < "$LIB/source-state.txt" 2>/dev/null || echo 'no source-state.txt'))"
run_logged python3 - <<'PY'
import sys
print("python", sys.version.split()[0])
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "device",
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
except Exception as e:
    print("torch: not importable:", e)
try:
    import flashinfer
    print("flashinfer", getattr(flashinfer, "__version__", "?"))
except Exception as e:
    print("flashinfer: not importable:", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
import flashstep.cuda as fsc
print("flashstep.cuda available:", fsc.available())
PY
python3 -c "import pytest" 2>/dev/null || { say "gpu-python.sh: pytest is not installed for python3"; exit 2; }
# On a GPU machine nothing may pass by skipping: a GPU test that cannot run fails.
export FLASHSTEP_REQUIRE_GPU=1

failed=()
# Each step is bounded, so that a hung step still leaves the log of the others.
step_tests() {
  run_logged timeout 540 "${PYTEST[@]}" tests/python/test_cuda_arguments.py tests/python/test_cuda_gpu.py \
    tests/python/test_cuda_fp8_append.py tests/python/test_cuda_default_device.py tests/python/test_cuda_mla.py \
    tests/python/test_cuda_graph.py
}
step_flashinfer() {
  # FlashInfer compiles a kernel module on first use where its JIT cache lacks one: bounded.
  run_logged timeout 420 "${PYTEST[@]}" tests/python/test_cuda_flashinfer.py \
    tests/python/test_cuda_mla.py::test_against_flashinfer
}
step_sanitizer() {
  command -v compute-sanitizer > /dev/null || { say "sanitizer: compute-sanitizer not found, skipped"; return 0; }
  # One cudaMalloc per tensor, so that an access past a tensor's end leaves its allocation.
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 run_logged timeout 420 compute-sanitizer --tool memcheck --error-exitcode 86 \
    "${PYTEST[@]}" -p no:faulthandler tests/python/test_cuda_gpu.py tests/python/test_cuda_graph.py -k \
    "test_decode_matches_the_float64_oracle and 03_split_kv-bfloat16-HND-16-4 or \
     test_decode_matches_the_float64_oracle and 02_paged-float32-NHD-1-8 or \
     test_fp8_decode_matches_the_float64_oracle and 03_split_kv-float8_e4m3fn-HND-16-4 or \
     test_fp8_decode_matches_the_float64_oracle and 02_paged-float8_e5m2-NHD-1-1 or \
     test_paged_prefill_matches_the_float64_oracle and 4-True-NHD-16-bfloat16 or \
     test_ragged_prefill_matches_the_float64_oracle and True-01_naive or \
     test_merge_state_and_merge_states and 100-float16 or \
     test_append_paged_kv_cache and False-16-HND or \
     test_samplers_on_rows_with_one_possible_token or test_check_nan or \
     test_decode_graph_replays_after_replan and None-bfloat16-NHD-16-host or \
     test_decode_graph_replays_after_replan and 03_split_kv-float32-HND-1-device or \
     test_paged_prefill_graph_replays_after_replan and True-NHD-16-host or \
     test_ragged_prefill_graph_replays_after_replan and False-None-bfloat16-host or \
     test_cascade_graph_replays_after_replan_or_refuses and NHD-16-host"
}
step_notebooks() {
  mkdir -p "$OUTDIR/notebooks"
  local rc=0
  for nb in notebooks/11_stage_speed.ipynb notebooks/12_against_flashinfer.ipynb; do
    run_logged timeout 150 python3 scripts/notebook_exec.py "$nb" \
      --save "$OUTDIR/notebooks/$(basename "$nb")" --source-state "$LIB/source-state.txt" || rc=1
  done
  return $rc
}
step_hostcost() {
  # FLASHSTEP_HOSTCOST_WRAPPERS: a shorter list (e.g. engine,decode,ragged) where FlashInfer's
  # modules for the others are not compiled yet
  run_logged timeout 300 python3 bench/peers/host_cost.py --json "$OUTDIR/host_cost.json" \
    --wrappers "${FLASHSTEP_HOSTCOST_WRAPPERS:-decode,prefill,ragged,cascade,engine}"
}
for s in "${steps[@]}"; do
  if ! declare -F "step_$s" > /dev/null; then say "gpu-python.sh: no step '$s'"; exit 2; fi
  say "== step $s"
  if "step_$s"; then say "== step $s: passed"; else say "== step $s: FAILED (rc $?)"; failed+=("$s"); fi
done
say "== log: $LOG"
if ((${#failed[@]})); then say "FAILED steps: ${failed[*]}"; exit 1; fi
say "all steps passed: ${steps[*]}"
