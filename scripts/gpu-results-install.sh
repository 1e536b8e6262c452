#!/usr/bin/env bash
# Puts the files of scripts/gpu-results.sh into docs/results/ and regenerates the stage
# chapters from them, in a checkout (not on the GPU machine):
#
#   scripts/gpu-results-install.sh OUT_DIR [NAME]      NAME: e.g. h100_2026-11-23 (default:
#                                                     the GPU's short name and today's date)
#
# The decode run the chapters cited moves to docs/results/history/ (its "how it got there"
# row stays); the split-KV run is replaced. Refuses a run of a modified tree: only runs of
# a clean tree are committed. Review with git diff, then commit.
set -euo pipefail
cd "$(dirname "$0")/.."
in=${1:?usage: scripts/gpu-results-install.sh OUT_DIR [NAME]}
py=/usr/bin/python3
tree=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["flashstep"].get("tree", "unknown"))' "$in/decode.json")
[ "$tree" = clean ] || { echo "gpu-results-install.sh: the run's tree is '$tree', not clean: not for docs/results/" >&2; exit 1; }
gpu=$(head -2 "$in/device.txt" | tail -1 | grep -oE '[HB][0-9]{2,3}|A100|L40S?' | head -1 | tr 'A-Z' 'a-z')
name=${2:-${gpu:-gpu}_$(date -u +%Y-%m-%d)}
d=docs/results
for old in $(grep -ohE "docs/results/[a-z0-9_]+_decode_[0-9-]+\.json" stages/0[12]_*/README.md | sort -u); do
  base=$(basename "$old" .json)
  commit=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["context"]["commit"])' "$old")
  v=$(ls $d/history/${base}_v*.json 2>/dev/null | wc -l); v=$((v + 1))
  git mv "$old" "$d/history/${base}_v${v}_${commit}.json"
  [ -f "$d/${base}_checks.txt" ] && git rm -q "$d/${base}_checks.txt"
done
for old in $(grep -ohE "docs/results/[a-z0-9_/-]+\.(json|txt)" stages/03_split_kv/README.md | sort -u); do
  [ -f "$old" ] && git rm -q "$old"
done
for old in $d/split_kv/*_checks.txt; do [ -f "$old" ] && git rm -q "$old"; done
mkdir -p "$d/split_kv"
cp "$in/decode.json" "$d/${name%_*}_decode_${name##*_}.json"
cp "$in/decode_checks.txt" "$d/${name%_*}_decode_${name##*_}_checks.txt"
cp "$in/split_kv.json" "$d/${name%_*}_split_kv_${name##*_}.json"
cp "$in/split_kv_tune.json" "$d/split_kv/${name%_*}_tune_${name##*_}.json"
cp "$in/split_kv_clean_l2_peers.json" "$d/split_kv/${name%_*}_clean_l2_peers_${name##*_}.json"
cp "$in/split_kv_checks.txt" "$d/split_kv/${name%_*}_${name##*_}_checks.txt"
$py bench/report.py --results "$d/${name%_*}_decode_${name##*_}.json"
$py bench/split_kv_report.py "$d/${name%_*}_split_kv_${name##*_}.json" \
  --tune "$d/split_kv/${name%_*}_tune_${name##*_}.json" --clean "$d/split_kv/${name%_*}_clean_l2_peers_${name##*_}.json" \
  --readme stages/03_split_kv/README.md --plot stages/03_split_kv/sweep.png --write-targets
git status --short docs/results stages
