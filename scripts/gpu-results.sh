#!/usr/bin/env bash
# Every measurement the chapters cite, in one command on a GPU machine (after
# scripts/gpu-build.sh, here or copied here): the GPU tests and sanitizers, the decode
# benchmark on bench/shapes.csv with Nsight Compute's counters, and stage 03's sweep on
# bench/shapes_split_kv.csv with its knob sweep. Leaves seven files in OUT_DIR:
#
#   decode.json  decode_checks.txt                 -> docs/results/02_paged/<gpu>_decode_<date>_<commit>.json,
#                                                     ..._checks.txt
#   split_kv.json  split_kv_checks.txt             -> docs/results/03_split_kv/<gpu>_split_kv_<date>_<commit>.json,
#   split_kv_tune.json  split_kv_clean_l2_peers.json   ..._checks.txt, <gpu>_tune_<date>.json, ...
#   device.txt
#
#   scripts/gpu-results.sh OUT_DIR [decode|split_kv] [--build DIR]
#
# decode or split_kv runs only that half (the first: tests, sanitizer, bench, ncu; the
# second: bench, split_kv_tune), for a machine that allows no single run that long.
#
# Then, in a checkout: scripts/gpu-results-install.sh OUT_DIR copies the files into
# docs/results/ under those names (the runs the chapters cited before move to their
# folder's history/) and regenerates the chapters of stages 01-03.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:?usage: scripts/gpu-results.sh OUT_DIR [decode|split_kv] [--build DIR]}
shift
part=all
case ${1:-} in decode|split_kv) part=$1; shift ;; esac
mkdir -p "$OUT_DIR"
work=$(mktemp -d)
shown=$([ $part = all ] || echo "$part ")$*
export FLASHSTEP_COMMAND_PREFIX="scripts/gpu-results.sh OUT_DIR ${shown% }, which ran: "
[ $part = split_kv ] || scripts/gpu-run.sh "$@" --out "$work/decode" tests sanitizer bench ncu
[ $part = decode ] || scripts/gpu-run.sh "$@" --shapes bench/shapes_split_kv.csv --out "$work/split_kv" bench split_kv_tune
checks() {  # the logs a reader needs to check a run, with headings
  local dir=$1 what=$2; shift 2
  echo "# Checks of the run that produced the results JSON beside this file: $what"
  echo; echo "## device"; cat "$dir/device.txt"
  for log in "$@"; do
    [ -f "$dir/$log" ] || continue
    echo; echo "## $log"; cat "$dir/$log"
  done
}
if [ $part != split_kv ]; then
  cp "$work/decode/device.txt" "$OUT_DIR/device.txt"
  cp "$work/decode/results.json" "$OUT_DIR/decode.json"
  checks "$work/decode" "scripts/gpu-results.sh (decode: tests sanitizer bench ncu)" \
    tests.log sanitizer.log ncu.log > "$OUT_DIR/decode_checks.txt"
fi
if [ $part != decode ]; then
  cp "$work/split_kv/device.txt" "$OUT_DIR/device.txt"
  cp "$work/split_kv/results.json" "$OUT_DIR/split_kv.json"
  cp "$work/split_kv/tune.json" "$OUT_DIR/split_kv_tune.json"
  cp "$work/split_kv/clean_l2_peers.json" "$OUT_DIR/split_kv_clean_l2_peers.json"
  checks "$work/split_kv" "scripts/gpu-results.sh (split-KV: bench split_kv_tune)" \
    tune.log > "$OUT_DIR/split_kv_checks.txt"
fi
# Paths of this machine have no place in a committed file.
sed -i "s#$PWD/##g; s#$work/##g" "$OUT_DIR"/*.txt
rm -rf "$work"
ls -l "$OUT_DIR"
