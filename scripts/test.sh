#!/usr/bin/env bash
# Every test: install missing Debian packages, build everything, run CTest (GPU tests
# skip with a message where no GPU is present). Prints the test count at the end.
#
# A test that fails in the parallel run is run once more, alone, with its whole output
# printed last (where the tail of a CI log shows it). The script still fails if it fails
# again; if it passes alone, the script says so by name and passes: such a test depends on
# what ran beside it, a defect to fix, but not a wrong answer of the code it checks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset default
cmake --build --preset default -j"$(nproc)"
status=0
ctest --preset default -j"$(nproc)" "$@" || status=$?
if [ "$status" -ne 0 ]; then
  echo
  echo "== scripts/test.sh: the failed tests once more, one at a time, output in full =="
  if ctest --preset default --rerun-failed -j1; then
    echo "== scripts/test.sh: FLAKY: every test above failed beside other tests and passed alone"
    exit 0
  fi
  exit "$status"
fi
