#!/usr/bin/env bash
# Stage 08 (context parallel) on a GPU machine, from the repository root, with a build
# folder made by scripts/gpu-build.sh: its tests (CTest, label gpu: the host cases, world
# size 1, and the 2-GPU cases where there are two GPUs) and flashstep_cp_bench, whose JSON
# goes to the output folder. NCCL's runtime is looked up as scripts/nccl-env.sh says.
#
#   scripts/gpu-cp.sh [--build DIR] [--out DIR] [STEP...]      STEP: tests bench (default both)
#
# Then, to fill the chapter's results section: copy <out>/cp_bench.json (from a clean tree)
# to docs/results/08_context_parallel/<gpus>_cp_<date>_<commit>.json (the run before it to
# that folder's history/) and run
# python3 bench/reports/cp_report.py --results docs/results/08_context_parallel/<that file>.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${FLASHSTEP_BUILD_DIR:-build-gpu}
OUTDIR=
steps=()
while (($#)); do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --out) OUTDIR=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) steps+=("$1"); shift ;;
  esac
done
((${#steps[@]})) || steps=(tests bench)
B=$(cd "$BUILD" && pwd) || { echo "gpu-cp.sh: no build folder $BUILD (run scripts/gpu-build.sh)" >&2; exit 2; }
OUTDIR=${OUTDIR:-$B/gpu-cp}
mkdir -p "$OUTDIR"
export LD_LIBRARY_PATH=$B/bin:${LD_LIBRARY_PATH:-}
# shellcheck source=scripts/nccl-env.sh
source scripts/nccl-env.sh
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null || true
rc=0
for step in "${steps[@]}"; do
  case $step in
    tests)
      # the tests run from the build folder's own binary; its cases skip (77) what this machine lacks
      "$B/tests/stages/flashstep_cp_tests" 2>&1 | tee "$OUTDIR/cp_tests.log"
      r=${PIPESTATUS[0]}; [ "$r" = 0 ] || [ "$r" = 77 ] || rc=1 ;;
    bench)
      "$B/bin/flashstep_cp_bench" --out "$OUTDIR/cp_bench.json" --source-state "$B/source-state.txt" 2>&1 |
        tee "$OUTDIR/cp_bench.log"
      r=${PIPESTATUS[0]}; [ "$r" = 0 ] || [ "$r" = 77 ] || rc=1 ;;
    *) echo "gpu-cp.sh: unknown step $step (tests, bench)" >&2; rc=2 ;;
  esac
done
echo "gpu-cp.sh: logs and results in $OUTDIR (exit $rc)"
exit $rc
