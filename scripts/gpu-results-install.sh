#!/usr/bin/env bash
# Puts the files of scripts/gpu-results.sh into docs/results/ and regenerates the stage
# chapters from them, in a checkout (not on the GPU machine):
#
#   scripts/gpu-results-install.sh OUT_DIR [NAME]      NAME: e.g. h100_2026-11-23 (default:
#                                                     the GPU's short name and today's date)
#
# The decode run goes to docs/results/02_paged/NAME's gpu_decode_date_commit.json, the
# split-KV run and its tune and clean-L2 files to docs/results/03_split_kv/, each with its
# checks beside it. The runs the chapters cited before move to their folder's history/
# (the decode run as ..._v<N>_<commit>.json: its "how it got there" row stays). Refuses a
# run of a modified tree: only runs of a clean tree are committed. Review with git diff,
# then commit.
set -euo pipefail
cd "$(dirname "$0")/.."
in=${1:?usage: scripts/gpu-results-install.sh OUT_DIR [NAME]}
py=/usr/bin/python3
field() {  # field FILE KEY...: a value of the JSON, e.g. field decode.json flashstep tree
  $py -c 'import json, sys
d = json.load(open(sys.argv[1]))
for k in sys.argv[2:]:
    d = d.get(k, {}) if isinstance(d, dict) else {}
print(d if isinstance(d, str) and d else "unknown")' "$@"
}
tree=$(field "$in/decode.json" flashstep tree)
[ "$tree" = clean ] || { echo "gpu-results-install.sh: the run's tree is '$tree', not clean: not for docs/results/" >&2; exit 1; }
gpu=$(head -2 "$in/device.txt" | tail -1 | grep -oE '[HB][0-9]{2,3}|A100|L40S?' | head -1 | tr 'A-Z' 'a-z')
name=${2:-${gpu:-gpu}_$(date -u +%Y-%m-%d)}
gpu=${name%_*} day=${name##*_}
decode=docs/results/02_paged split=docs/results/03_split_kv
mkdir -p "$decode/history" "$split/history"
# the decode run the chapters of stages 01 and 02 cite, and its checks: to history/
for old in $(grep -ohE "docs/results/02_paged/[a-z0-9_]+_decode_[0-9-]+_[0-9a-f]+\.json" stages/0[12]_*/README.md | sort -u); do
  base=$(basename "$old" .json)
  commit=${base##*_} stem=${base%_*}
  v=$(ls "$decode"/history/*_decode_*_v*.json 2>/dev/null | wc -l); v=$((v + 1))
  git mv "$old" "$decode/history/${stem}_v${v}_${commit}.json"
  [ -f "$decode/${base}_checks.txt" ] && git mv "$decode/${base}_checks.txt" "$decode/history/${stem}_v${v}_${commit}_checks.txt"
done
# the split-KV files the chapter of stage 03 cites from its generated section: to history/
for old in $(sed -n '/split_kv results:begin/,/split_kv results:end/p' stages/03_split_kv/README.md |
             grep -ohE "docs/results/03_split_kv/[a-z0-9_-]+\.json" | sort -u); do
  [ -f "$old" ] && git mv "$old" "$split/history/"
  checks=${old%.json}_checks.txt
  [ -f "$checks" ] && git mv "$checks" "$split/history/"
done
commit=$(field "$in/decode.json" context commit)
split_commit=$(field "$in/split_kv.json" context commit)
cp "$in/decode.json" "$decode/${gpu}_decode_${day}_${commit}.json"
cp "$in/decode_checks.txt" "$decode/${gpu}_decode_${day}_${commit}_checks.txt"
cp "$in/split_kv.json" "$split/${gpu}_split_kv_${day}_${split_commit}.json"
cp "$in/split_kv_checks.txt" "$split/${gpu}_split_kv_${day}_${split_commit}_checks.txt"
cp "$in/split_kv_tune.json" "$split/${gpu}_tune_${day}.json"
cp "$in/split_kv_clean_l2_peers.json" "$split/${gpu}_clean_l2_peers_${day}.json"
$py bench/reports/decode_report.py --results "$decode/${gpu}_decode_${day}_${commit}.json"
$py bench/reports/split_kv_report.py "$split/${gpu}_split_kv_${day}_${split_commit}.json" \
  --tune "$split/${gpu}_tune_${day}.json" --clean "$split/${gpu}_clean_l2_peers_${day}.json" \
  --readme stages/03_split_kv/README.md --plot stages/03_split_kv/sweep.png --write-targets
git status --short docs/results stages
