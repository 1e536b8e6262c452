#!/usr/bin/env python3
"""Joins one GPU run's flashstep_bench JSON and peers JSON into one results file.

    merge_results.py --bench bench.json --peers peers.json [--peers more_peers.json] \
                     --shapes bench/shapes.csv [--source-state build-gpu/source-state.txt] \
                     [--command TEXT] --out docs/results/NAME.json

The output stays Google Benchmark JSON (what scripts/docs_results.py reads): the peers
become median rows named peer_<impl>/<shape>, one per shape whose sizes the peer ran (a
decode file's SDPA rows are keyed by sizes and repeat on every shape of those sizes;
FlashInfer's name their shape; a row with an error, such as an output that differs from
cuDNN's, is listed under peer_errors instead), with GB/s or TFLOP/s, pct_of_ceiling and,
where the run measured the read ceiling (context read_ceiling_GB/s), pct_of_read_ceiling;
several --peers files (bench/peers/attention.py run once per family with --peers) are joined as
one. The context gains the commit; a top-level "flashstep" object holds the stage's speed
goals, computed here from the rows of this one run, the peers' versions, the command
that produced the run and the state of the tree. Google Benchmark's "executable" (a
path on the machine that ran it) is dropped. Prints the goals. Which goals follows from
the shapes file's columns: TARGETS (bench/shapes.csv; DECODE_H200_TARGETS for
bench/shapes_decode_h200.csv, by its name), PREFILL_TARGETS (a "mode"
column: bench/shapes_prefill.csv), MLA_TARGETS (a "num_heads" column: bench/shapes_mla.csv) or CASCADE_TARGETS and the cascade sweep (a
"shared_prefix" column too: bench/shapes_cascade.csv).

Provenance is read, never typed: the commit and the tree's state come from the build
folder's source-state.txt (written by scripts/gpu-build.sh, next to the binaries
--bench names), else from git in the current folder. A tree with changes gives a commit
"<sha>-dirty" and "tree": "modified"; only runs of a clean tree belong in docs/results/.
"""
import json
import os
import subprocess
import sys

from common import parser  # bench/reports/
from results import base_name  # bench/reports/
from shapes import load_shapes, shape_key as key_of  # bench/shapes.py (common puts bench/ on the path)

# (description, numerator row, denominator row, goal, how the ratio reads)
TARGETS = [
    ("02_paged vs cuDNN SDPA decode, batch 128 x kv 8192 (GB/s ratio)",
     "02_paged/b128_kv8192_p16", "peer_torch_sdpa_cudnn/b128_kv8192_p16", 1.00, ">="),
    ("02_paged vs cuDNN SDPA decode, batch 16 x kv 4096 (GB/s ratio)",
     "02_paged/b16_kv4096_p16", "peer_torch_sdpa_cudnn/b16_kv4096_p16", 1.05, ">="),
    ("02_paged page_size 1 vs 16, batch 128 x kv 8192 (time ratio)",
     "02_paged/b128_kv8192_p1", "02_paged/b128_kv8192_p16", 1.03, "<=time"),
    ("02_paged page_size 1 vs 16, batch 16 x kv 4096 (time ratio)",
     "02_paged/b16_kv4096_p1", "02_paged/b16_kv4096_p16", 1.03, "<=time"),
]

# The default decode stage (03_split_kv) on bench/shapes_decode_h200.csv (the H200's goals:
# GB/s ratios to cuDNN SDPA and to FlashInfer's faster decode wrapper on each shape, and the
# long batch's share of the read ceiling). Chosen by the file's name: its columns are
# bench/shapes.csv's.
DECODE_H200_FILE = "shapes_decode_h200.csv"
DECODE_H200_SHAPES = [("batch 1 x kv 1024", "b1_kv1024_p16"), ("batch 1 x kv 16384", "b1_kv16384_p16"),
                      ("batch 16 x kv 4096", "b16_kv4096_p16"), ("batch 64 x kv 4096", "b64_kv4096_p16"),
                      ("batch 128 x kv 8192", "b128_kv8192_p16")]
DECODE_H200_TARGETS = [
    (f"03_split_kv vs cuDNN SDPA decode, {text} (GB/s ratio)",
     f"03_split_kv/{name}", f"peer_torch_sdpa_cudnn/{name}", 1.00, ">=") for text, name in DECODE_H200_SHAPES
] + [
    (f"03_split_kv vs FlashInfer's faster decode, {text} (GB/s ratio)", f"03_split_kv/{name}",
     (f"peer_flashinfer_tc_decode/{name}", f"peer_flashinfer_cuda_core_decode/{name}"), 1.00, ">=")
    for text, name in DECODE_H200_SHAPES
] + [
    ("03_split_kv, batch 128 x kv 8192: share of the read ceiling", "03_split_kv/b128_kv8192_p16", None, 0.95, ">=read"),
]

# Stage 04 on bench/shapes_prefill.csv (TFLOP/s ratios; decode rows GB/s).
PREFILL_TARGETS = [
    ("04_tensor_core vs FlashInfer fa2 prefill, batch 4 x 4096 causal (TFLOP/s ratio)",
     "04_tensor_core/b4_q4096_causal", "peer_flashinfer_fa2/b4_q4096_causal", 1.00, ">="),
    ("04_tensor_core vs FlashInfer fa2 prefill, batch 4 x 4096 non-causal (TFLOP/s ratio)",
     "04_tensor_core/b4_q4096", "peer_flashinfer_fa2/b4_q4096", 1.00, ">="),
    ("04_tensor_core vs FlashInfer fa2 prefill, batch 1 x 16384 causal (TFLOP/s ratio)",
     "04_tensor_core/b1_q16384_causal", "peer_flashinfer_fa2/b1_q16384_causal", 1.00, ">="),
    ("04_tensor_core vs FlashInfer fa2 prefill, batch 1 x 16384 non-causal (TFLOP/s ratio)",
     "04_tensor_core/b1_q16384", "peer_flashinfer_fa2/b1_q16384", 1.00, ">="),
    ("04_tensor_core vs cuDNN SDPA, MQA decode 32/1 heads, batch 128 x kv 8192 (GB/s ratio)",
     "04_tensor_core/mqa_b128_kv8192", "peer_torch_sdpa_cudnn/mqa_b128_kv8192", 1.00, ">="),
    ("04_tensor_core vs cuDNN SDPA, MQA decode 32/1 heads, batch 1 x kv 16384 (GB/s ratio)",
     "04_tensor_core/mqa_b1_kv16384", "peer_torch_sdpa_cudnn/mqa_b1_kv16384", 1.00, ">="),
] + [
    # Stage 07 (Hopper, ragged K/V) against cuDNN and FlashInfer's fa3 on the same shapes.
    (f"07_hopper vs {peer_text} prefill, {text} (TFLOP/s ratio)",
     f"07_hopper_ragged/{shape}", f"{peer}/{shape}", 1.00, ">=")
    for shape, text in (("b4_q4096_causal", "batch 4 x 4096 causal"), ("b4_q4096", "batch 4 x 4096 non-causal"),
                        ("b1_q16384_causal", "batch 1 x 16384 causal"), ("b1_q16384", "batch 1 x 16384 non-causal"))
    for peer, peer_text in (("peer_torch_sdpa_cudnn", "cuDNN SDPA"), ("peer_flashinfer_fa3", "FlashInfer fa3"))
] + [
    ("07_hopper vs the cuBLAS bf16 GEMM ceiling, batch 4 x 4096 non-causal (TFLOP/s ratio)",
     "07_hopper_ragged/b4_q4096", "the run's gemm_bf16_ceiling_TFLOP/s", 0.80, ">=ceiling"),
] + [
    (f"07_hopper vs FlashInfer fa3 prefill, {text} (TFLOP/s ratio)",
     f"{stage}/{shape}", f"peer_flashinfer_fa3/{shape}", 1.00, ">=")
    for stage, shape, text in (
        ("07_hopper_ragged", "b4_q4096_d64_causal", "head_dim 64, batch 4 x 4096 causal"),
        ("07_hopper", "append_b4_q512_kv8192_causal", "append 512 on 8192, batch 4, pages of 16"),
        ("07_hopper_ragged", "ragged8_q8192_causal", "ragged 8 requests up to 8192"))
] + [
    # Stage 07's large-group decode over pages (the shape's page table), against cuDNN.
    (f"07_hopper vs cuDNN SDPA, MQA decode 32/1 heads, {text} (GB/s ratio)",
     f"07_hopper/{shape}", f"peer_torch_sdpa_cudnn/{shape}", 1.00, ">=")
    for shape, text in (("mqa_b128_kv8192", "batch 128 x kv 8192"), ("mqa_b1_kv16384", "batch 1 x kv 16384"))
]

# Stage 05 on bench/shapes_cascade.csv: speedups, the other row's time over stage 05's
# (">=speedup": higher is better, whatever unit each row counts). A denominator given as
# a tuple is the fastest of those rows in this run.
CASCADE_TARGETS = [
    ("05_cascade vs FlashInfer's MultiLevelCascadeAttentionWrapper, prefix 32768 + suffix 128, "
     "batch 128 decode (speedup)",
     "05_cascade/p32768_b128_s128", "peer_flashinfer_cascade/p32768_b128_s128", 2.00, ">=speedup"),
    ("05_cascade vs 03_split_kv on the flat page tables, prefix 32768 + suffix 128, batch 128 decode (speedup)",
     "05_cascade/p32768_b128_s128", "03_split_kv/p32768_b128_s128", 15.0, ">=speedup"),
    ("05_cascade vs FlashInfer's MultiLevelCascadeAttentionWrapper, append: prefix 8192, batch 16 x 256 "
     "queries (speedup)",
     "05_cascade/append_p8192_b16_q256", "peer_flashinfer_cascade/append_p8192_b16_q256", 1.00, ">=speedup"),
    ("05_cascade vs 04_tensor_core on the flat page tables, append: prefix 8192, batch 16 x 256 queries (speedup)",
     "05_cascade/append_p8192_b16_q256", "04_tensor_core/append_p8192_b16_q256", 1.00, ">=speedup"),
]
# The sweep grid, every decode shape of the cascade file (its "sweep" rows and the grid
# point the targets above use): stage 05 against the fastest flat stage on the same batch,
# each shape and the worst of them.
CASCADE_FLAT_STAGES = ("02_paged", "03_split_kv", "04_tensor_core")
CASCADE_SWEEP_GOAL = 0.98


# Stage 10 (MLA) on bench/shapes_mla.csv (a "num_heads" column): TFLOP/s ratios to FlashInfer's
# fa3 MLA backend, and the memory-bound shape's share of the read ceiling.
MLA_TARGETS = [
    ("mla vs FlashInfer fa3 MLA, batch 128 x kv 8192, 128 heads (TFLOP/s ratio)",
     "mla/mla_b128_kv8192_h128", "peer_flashinfer_mla_fa3/mla_b128_kv8192_h128", 1.00, ">="),
    ("mla vs FlashInfer fa3 MLA, batch 32 x kv 8192, 128 heads (TFLOP/s ratio)",
     "mla/mla_b32_kv8192_h128", "peer_flashinfer_mla_fa3/mla_b32_kv8192_h128", 1.00, ">="),
    ("mla vs FlashInfer fa3 MLA, batch 1 x kv 16384, 128 heads (TFLOP/s ratio)",
     "mla/mla_b1_kv16384_h128", "peer_flashinfer_mla_fa3/mla_b1_kv16384_h128", 1.00, ">="),
    ("mla vs FlashInfer fa3 MLA, batch 128 x kv 8192, 16 heads (TFLOP/s ratio)",
     "mla/mla_b128_kv8192_h16", "peer_flashinfer_mla_fa3/mla_b128_kv8192_h16", 1.00, ">="),
    ("mla, batch 128 x kv 8192, 16 heads: share of the read ceiling",
     "mla/mla_b128_kv8192_h16", None, 0.95, ">=read"),
]


def cascade_targets(shapes):
    """CASCADE_TARGETS, then one sweep target per decode shape of `shapes`."""
    sweep = [(f"05_cascade vs the fastest flat stage ({', '.join(CASCADE_FLAT_STAGES)}), {s['name']} (speedup)",
              f"05_cascade/{s['name']}", tuple(f"{st}/{s['name']}" for st in CASCADE_FLAT_STAGES),
              CASCADE_SWEEP_GOAL, ">=speedup") for s in shapes if s["mode"] == "decode"]
    return CASCADE_TARGETS + sweep


def time_us(row):
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[row.get("time_unit", "ns")]
    return row["real_time"] * scale


def target(text, num, den, goal, how, by_name):
    """One speed goal computed from this run's median rows `by_name`: "ratio" and "met", or
    "met": None and the "missing" rows. how: ">=" (num's rate over den's: TFLOP/s where num
    has it, else GB/s), "<=time" (num's time over den's) or ">=speedup" (den's time over
    num's), ">=ceiling" (num's share of the run's ceiling, its pct_of_ceiling / 100, the
    ceiling every "% of" column uses) or ">=read" (its pct_of_read_ceiling / 100). A tuple `den` is the fastest of its rows that ran;
    "denominator" names it."""
    t = {"target": text, "numerator": num, "denominator": den, "goal": f"{how[:2]} {goal:.2f}"}
    if isinstance(den, tuple):
        t["candidates"] = list(den)
        ran = [n for n in den if n in by_name]
        den = t["denominator"] = min(ran, key=lambda n: time_us(by_name[n])) if ran else None
    if how in (">=ceiling", ">=read"):
        key = "pct_of_ceiling" if how == ">=ceiling" else "pct_of_read_ceiling"
        if num in by_name and key in by_name[num]:
            t["ratio"] = round(float(by_name[num][key]) / 100, 4)
            t["met"] = t["ratio"] >= goal
        else:
            t["met"], t["missing"] = None, [num]
        return t
    if num in by_name and den in by_name:
        if how == "<=time":
            ratio = by_name[num]["real_time"] / by_name[den]["real_time"]
            t["met"] = ratio <= goal
        elif how == ">=speedup":
            ratio = time_us(by_name[den]) / time_us(by_name[num])
            t["met"] = ratio >= goal
        else:
            unit = "TFLOP/s" if "TFLOP/s" in by_name[num] else "GB/s"
            ratio = by_name[num][unit] / by_name[den][unit]
            t["met"] = ratio >= goal
        t["ratio"] = round(ratio, 4)
    else:
        t["met"] = None
        t["missing"] = [n for n in (num, *t.get("candidates", [den])) if n not in by_name]
    return t


def worst_of_sweep(sweep):
    """The summary of the cascade sweep's targets: the lowest ratio and its rows; met when
    every shape was measured and none is below the goal, missed when one is below (whatever
    is missing), otherwise not measured."""
    measured = [t for t in sweep if "ratio" in t]
    worst = min(measured, key=lambda x: x["ratio"]) if measured else sweep[0]
    t = {"target": f"05_cascade vs the fastest flat stage, worst of the {len(sweep)} decode shapes (speedup)",
         "numerator": worst["numerator"], "denominator": worst["denominator"],
         "goal": f">= {CASCADE_SWEEP_GOAL:.2f}", "measured": len(measured)}
    if measured:
        t["ratio"] = worst["ratio"]
    if measured and worst["ratio"] < CASCADE_SWEEP_GOAL:
        t["met"] = False
    elif measured and len(measured) == len(sweep):
        t["met"] = True
    else:
        t["met"] = None
    if len(measured) < len(sweep):
        t["missing"] = [x["numerator"] for x in sweep if "ratio" not in x]
    return t


def source_state(path):
    """(commit, tree) of the source the run was built from: tree is clean, modified or unknown."""
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            fields = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
        return fields.get("commit", "unknown"), fields.get("tree", "unknown")
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=True, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain"], check=True, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
        return commit, "clean" if not status.strip() else "modified"
    except (OSError, subprocess.CalledProcessError):
        return "unknown", "unknown"


def shape_key(s):
    """bench/shapes.py's shape_key as a list, as a peers file's JSON "key" reads."""
    return list(key_of(s))


def peer_median_row(r, shape_name, label, unit, ceiling, read_ceiling=None):
    """A peer's timing `r` from bench/peers/attention.py as a Google Benchmark median row named
    peer_<impl>/<shape_name>: its `unit` ("GB/s" with r's bytes, or "TFLOP/s" with its
    flops) and that as a percentage of `ceiling`, the run's ceiling in the same unit, and
    of `read_ceiling` (GB/s rows, where the run measured it)."""
    name = f"peer_{r['impl']}/{shape_name}"
    amount = "flops" if unit == "TFLOP/s" else "bytes"
    row = {"name": name + "_median", "run_name": name, "run_type": "aggregate",
           "aggregate_name": "median", "repetitions": len(r["repetition_means_us"]),
           "iterations": len(r["repetition_means_us"]), "real_time": r["median_us"],
           "cpu_time": r["median_us"], "time_unit": "us", unit: r[unit], amount: r[amount],
           "pct_of_ceiling": 100.0 * r[unit] / ceiling, "label": label}
    if unit == "GB/s" and read_ceiling:
        row["pct_of_read_ceiling"] = 100.0 * r[unit] / read_ceiling
    # a cascade peer's shared-level flops and its largest difference from the flat peers;
    # a decode peer's largest difference from cuDNN SDPA's output on the same K/V
    row.update({k: r[k] for k in ("shared_flops", "max_abs_diff_vs_flat", "max_abs_diff_vs_cudnn") if k in r})
    return row


def load_peers(paths):
    """The peers files of one run (bench/peers/attention.py, once or once per family) as one: their
    rows in order (where two files time the same peer on the same shape, the later file's
    row replaces the earlier's), the first file's versions, complete when every file is;
    a file that does not exist (the peers step cut short before its first shape) is
    skipped, said so."""
    merged = {"results": []}
    files = []
    for path in paths:
        if not os.path.exists(path):
            print(f"note: no peers file {path}; the results hold the stages and ceilings only" if len(paths) == 1
                  else f"note: no peers file {path}")
            continue
        with open(path, encoding="utf-8") as f:
            files.append(json.load(f))
    rows = {}  # (impl, shape or sizes) -> row, in the order first seen
    for peers in files:
        for k, v in peers.items():
            if k != "results":
                merged.setdefault(k, v)
        for r in peers["results"]:
            rows[(r.get("impl"), r.get("shape") or str(r.get("key")))] = r
    merged["results"] = list(rows.values())
    merged["complete"] = bool(files) and len(files) == len(paths) and all(p.get("complete") for p in files)
    merged["flashinfer"] = next((p["flashinfer"] for p in files if p.get("flashinfer")), None)
    return merged


def main():
    p = parser(__doc__, results=None, check=False, repo=False)
    p.add_argument("--bench", required=True)
    p.add_argument("--peers", required=True, action="append",
                   help="bench/peers/attention.py's JSON; again for another peers file of the same run")
    p.add_argument("--shapes", required=True)
    p.add_argument("--source-state", help="source-state.txt of the build folder (default: beside --bench's "
                   "binaries, i.e. <build>/source-state.txt when --bench is under <build>/)")
    p.add_argument("--command", default="", help="the command that produced the run, recorded as given")
    p.add_argument("--note", default="", help="what this version changed (shown in the chapters' history)")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    with open(a.bench, encoding="utf-8") as f:
        bench = json.load(f)
    peers = load_peers(a.peers)  # a peers step that wrote nothing (cut short): stages only
    ctx = bench.setdefault("context", {})
    ctx.pop("executable", None)  # a path on the machine that ran it
    state_file = a.source_state
    if not state_file:  # <build>/gpu-run/bench.json -> <build>/source-state.txt
        d = os.path.dirname(os.path.abspath(a.bench))
        state_file = next((os.path.join(x, "source-state.txt") for x in (d, os.path.dirname(d))
                           if os.path.exists(os.path.join(x, "source-state.txt"))), None)
    commit, tree = source_state(state_file)
    ctx["commit"] = commit + ("-dirty" if tree == "modified" else "")
    copy_gbps = float(ctx["copy_ceiling_GB/s"])
    read_gbps = float(ctx["read_ceiling_GB/s"]) if "read_ceiling_GB/s" in ctx else None  # absent before it existed

    shapes = load_shapes(a.shapes)
    prefill_file = bool(shapes) and "mode" in shapes[0]  # also bench/shapes_cascade.csv: rows name their shape
    mla_file = bool(shapes) and "num_heads" in shapes[0]  # bench/shapes_mla.csv
    cascade_file = prefill_file and "shared_prefix" in shapes[0]
    gemm_tflops = float(ctx.get("gemm_bf16_ceiling_TFLOP/s", "nan"))
    for s in shapes:
        for r in peers["results"]:
            if "median_us" not in r or "error" in r:  # not timed, or timed and marked wrong
                continue
            if "shape" in r:  # bench/peers/ names the shape of prefill- and cascade-file rows and FlashInfer's
                if r["shape"] != s["name"]:
                    continue
                label = f"{s['dtype']} {r.get('note', '')}, {r['mode']}" if r.get("note") else f"{s['dtype']}, {r['mode']}"
            else:  # a decode file's SDPA rows: keyed by the sizes they ran
                if r.get("key") != shape_key(s):
                    continue
                label = f"{s['dtype']} contiguous, {r['gqa']}, {r['mode']}"
            unit, ceiling = ("TFLOP/s", gemm_tflops) if "TFLOP/s" in r else ("GB/s", copy_gbps)
            bench["benchmarks"].append(peer_median_row(r, s["name"], label, unit, ceiling, read_gbps))

    by_name = {base_name(b): b for b in bench["benchmarks"] if b.get("aggregate_name") == "median"}
    if cascade_file:
        targets = [target(*x, by_name) for x in cascade_targets(shapes)]
        fixed, sweep = targets[:len(CASCADE_TARGETS)], targets[len(CASCADE_TARGETS):]
        targets = fixed + ([worst_of_sweep(sweep)] if sweep else []) + sweep
    else:
        decode_h200 = os.path.basename(a.shapes) == DECODE_H200_FILE
        chosen = (MLA_TARGETS if mla_file else PREFILL_TARGETS if prefill_file else
                  DECODE_H200_TARGETS if decode_h200 else TARGETS)
        targets = [target(*x, by_name) for x in chosen]
    bench["flashstep"] = {
        "note": a.note,
        "targets": targets,
        "peers": {k: peers.get(k) for k in ("device", "torch", "cuda", "cudnn")},
        # bench/peers/attention.py sets "complete" when it reaches its end; a run cut short keeps the
        # shapes it finished, and says so here
        "peers_complete": bool(peers.get("complete")),
        "peer_errors": [r for r in peers["results"] if "error" in r],
        "shapes_file": a.shapes,
        "command": a.command,
        "tree": tree,
    }
    if peers.get("flashinfer"):  # the version FlashInfer's rows ran with
        bench["flashstep"]["peers"]["flashinfer"] = peers["flashinfer"]
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(bench, f, indent=1)
    if tree != "clean":
        print(f"note: built from a tree that is {tree} (commit {ctx['commit']}); not for docs/results/")
    for t in targets:
        verdict = {True: "MET ", False: "MISS", None: "n/a "}[t["met"]]
        print(f"{verdict} {t.get('ratio', float('nan')):7.3f} ({t['goal']})  {t['target']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
