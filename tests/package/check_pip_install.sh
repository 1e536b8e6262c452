#!/usr/bin/env bash
# The README's Python install, as a new user runs it: a fresh venv, `python -m pip install
# SOURCE`, then `pip install -e SOURCE`; after each, from outside the source tree, import
# flashstep (the CPU reference, with the venv's numpy) and flashstep.cuda.
#
# To keep CI short the package is built without the CUDA stages (FLASHSTEP_ENABLE_CUDA=OFF)
# and without link-time optimisation; flashstep.cuda must then say why it has no library.
# The build requirements that pip would put in an isolated environment (pyproject.toml's
# [build-system] requires) go into the venv instead, so that the editable install reuses
# the first build's objects. pip fetches them and numpy from PyPI: where PyPI cannot be
# reached the test is skipped (exit 77) and says so.
#
# Usage: check_pip_install.sh PYTHON SOURCE_DIR SCRATCH_DIR
set -euo pipefail
PYTHON=$1 SOURCE=$2 SCRATCH=$3
# The venv is a new user's: nothing of the caller's Python environment may reach it (the
# README's own commands export PYTHONPATH=<build>/python, whose flashstep would shadow the
# installed one), nor a C library chosen by hand.
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP PYTHONUSERBASE FLASHSTEP_CAPI
export PYTHONNOUSERSITE=1
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
"$PYTHON" -m venv "$SCRATCH/venv"
VPY=$SCRATCH/venv/bin/python
if ! "$VPY" -m pip download --quiet --no-deps --timeout 20 --retries 1 -d "$SCRATCH/probe" scikit-build-core \
     > "$SCRATCH/probe.log" 2>&1; then
  tail -n 3 "$SCRATCH/probe.log"
  echo "SKIP: PyPI cannot be reached from here (pip download scikit-build-core failed); the pip install is not tested"
  exit 77
fi
mapfile -t requires < <("$VPY" -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' "$SOURCE/pyproject.toml")
echo "== build requirements: ${requires[*]}"
"$VPY" -m pip install --quiet "${requires[@]}"
settings=(--no-build-isolation --config-settings=cmake.define.FLASHSTEP_ENABLE_CUDA=OFF
          --config-settings=cmake.define.CMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF
          --config-settings=build-dir="$SCRATCH/build")

check() {  # $1: where flashstep's Python files must come from
  (cd "$SCRATCH" && "$VPY" - "$1" "$SCRATCH/venv" <<'PY'
import os, sys
import numpy as np
import flashstep
import flashstep.cuda as fsc

python_files, venv = sys.argv[1], os.path.realpath(sys.argv[2])
def inside(path, folder):
    return os.path.realpath(path).startswith(os.path.realpath(folder) + os.sep)
assert inside(np.__file__, venv), f"numpy is not the venv's: {np.__file__}"
assert inside(flashstep.__file__, python_files), f"flashstep from {flashstep.__file__}, not {python_files}"
assert inside(flashstep._flashstep.__file__, venv), flashstep._flashstep.__file__

# The reference answers: the merge of two attention states, against numpy's own.
rng = np.random.default_rng(7)
v_a, v_b = rng.standard_normal((3, 2, 8)), rng.standard_normal((3, 2, 8))
s_a, s_b = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
v, s = flashstep.merge_state(v_a, s_a, v_b, s_b)
s_want = np.logaddexp(s_a, s_b)
v_want = v_a * np.exp(s_a - s_want)[..., None] + v_b * np.exp(s_b - s_want)[..., None]
np.testing.assert_allclose(s, s_want, rtol=1e-12)
np.testing.assert_allclose(v, v_want, rtol=1e-12)

# flashstep.cuda imports; with no library in this package it says why when used.
import flashstep._capi
source = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(flashstep._capi.__file__))))
try:
    fsc.stages()
except fsc.LibraryNotFound as e:
    message = str(e)
else:
    # Only an editable install may find one: in the source tree's build folders (a CUDA
    # build of this checkout, as scripts/test.sh makes), never in the package.
    loaded = flashstep._capi._lib._name
    assert not inside(flashstep.__file__, venv), f"an installed package without CUDA loaded {loaded}"
    assert any(inside(loaded, os.path.join(source, b)) for b in ("build", "build-gpu")), loaded
    message = f"library from the source tree's build: {loaded}"
if inside(flashstep.__file__, venv):  # installed: the package knows it was built without CUDA
    assert not fsc.available()[0]
    assert "has no libflashstep_capi.so" in message and "FLASHSTEP_ENABLE_CUDA=OFF" in message, message
elif "library from" not in message:  # editable: the source tree's build folders are looked in too
    assert "build-gpu/bin/libflashstep_capi.so" in message, message
print(f"ok: flashstep {flashstep.__file__}, numpy {np.__version__} from the venv; flashstep.cuda: {message.splitlines()[0]}")
PY
  )
}

install() {  # $1: log name; the rest: pip's arguments
  local log=$SCRATCH/$1.log start=$(date +%s)
  shift
  echo "== python -m pip install $*"
  "$VPY" -m pip install -v "${settings[@]}" "$@" > "$log" 2>&1 || { tail -n 60 "$log"; exit 1; }
  echo "   built and installed in $(( $(date +%s) - start )) s (log: $log)"
}
site=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
install install "$SOURCE"
check "$site/flashstep"
install install-editable -e "$SOURCE"
check "$SOURCE/python/flashstep"
echo "PASS: both installs import flashstep and flashstep.cuda"
