#!/usr/bin/env bash
# The tour: install missing Debian packages, build what this machine can run, run
# `flashstep tour`. With a GPU of sm_80 or newer and nvcc: the native preset, into
# build-native/ (the CUDA stages for this GPU, which the tour validates). Otherwise: the
# CPU preset, into build-cpu/ (no CUDA compile: nothing here could run it). Either way the
# Python module is built too (<build>/python), for the README's next commands.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

preset=cpu
# "8.6" for an RTX 3090; nothing where nvidia-smi is missing, fails, or predates the field
if cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1) &&
  [[ $cc =~ ^([0-9]+)\.([0-9]+)$ ]]; then
  sm=$((BASH_REMATCH[1] * 10 + BASH_REMATCH[2]))
  if ((sm < 80)); then
    echo "flashstep: this GPU is sm_$sm; the CUDA stages need sm_80 or newer: building the CPU parts only"
  elif [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null; then
    echo "flashstep: a GPU (sm_$sm) but no nvcc on PATH: building the CPU parts only"
  else
    preset=native
  fi
fi
targets=(flashstep_cli flashstep_python)
[ "$preset" = native ] && targets+=(flashstep_capi)  # flashstep.cuda, for the notebooks' GPU cells
echo "flashstep: building ${targets[*]} into build-$preset/ (cmake --preset $preset)"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j"$(nproc)" --target "${targets[@]}"
exec "build-$preset/bin/flashstep" tour "$@"
