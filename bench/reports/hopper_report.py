#!/usr/bin/env python3
"""Writes stage 07's measured sections from one results JSON of bench/shapes_prefill.csv
and the step runs of the same GPU run.

    python3 bench/reports/hopper_report.py --results docs/results/07_hopper/NAME.json \\
        [--step docs/results/07_hopper/NAME_step1.json ...] [--repo .] [--check]

Between `<!-- hopper results:begin -->` and `<!-- hopper results:end -->` of
stages/07_hopper/README.md: provenance (file, device, commit, date, ceilings), one summary
table (the goals with ratio and verdict, the highest % of the GEMM ceiling, the ratios to
stage 04 and the peers as ranges over the shapes) and a pointer to the docs site's results
page (every row of the run). --full writes nothing and prints the per-shape tables: the
prefill shapes stage 07 runs (TFLOP/s over ragged K/V, % of the run's cuBLAS bf16 GEMM,
stage 07 over the same K/V in pages of the shape's page size, stage 04 on the ragged K/V,
FlashInfer's fa2 and fa3 (its paged wrapper), cuDNN and flash SDPA, and the ratios), the
large-group decode shapes, then the speed goals merge_results.py recorded, met or missed. Between `<!-- hopper
steps:begin -->` and `<!-- hopper steps:end -->`: the "how it got there" table, one row per
--step file (a Google Benchmark JSON of an earlier commit's flashstep_bench on
bench/shapes_hopper.csv, run in the same GPU run; its commit is in the file's
"flashstep_step" entry), the last one this commit's. Every number comes from the JSON
files; a row a run did not measure shows "–". --check only reports whether the sections
are up to date (exit 1 if not).
"""
import os
import sys

from common import by_name, context, fmt, load, load_shapes, parser, ratio, run_of_shapes, value, write_section  # bench/reports/

BEGIN, END = "<!-- hopper results:begin -->", "<!-- hopper results:end -->"
STEPS_BEGIN, STEPS_END = "<!-- hopper steps:begin -->", "<!-- hopper steps:end -->"
STAGE, STAGE_PAGED, STAGE_04 = "07_hopper_ragged", "07_hopper", "04_tensor_core_ragged"
STEP_SHAPES = ("b4_q4096_causal", "b4_q4096", "b1_q16384_causal", "b1_q16384")



def x(r):
    return "–" if r is None else f"{r:.2f}x"


def section(path, run, rows, shapes, repo):
    """The chapter's section: provenance, ONE summary table (the goals merge_results.py
    recorded, with ratio and verdict; the highest % of the GEMM ceiling; the ratios to stage
    04 and the peers as ranges over the shapes), and a pointer to the results page, which
    shows every row of the run (--full prints the per-shape tables)."""
    out = full_tables(path, run, rows, shapes, repo).split("\n")[:2]
    out += ["| measured | value | goal | met |", "|:--|--:|--:|:--|"]
    for t in run["raw"].get("flashstep", {}).get("targets", []):
        if not t["target"].startswith("07_"):
            continue
        verdict = {True: "yes", False: "**no**", None: "not measured"}[t.get("met")]
        r = f"{t['ratio']:.2f}" if "ratio" in t else "–"
        out.append(f"| {t['target']} | {r} | {t['goal']} | {verdict} |")
    prefill = [s for s in shapes if s["mode"] == "prefill" and value(rows, f"{STAGE}/{s['name']}") is not None]
    pct = [(value(rows, f"{STAGE}/{s['name']}", "pct_of_ceiling"), s["name"]) for s in prefill
           if value(rows, f"{STAGE}/{s['name']}", "pct_of_ceiling") is not None]
    if pct:
        best = max(pct)
        out.append(f"| 07, % of the cuBLAS bf16 GEMM ceiling, highest over {len(prefill)} prefill shapes "
                   f"(`{best[1]}`) | {fmt(best[0])} | | |")
    for mode, unit, num, label, den in (
            ("prefill", "TFLOP/s", STAGE, "07 / 04 (ragged)", STAGE_04),
            ("prefill", "TFLOP/s", STAGE, "07 / FlashInfer fa3", "peer_flashinfer_fa3"),
            ("prefill", "TFLOP/s", STAGE, "07 / cuDNN SDPA", "peer_torch_sdpa_cudnn"),
            ("prefill", "TFLOP/s", STAGE_PAGED, "07 paged / FlashInfer fa3", "peer_flashinfer_fa3"),
            ("decode", "GB/s", STAGE_PAGED, "07 paged / cuDNN SDPA", "peer_torch_sdpa_cudnn")):
        rr = [(ratio(value(rows, f"{num}/{s['name']}", unit), value(rows, f"{den}/{s['name']}", unit)), s["name"])
              for s in shapes if s["mode"] == mode]
        rr = [r for r in rr if r[0] is not None]
        if rr:
            lo, hi = min(rr), max(rr)
            out.append(f"| {label} ({unit}), over {len(rr)} {mode} shapes: lowest (`{lo[1]}`) - highest "
                       f"(`{hi[1]}`) | {x(lo[0])} - {x(hi[0])} | | |")
    folder = os.path.relpath(os.path.dirname(path), repo)
    out += ["", f"Every row of `{os.path.relpath(path, repo)}` (each shape's TFLOP/s or GB/s for stages 07 and 04, "
            "paged and ragged, and for every peer) is on the docs site's results page, generated from "
            f"[{folder}](../../{folder}/) by `scripts/docs_results.py`; `bench/reports/hopper_report.py --full` "
            "prints the per-shape tables."]
    return "\n".join(out)


def full_tables(path, run, rows, shapes, repo):
    """Provenance, the prefill and decode tables and the goals (--full prints them)."""
    ctx = context(run)
    out = [f"Generated by `bench/reports/hopper_report.py` from `{os.path.relpath(path, repo)}`: "
           f"{ctx.get('device', '?')}, commit `{ctx.get('commit', '?')}`, {ctx.get('date', '?')}. "
           f"Ceilings measured in the same process: cuBLAS bf16 GEMM "
           f"{fmt(float(ctx['gemm_bf16_ceiling_TFLOP/s']))} TFLOP/s. Each number is the median of 5 repetitions "
           f"of CUDA-event-timed calls, L2 flushed before each call; TFLOP/s counts 4 x head_dim flops per "
           f"(query, key) pair the mask lets through, per query head.", "",
           "| shape | causal | 07 TFLOP/s | % of GEMM | 07 paged | 04 (ragged) | FlashInfer fa2 | FlashInfer fa3 | "
           "cuDNN SDPA | flash SDPA | 07 / 04 | 07 / fa3 | 07 / cuDNN | paged / fa3 |",
           "|:--|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for s in shapes:
        n = s["name"]
        if s["mode"] != "prefill":
            continue
        t, paged = value(rows, f"{STAGE}/{n}"), value(rows, f"{STAGE_PAGED}/{n}")
        t04, fa3, cudnn = value(rows, f"{STAGE_04}/{n}"), value(rows, f"peer_flashinfer_fa3/{n}"), \
            value(rows, f"peer_torch_sdpa_cudnn/{n}")
        out.append(f"| `{n}` | {'yes' if s['causal'] == '1' else 'no'} | {fmt(t)} | "
                   f"{fmt(value(rows, f'{STAGE}/{n}', 'pct_of_ceiling'))} | {fmt(paged)} | {fmt(t04)} | "
                   f"{fmt(value(rows, f'peer_flashinfer_fa2/{n}'))} | {fmt(fa3)} | {fmt(cudnn)} | "
                   f"{fmt(value(rows, f'peer_torch_sdpa_flash/{n}'))} | {x(ratio(t, t04))} | {x(ratio(t, fa3))} | "
                   f"{x(ratio(t, cudnn))} | {x(ratio(paged, fa3))} |")
    decode = [s for s in shapes if s["mode"] == "decode"]
    if decode:
        out += ["", "Large-group decode (GB/s: q, K, V, o and lse bytes over the time; the paged rows read the "
                "shape's page table, the ragged row the same keys contiguous):", "",
                "| shape | 07 paged | 07 ragged | 04 (paged) | FlashInfer tensor-core decode | cuDNN SDPA | flash SDPA | "
                "07 paged / cuDNN |", "|:--|--:|--:|--:|--:|--:|--:|--:|"]
        for s in decode:
            n = s["name"]
            paged, cudnn = value(rows, f"{STAGE_PAGED}/{n}", "GB/s"), value(rows, f"peer_torch_sdpa_cudnn/{n}", "GB/s")
            out.append(f"| `{n}` | {fmt(paged)} | {fmt(value(rows, f'{STAGE}/{n}', 'GB/s'))} | "
                       f"{fmt(value(rows, f'04_tensor_core/{n}', 'GB/s'))} | "
                       f"{fmt(value(rows, f'peer_flashinfer_tc_decode/{n}', 'GB/s'))} | {fmt(cudnn)} | "
                       f"{fmt(value(rows, f'peer_torch_sdpa_flash/{n}', 'GB/s'))} | {x(ratio(paged, cudnn))} |")
    targets = [t for t in run["raw"].get("flashstep", {}).get("targets", []) if t["target"].startswith("07_")]
    if targets:
        out += ["", "Speed goals of this run (computed by `bench/reports/merge_results.py`):", ""]
        for t in targets:
            verdict = {True: "met", False: "missed", None: "not measured"}[t.get("met")]
            r = f"{t['ratio']:.2f}" if "ratio" in t else "–"
            out.append(f"- {t['target']}: {r} (goal {t['goal']}), {verdict}")
    return "\n".join(out)


def steps_section(step_files, repo):
    out = ["| step | commit | " + " | ".join(f"`{s}`" for s in STEP_SHAPES) + " |",
           "|:--|:--|" + "--:|" * len(STEP_SHAPES)]
    entries = []
    for path in step_files:
        run = load(path)
        rows = by_name(run)
        step = run["raw"].get("flashstep_step", {})
        entries.append((step.get("label", os.path.basename(path)), step.get("commit", "?"), rows, path))
    for label, commit, rows, _ in entries:
        out.append(f"| {label} | `{commit}` | " +
                   " | ".join(fmt(value(rows, f"{STAGE}/{s}")) for s in STEP_SHAPES) + " |")
    out += ["", "TFLOP/s of stage 07 on bench/shapes_hopper.csv's shapes (bf16, head_dim 128, 32/8 heads); every "
            "row was measured in the same GPU run (files: " +
            ", ".join(f"`{os.path.relpath(p, repo)}`" for *_, p in entries) + ")."]
    return "\n".join(out)


def main():
    ap = parser(__doc__, what="results JSON of a bench/shapes_prefill.csv run")
    ap.add_argument("--step", action="append", default=[], help="an earlier step's Google Benchmark JSON")
    ap.add_argument("--full", action="store_true", help="print the per-shape tables (the chapter shows a summary)")
    a = ap.parse_args()
    found = run_of_shapes(a.results, "shapes_prefill.csv", "hopper_report.py")
    if found is None:
        return 2
    run, rows = found
    chapter = os.path.join(a.repo, "stages", "07_hopper", "README.md")
    shapes = load_shapes(a.repo, "shapes_prefill.csv")
    if a.full:
        print(full_tables(a.results, run, rows, shapes, a.repo))
        return 0
    rc = write_section(chapter, BEGIN, END, "hopper_report.py", a.repo,
                       lambda: section(a.results, run, rows, shapes, a.repo), a.check)
    rc = rc or write_section(chapter, STEPS_BEGIN, STEPS_END, "hopper_report.py", a.repo,
                             lambda: steps_section(a.step, a.repo), a.check)
    if rc == 0 and not a.check:
        print(f"wrote {os.path.relpath(chapter, a.repo)}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
