#!/usr/bin/env bash
# Every test: install missing Debian packages, build everything, run CTest (GPU tests
# skip with a message where no GPU is present). Prints the test count at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset default
cmake --build --preset default -j"$(nproc)"
ctest --preset default -j"$(nproc)" "$@"
