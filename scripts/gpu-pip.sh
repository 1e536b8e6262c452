#!/usr/bin/env bash
# The package that `pip install .` builds, on a GPU machine: flashstep.cuda must find
# the C library inside the package (no FLASHSTEP_CAPI, no build folder) and run the
# stages with the CUDA runtime packed beside it. Builds nothing: the wheel is built
# where nvcc is, with
#
#   python3 -m pip wheel --no-deps -w build-python/dist .
#
# and build-python/dist/ is carried to the GPU machine. There, from the repository root:
#
#   scripts/gpu-pip.sh [--out DIR] [WHEEL_DIR]        (default build-python/dist)
#
# The wheel's package folder is unpacked into a scratch folder and put first on
# PYTHONPATH (its compiled CPU module may be for another Python: flashstep.cuda does not
# need it), then tests/python/test_cuda_arguments.py and test_cuda_gpu.py run with the
# machine's python3 (or $PYTHON) and PyTorch. The log goes to --out DIR (default: the
# scratch folder). Ends with a PASS/FAIL table; exit 0 only if every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=
if [ "${1:-}" = --out ]; then LOGS=$2; shift 2; fi
WHEELS=${1:-build-python/dist}
wheel=$(ls -t "$WHEELS"/flashstep-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || { echo "gpu-pip.sh: no flashstep-*.whl in $WHEELS (build one with: python3 -m pip wheel --no-deps -w $WHEELS .)" >&2; exit 2; }
SCRATCH=$(mktemp -d /tmp/flashstep-gpu-pip-XXXXXX)
LOGS=${LOGS:-$SCRATCH}
mkdir -p "$LOGS"
"${PYTHON:-python3}" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$SCRATCH/site"
chmod +x "$SCRATCH"/site/flashstep/*.so* 2>/dev/null || true
unset FLASHSTEP_CAPI
PY=${PYTHON:-python3}  # the machine's Python, with PyTorch and pytest
export PYTHONPATH=$SCRATCH/site PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
results=()
step() {  # name, command...
  local name=$1; shift
  echo "== $name" | tee -a "$LOGS/gpu-pip.log"
  if "$@" 2>&1 | tee -a "$LOGS/gpu-pip.log"; [ "${PIPESTATUS[0]}" -eq 0 ]; then
    results+=("PASS  $name")
  else
    results+=("FAIL  $name")
  fi
}
echo "wheel: $wheel" | tee "$LOGS/gpu-pip.log"
step "the library is found in the package and a GPU is usable" "$PY" - "$SCRATCH/site" <<'PY'
import os, sys
import flashstep._capi as k
import flashstep.cuda as fsc
lib = k.load()
assert os.path.dirname(lib._name) == os.path.join(sys.argv[1], "flashstep"), lib._name
ok, why = fsc.available()
print("library:", lib._name, "| available:", ok, why)
print("stages:", [name for name, _, _ in fsc.stages()])
assert ok, why
import torch  # the tests below compare against PyTorch: they must run, not skip
assert torch.cuda.is_available(), "PyTorch sees no CUDA device"
PY
step "tests/python/test_cuda_arguments.py and test_cuda_gpu.py" \
  timeout 400 "$PY" -m pytest -q -p no:cacheprovider -rs tests/python/test_cuda_arguments.py tests/python/test_cuda_gpu.py
echo
printf '%s\n' "${results[@]}"
for r in "${results[@]}"; do [[ $r == PASS* ]] || exit 1; done
