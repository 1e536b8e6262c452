#!/usr/bin/env bash
# The tour: install missing Debian packages, build, run `flashstep tour`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j"$(nproc)" --target flashstep_cli
exec build/bin/flashstep tour "$@"
