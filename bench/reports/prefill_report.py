#!/usr/bin/env python3
"""Writes stage 04's measured section from one results JSON of bench/shapes_prefill.csv.

    python3 bench/reports/prefill_report.py --results docs/results/04_tensor_core/NAME.json [--repo .] [--check]

The section between `<!-- prefill results:begin -->` and `<!-- prefill results:end -->` of
stages/04_tensor_core/README.md becomes: provenance (file, device, commit, date, the
ceilings), one summary table (the speed goals merge_results.py recorded, met or missed;
the highest % of the GEMM and copy ceilings; the ratios to each peer as a range over the
shapes), a pointer to the docs site's results page (every row of the run) and the plot.
--full prints, and writes nothing, the per-shape tables: the prefill shapes (TFLOP/s, %
of the run's cuBLAS bf16 GEMM, the ratios to FlashInfer's fa2 and fa3 prefill and to
cuDNN SDPA) and the decode shapes (GB/s, % of the copy ceiling, ratios to cuDNN SDPA and
FlashInfer's tensor-core decode). The plot, docs/results/04_tensor_core/prefill_tflops.png
(TFLOP/s per prefill shape, stage and peers), needs matplotlib (e.g. Debian's python3-matplotlib).
Every number comes from the JSON; a peer that did not run shows "–". --check only
reports whether the section is up to date (exit 1 if not).
"""
import os
import sys

from common import (context, fmt, load_shapes, parser, ratio, results_path, run_of_shapes, save_plot, value,
                    write_section)  # bench/reports/
from plot_style import series_styles  # bench/reports/

# Markers of its own (as stage 03's sweep has): bench/reports/decode_report.py and the docs test of its
# sections leave this one to this script.
BEGIN, END = "<!-- prefill results:begin -->", "<!-- prefill results:end -->"
STAGE, RAGGED = "04_tensor_core", "04_tensor_core_ragged"



PLOT = "prefill_tflops.png"
SERIES = [(f"{STAGE}/", "04_tensor_core (paged)"), (f"{RAGGED}/", "04_tensor_core (ragged)"),
          ("peer_flashinfer_fa2/", "FlashInfer fa2"), ("peer_flashinfer_fa3/", "FlashInfer fa3"),
          ("peer_torch_sdpa_cudnn/", "cuDNN SDPA"), ("peer_torch_sdpa_flash/", "flash SDPA")]


def plot_tflops(run, rows, shapes, out_png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [s for s in shapes if s["mode"] == "prefill"]
    series = [(p, label) for p, label in SERIES if any(f"{p}{s['name']}" in rows for s in shown)]
    width = 0.8 / max(1, len(series))
    styles = series_styles([p.rstrip("/") for p, _ in series])  # a colour and a hatch each, none shared
    fig, ax = plt.subplots(figsize=(10, 4.2))
    for k, (prefix, label) in enumerate(series):
        ys = [value(rows, f"{prefix}{s['name']}", "TFLOP/s") or 0 for s in shown]
        ax.bar([i + (k - (len(series) - 1) / 2) * width for i in range(len(shown))], ys, width, label=label,
               **styles[prefix.rstrip("/")].bar)
    ax.set_xticks(range(len(shown)))
    ax.set_xticklabels([s["name"] for s in shown], rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s (visible pairs x 4 x head_dim / time)")
    gemm = float(context(run)["gemm_bf16_ceiling_TFLOP/s"])
    ax.axhline(gemm, color="gray", linestyle="--", linewidth=0.8)
    ax.text(len(shown) - 0.5, gemm, "cuBLAS bf16 GEMM", ha="right", va="bottom", fontsize=7, color="gray")
    ax.set_title(f"Prefill — {context(run).get('device', '')}, commit {context(run).get('commit', '')}",
                 fontsize=9)
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    fig.tight_layout()
    save_plot(fig, out_png)


def section(path, run, rows, shapes, repo):
    """The chapter's section: provenance, ONE summary table (the goals merge_results.py
    recorded, with ratio and verdict; stage 04's highest % of the GEMM and copy ceilings;
    its ratio to each peer as a range over the shapes), the plot, and a pointer to the
    results page, which shows every row of the run (--full prints the per-shape tables)."""
    head = 4 if run["raw"].get("flashstep", {}).get("note", "") else 2  # provenance and the run's note
    out = full_tables(path, run, rows, shapes, repo).split("\n")[:head]
    out += ["| measured | value | goal | met |", "|:--|--:|--:|:--|"]
    for t in run["raw"].get("flashstep", {}).get("targets", []):
        verdict = {True: "yes", False: "**no**", None: "not measured"}[t.get("met")]
        r = f"{t['ratio']:.2f}" if "ratio" in t else "–"
        out.append(f"| {t['target']} | {r} | {t['goal']} | {verdict} |")
    for mode, unit, ceiling in (("prefill", "TFLOP/s", "cuBLAS bf16 GEMM"), ("decode", "GB/s", "copy")):
        ours = [s for s in shapes if s["mode"] == mode and value(rows, f"{STAGE}/{s['name']}", unit) is not None]
        pct = [(value(rows, f"{STAGE}/{s['name']}", "pct_of_ceiling"), s["name"]) for s in ours
               if value(rows, f"{STAGE}/{s['name']}", "pct_of_ceiling") is not None]
        if pct:
            best = max(pct)
            out.append(f"| 04 paged, % of the {ceiling} ceiling, highest over {len(ours)} {mode} shapes "
                       f"(`{best[1]}`) | {fmt(best[0])} | | |")
        for peer, label in PEERS_OF[mode]:
            rr = [(ratio(value(rows, f"{STAGE}/{s['name']}", unit), value(rows, f"{peer}/{s['name']}", unit)),
                   s["name"]) for s in ours]
            rr = [x for x in rr if x[0] is not None]
            if rr:
                lo, hi = min(rr), max(rr)
                out.append(f"| 04 paged / {label} ({unit}), over {len(rr)} {mode} shapes: lowest (`{lo[1]}`) - "
                           f"highest (`{hi[1]}`) | {lo[0]:.2f}x - {hi[0]:.2f}x | | |")
    out += ["", f"![Prefill TFLOP/s, stage 04 and peers](../../docs/results/04_tensor_core/{PLOT})", "",
            f"Every row of `{os.path.relpath(path, repo)}` (each shape's TFLOP/s or GB/s for stage 04, paged and "
            "ragged, and for every peer) is on the docs site's results page, generated from "
            f"[{os.path.relpath(os.path.dirname(path), repo)}](../../{os.path.relpath(os.path.dirname(path), repo)}/) "
            "by `scripts/docs_results.py`; `bench/reports/prefill_report.py --full` prints the per-shape tables."]
    return "\n".join(out)


# The peers the summary gives a range of ratios to, per kind of shape (row prefix, label).
PEERS_OF = {"prefill": (("peer_flashinfer_fa2", "FlashInfer fa2"), ("peer_flashinfer_fa3", "FlashInfer fa3"),
                        ("peer_torch_sdpa_cudnn", "cuDNN SDPA")),
            "decode": (("peer_torch_sdpa_cudnn", "cuDNN SDPA"),
                       ("peer_flashinfer_tc_decode", "FlashInfer tensor-core decode"))}


def full_tables(path, run, rows, shapes, repo):
    """The per-shape tables and the goals as a list (--full prints them)."""
    ctx = context(run)
    out = [f"Generated by `bench/reports/prefill_report.py` from `{os.path.relpath(path, repo)}`: "
           f"{ctx.get('device', '?')}, commit `{ctx.get('commit', '?')}`, {ctx.get('date', '?')}. "
           f"Ceilings measured in the same process: cuBLAS bf16 GEMM "
           f"{fmt(float(ctx['gemm_bf16_ceiling_TFLOP/s']))} TFLOP/s, device-to-device copy "
           f"{fmt(float(ctx['copy_ceiling_GB/s']))} GB/s. Each number is the median of 5 repetitions "
           f"of CUDA-event-timed calls, L2 flushed before each call.", ""]
    note = run["raw"].get("flashstep", {}).get("note", "")
    if note:
        out += [f"Note recorded with this run: {note}.", ""]
    out += ["| shape | causal | 04 paged TFLOP/s | % of GEMM | 04 ragged TFLOP/s | FlashInfer fa2 | "
            "FlashInfer fa3 | cuDNN SDPA | flash SDPA | 04 / fa2 | 04 / fa3 | 04 / cuDNN |",
            "|:--|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for s in shapes:
        if s["mode"] != "prefill":
            continue
        n = s["name"]
        t = value(rows, f"{STAGE}/{n}", "TFLOP/s")
        pct = value(rows, f"{STAGE}/{n}", "pct_of_ceiling")
        fa2 = value(rows, f"peer_flashinfer_fa2/{n}", "TFLOP/s")
        fa3 = value(rows, f"peer_flashinfer_fa3/{n}", "TFLOP/s")
        cudnn = value(rows, f"peer_torch_sdpa_cudnn/{n}", "TFLOP/s")
        flash = value(rows, f"peer_torch_sdpa_flash/{n}", "TFLOP/s")
        rr = ratio(t, fa2), ratio(t, fa3), ratio(t, cudnn)
        out.append(f"| `{n}` | {'yes' if s['causal'] == '1' else 'no'} | {fmt(t)} | {fmt(pct)} | "
                   f"{fmt(value(rows, f'{RAGGED}/{n}', 'TFLOP/s'))} | {fmt(fa2)} | {fmt(fa3)} | {fmt(cudnn)} | "
                   f"{fmt(flash)} | " + " | ".join("–" if x is None else f"{x:.2f}x" for x in rr) + " |")
    out += ["", "| decode shape | heads | 04 paged GB/s | % of copy | cuDNN SDPA | flash SDPA | "
            "FlashInfer tensor-core decode | 04 / cuDNN | 04 / FlashInfer |", "|:--|:--|--:|--:|--:|--:|--:|--:|--:|"]
    for s in shapes:
        if s["mode"] != "decode":
            continue
        n = s["name"]
        g = value(rows, f"{STAGE}/{n}", "GB/s")
        cudnn = value(rows, f"peer_torch_sdpa_cudnn/{n}", "GB/s")
        fi = value(rows, f"peer_flashinfer_tc_decode/{n}", "GB/s")
        rr = ratio(g, cudnn), ratio(g, fi)
        out.append(f"| `{n}` | {s['num_qo_heads']}/{s['num_kv_heads']} | {fmt(g)} | "
                   f"{fmt(value(rows, f'{STAGE}/{n}', 'pct_of_ceiling'))} | {fmt(cudnn)} | "
                   f"{fmt(value(rows, f'peer_torch_sdpa_flash/{n}', 'GB/s'))} | {fmt(fi)} | "
                   + " | ".join("–" if x is None else f"{x:.2f}x" for x in rr) + " |")
    out += ["", f"![Prefill TFLOP/s, stage 04 and peers](../../docs/results/04_tensor_core/{PLOT})"]
    targets = run["raw"].get("flashstep", {}).get("targets", [])
    if targets:
        out += ["", "Speed goals of this run (computed by `bench/reports/merge_results.py`):", ""]
        for t in targets:
            verdict = {True: "met", False: "missed", None: "not measured"}[t.get("met")]
            r = f"{t['ratio']:.2f}" if "ratio" in t else "–"
            out.append(f"- {t['target']}: {r} (goal {t['goal']}), {verdict}")
    return "\n".join(out)


def main():
    ap = parser(__doc__, what="results JSON of a bench/shapes_prefill.csv run")
    ap.add_argument("--full", action="store_true", help="print the per-shape tables (the chapter shows a summary)")
    a = ap.parse_args()
    found = run_of_shapes(a.results, "shapes_prefill.csv", "prefill_report.py")
    if found is None:
        return 2
    run, rows = found
    chapter = os.path.join(a.repo, "stages", "04_tensor_core", "README.md")
    shapes = load_shapes(a.repo, "shapes_prefill.csv")
    if a.full:
        print(full_tables(a.results, run, rows, shapes, a.repo))
        return 0
    rc = write_section(chapter, BEGIN, END, "prefill_report.py", a.repo,
                       lambda: section(a.results, run, rows, shapes, a.repo), a.check,
                       lambda: plot_tflops(run, rows, shapes, results_path(a.repo, "04_tensor_core", PLOT)))
    if rc == 0 and not a.check:
        print(f"wrote {os.path.relpath(chapter, a.repo)}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
