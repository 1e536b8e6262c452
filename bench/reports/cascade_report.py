#!/usr/bin/env python3
"""Writes stage 05's measured section from one results JSON of bench/shapes_cascade.csv.

    python3 bench/reports/cascade_report.py --results docs/results/05_cascade/NAME.json [--repo .] [--check]

The section between `<!-- cascade results:begin -->` and `<!-- cascade results:end -->` of
stages/05_cascade/README.md becomes: provenance (file, device, commit, date, the ceilings,
the command), one summary table (the goals with ratio and verdict, the shared level's
throughput, the speedups as ranges over the decode shapes), the plot, the peers that did
not run and a pointer to the docs site's results page (every row of the run). --full
writes nothing and prints the full tables: one of the decode shapes and one of the append shapes (times in µs of
stage 05 as its plan chose, with the path it chose, and with its path forced where the run
has those rows; the flat stages; FlashInfer's two-level cascade, its flat decode on CUDA
cores and on tensor cores or its flat fa2 prefill; cuDNN SDPA on a contiguous copy; and the
speedups), the shared level's flops and throughput where the rows carry them, the peers
that did not run, and the speed goals merge_results.py recorded, met or missed; and the
plot docs/results/05_cascade/cascade_sweep.png (needs matplotlib), which the section shows: per decode
shape, stage 05's speedup over the fastest flat stage and FlashInfer's cascade over its
fastest flat decode. Every number comes from the JSON; a row the run lacks shows "–".
The markers are the chapter's: without them nothing is written (exit 2). --check only
reports whether the section is up to date (exit 1 if not).
"""
import os
import re
import sys

from common import (context, fmt, load_shapes, parser, ratio, results_path, run_of_shapes, save_plot,
                    write_section)  # bench/reports/
from plot_style import series_styles  # bench/reports/

# Markers of its own: bench/reports/decode_report.py and the docs test of its sections leave this one to
# this script.
BEGIN, END = "<!-- cascade results:begin -->", "<!-- cascade results:end -->"
STAGE = "05_cascade"
FORCED = [(f"{STAGE}[cascade]", "05 cascade forced"), (f"{STAGE}[flat]", "05 flat forced")]
FLAT_STAGES = ["02_paged", "03_split_kv", "04_tensor_core"]
FI_CASCADE = "peer_flashinfer_cascade"
FI_FLAT_DECODE = [("peer_flashinfer_cuda_core_decode", "FlashInfer flat decode, CUDA cores"),
                  ("peer_flashinfer_tc_decode", "FlashInfer flat decode, tensor cores")]
FI_FLAT_PREFILL = [("peer_flashinfer_fa2", "FlashInfer flat fa2 prefill")]
CUDNN = "peer_torch_sdpa_cudnn"
PLOT = "cascade_sweep.png"
SWEEP_GOAL = 0.98  # stage 05 over the fastest flat stage, every decode shape (bench/reports/merge_results.py)


def us(rows, name):
    """The median time of row `name` in µs, or None where the run has no such row."""
    r = rows.get(name)
    return None if r is None else r["median_us"]


def times(x):
    return "–" if x is None else f"{x:.2f}x"


def fastest(rows, names):
    """(name, µs) of the fastest of `names` in the run, or (None, None)."""
    ran = [(n, us(rows, n)) for n in names if n in rows]
    return min(ran, key=lambda x: x[1]) if ran else (None, None)


def best_flat(rows, n):
    return fastest(rows, [f"{st}/{n}" for st in FLAT_STAGES])


def fi_best_flat(rows, s):
    flat = FI_FLAT_DECODE if s["mode"] == "decode" else FI_FLAT_PREFILL
    return fastest(rows, [f"{p}/{s['name']}" for p, _ in flat])


def path_of(rows, n):
    """The path stage 05's plan chose on shape n, from its row's label."""
    label = rows.get(f"{STAGE}/{n}", {}).get("label", "")
    m = re.search(r"; cascade, (\d+) levels", label)
    if m:
        return f"cascade, {m.group(1)} levels"
    m = re.search(r"; flat via (\S+)", label)
    return f"flat ({m.group(1)})" if m else "–"


def shared_flops_of_shape(s):
    """The shared level's flops of shape s: every query against the prefix's whole pages."""
    page, prefix = int(s["page_size"]), int(s["shared_prefix"])
    queries = int(s["batch"]) * (1 if s["mode"] == "decode" else int(s["qo_len"]))
    return 4.0 * int(s["head_dim"]) * int(s["num_qo_heads"]) * queries * (prefix // page * page)


def sweep_order(shapes):
    """The decode shapes, grouped by prefix, then batch, then suffix."""
    dec = [s for s in shapes if s["mode"] == "decode"]
    return sorted(dec, key=lambda s: (int(s["shared_prefix"]), int(s["batch"]), int(s["kv_len"])))


def speedups(rows, s):
    """(stage 05 over the fastest flat stage, FlashInfer cascade over its fastest flat)."""
    n = s["name"]
    return (ratio(best_flat(rows, n)[1], us(rows, f"{STAGE}/{n}")),
            ratio(fi_best_flat(rows, s)[1], us(rows, f"{FI_CASCADE}/{n}")))


def plot_sweep(run, rows, shapes, out_png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = sweep_order(shapes)
    pairs = [speedups(rows, s) for s in shown]
    fig, ax = plt.subplots(figsize=(11, 4.2))
    width = 0.38
    styles = series_styles(["05_cascade", "peer_flashinfer_cascade"])  # a colour and a hatch each
    for k, (label, key) in enumerate([("05_cascade / fastest flat stage (02, 03, 04)", "05_cascade"),
                                      ("FlashInfer cascade / its fastest flat decode", "peer_flashinfer_cascade")]):
        color = styles[key].color
        xs = [i + (k - 0.5) * width for i in range(len(shown))]
        ys = [p[k] for p in pairs]
        ax.bar([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], width,
               label=label, **styles[key].bar)
        for x, y in zip(xs, ys):
            if y is None:
                ax.text(x, 1.0, "n/a", ha="center", va="bottom", fontsize=6, rotation=90, color=color)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(SWEEP_GOAL, color="gray", linewidth=0.8, linestyle="--")
    ax.text(len(shown) - 0.5, SWEEP_GOAL, f"{SWEEP_GOAL:.2f}x", ha="right", va="top", fontsize=7, color="gray")
    ax.set_xticks(range(len(shown)))
    ax.set_xticklabels([f"b{s['batch']}\ns{s['kv_len']}" for s in shown], fontsize=7)
    prefixes = [s["shared_prefix"] for s in shown]
    start = 0
    for i in range(1, len(shown) + 1):  # one band per prefix length
        if i == len(shown) or prefixes[i] != prefixes[start]:
            if i < len(shown):
                ax.axvline(i - 0.5, color="gray", linewidth=0.6, linestyle=":")
            ax.text((start + i - 1) / 2, 1.02, f"shared prefix {prefixes[start]}", ha="center", va="bottom",
                    transform=ax.get_xaxis_transform(), fontsize=8)
            start = i
    ax.set_ylabel("speedup (flat time / cascade time)")
    ax.set_xlabel("batch (b) and unique suffix per request (s), decode, one query each")
    ctx = context(run)
    ax.set_title(f"Shared-prefix decode — {ctx.get('device', '')}, commit {ctx.get('commit', '')}", fontsize=9,
                 pad=18)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    save_plot(fig, out_png)


def table(rows, shown, columns):
    """A markdown table: `columns` are (header, right-aligned, cell(shape)); a column whose
    cells are all "–" is left out when its header ends with "?" (shown without the "?")."""
    cells = {h: [c(s) for s in shown] for h, _, c in columns}
    kept = [(h.rstrip("?"), right, cells[h]) for h, right, _ in columns
            if not (h.endswith("?") and all(x == "–" for x in cells[h]))]
    out = ["| " + " | ".join(h for h, _, _ in kept) + " |",
           "|" + "|".join("--:" if right else ":--" for _, right, _ in kept) + "|"]
    for i in range(len(shown)):
        out.append("| " + " | ".join(col[i] for _, _, col in kept) + " |")
    return out


def common_columns(rows):
    """The columns every table starts with: stage 05 as planned, and forced."""
    cols = [("05 path", False, lambda s: path_of(rows, s["name"])),
            ("05 µs", True, lambda s: fmt(us(rows, f"{STAGE}/{s['name']}")))]
    for name, head in FORCED:
        cols.append((f"{head} µs?", True, lambda s, name=name: fmt(us(rows, f"{name}/{s['name']}"))))
    return cols


def decode_table(rows, shapes):
    shown = sweep_order(shapes)
    if not shown:
        return []
    cols = [("shape", False, lambda s: f"`{s['name']}`"),
            ("prefix", True, lambda s: s["shared_prefix"]),
            ("batch", True, lambda s: s["batch"]),
            ("suffix", True, lambda s: s["kv_len"])] + common_columns(rows)
    for st in FLAT_STAGES:
        cols.append((f"{st[:2]} µs?", True, lambda s, st=st: fmt(us(rows, f"{st}/{s['name']}"))))
    cols += [("FlashInfer cascade µs", True, lambda s: fmt(us(rows, f"{FI_CASCADE}/{s['name']}")))]
    for p, _ in FI_FLAT_DECODE:
        head = "FlashInfer flat CUDA-core µs" if "cuda_core" in p else "FlashInfer flat tensor-core µs"
        cols.append((head, True, lambda s, p=p: fmt(us(rows, f"{p}/{s['name']}"))))
    cols += [("cuDNN (contiguous copy) µs", True, lambda s: fmt(us(rows, f"{CUDNN}/{s['name']}"))),
             ("fastest flat stage / 05", True, lambda s: times(speedups(rows, s)[0])),
             ("FlashInfer cascade / 05", True,
              lambda s: times(ratio(us(rows, f"{FI_CASCADE}/{s['name']}"), us(rows, f"{STAGE}/{s['name']}")))),
             ("FlashInfer fastest flat / its cascade", True, lambda s: times(speedups(rows, s)[1]))]
    return table(rows, shown, cols)


def append_table(rows, shapes):
    shown = [s for s in shapes if s["mode"] != "decode"]
    if not shown:
        return []
    cols = [("shape", False, lambda s: f"`{s['name']}`"),
            ("prefix", True, lambda s: s["shared_prefix"]),
            ("batch x queries", True, lambda s: f"{s['batch']} x {s['qo_len']}"),
            ("own keys", True, lambda s: s["kv_len"])] + common_columns(rows)
    cols += [("04 µs", True, lambda s: fmt(us(rows, f"04_tensor_core/{s['name']}"))),
             ("FlashInfer cascade µs", True, lambda s: fmt(us(rows, f"{FI_CASCADE}/{s['name']}"))),
             ("FlashInfer flat fa2 µs", True, lambda s: fmt(us(rows, f"peer_flashinfer_fa2/{s['name']}"))),
             ("cuDNN (contiguous copy, non-causal) µs", True, lambda s: fmt(us(rows, f"{CUDNN}/{s['name']}"))),
             ("04 / 05", True,
              lambda s: times(ratio(us(rows, f"04_tensor_core/{s['name']}"), us(rows, f"{STAGE}/{s['name']}")))),
             ("FlashInfer cascade / 05", True,
              lambda s: times(ratio(us(rows, f"{FI_CASCADE}/{s['name']}"), us(rows, f"{STAGE}/{s['name']}")))),
             ("FlashInfer fa2 / its cascade", True, lambda s: times(speedups(rows, s)[1]))]
    return table(rows, shown, cols)


def shared_level(rows, shapes):
    """Lines on the shared level of the target shapes: its flops and, where a row carries
    them, the throughput (a stage row's shared_TFLOP/s, else its shared_flops over the whole
    step's time, a lower bound for the shared level alone)."""
    out = []
    for s in shapes:
        if s["set"] != "target":
            continue
        n = s["name"]
        parts = []
        for name, who in [(f"{STAGE}/{n}", "05_cascade"), (f"{STAGE}[cascade]/{n}", "05_cascade with the cascade "
                                                                                      "forced"),
                          (f"{FI_CASCADE}/{n}", "FlashInfer's cascade")]:
            r = rows.get(name)
            if r is None:
                continue
            if "shared_TFLOP/s" in r:
                parts.append(f"{who}: {fmt(float(r['shared_TFLOP/s']))} TFLOP/s on the shared level")
            elif r.get("shared_flops"):
                tflops = float(r["shared_flops"]) / (us(rows, name) * 1e-6) * 1e-12
                parts.append(f"{who}: {fmt(us(rows, name))} µs for the whole step, {fmt(tflops)} TFLOP/s of "
                             "shared-level flops over it")
        if parts:
            out.append(f"- `{n}`: shared level {fmt(shared_flops_of_shape(s) / 1e9)} GFLOP; " + "; ".join(parts)
                       + ".")
        else:
            out.append(f"- `{n}`: shared level {fmt(shared_flops_of_shape(s) / 1e9)} GFLOP; no row of this run "
                       "carries the shared level's flops (stage 05 chose the flat path, or the row is missing).")
    if out:
        out = ["The shared level (every query of the batch against the prefix's whole pages). The throughput "
               "divides its flops by the whole step's time (shared level, suffix level and merge), so it is a "
               "lower bound for the shared level alone:", ""] + out
    return out


def peer_errors(run, shapes):
    """One line per distinct reason a peer did not run, with the shapes it cost."""
    names = {s["name"] for s in shapes}
    by_reason = {}
    for e in run["raw"].get("flashstep", {}).get("peer_errors", []):
        if e.get("shape") in names:
            by_reason.setdefault((e.get("impl", "?"), e.get("error", "?")), []).append(e["shape"])
    return [f"- `{impl}`: {err} ({len(v)} shape{'s' if len(v) > 1 else ''}: "
            + ", ".join(f"`{x}`" for x in v) + ")" for (impl, err), v in by_reason.items()]


def section(path, run, rows, shapes, repo):
    """The chapter's section: provenance, ONE summary table (the goals merge_results.py
    recorded with ratio and verdict, the per-shape goal as a count, the shared level's
    throughput on the target shapes against the run's GEMM ceiling, the ratios to the
    flat stages and FlashInfer's cascade as ranges over the decode shapes), the plot, and a
    pointer to the results page, which shows every row of the run (--full prints the tables)."""
    fs = run["raw"].get("flashstep", {})
    text = full_tables(path, run, rows, shapes, repo).split("\n")
    out = text[:text.index("") + 1]  # the provenance line
    for line in text[len(out):]:  # a dirty tree's warning and the run's note stay
        if not (line.startswith("Built from a tree") or line.startswith("Note recorded")):
            break
        out += [line, ""]
    out += ["| measured | value | goal | met |", "|:--|--:|--:|:--|"]
    yes = {True: "yes", False: "**no**", None: "not measured"}
    targets = fs.get("targets", [])
    for t in targets:
        if "candidates" in t:
            continue
        what = t["target"]
        if "measured" in t and "ratio" in t:  # the worst of the decode shapes: which, against what
            what += f" (`{t['numerator'].split('/', 1)[1]}`, against `{t['denominator'].split('/', 1)[0]}`)"
        ratio_cell = f"{t['ratio']:.2f}" if "ratio" in t else "–"
        out.append(f"| {what} | {ratio_cell} | {t['goal']} | "
                   f"{yes[t.get('met')]} |")
    per_shape = [t for t in targets if "candidates" in t]
    if per_shape:
        met = [t for t in per_shape if t.get("met")]
        missed = [t for t in per_shape if t.get("met") is False]
        what = "Each decode shape, 05_cascade vs the fastest flat stage"
        if missed:
            what += " (missed: " + ", ".join(f"`{t['numerator'].split('/', 1)[1]}` {t['ratio']:.2f}"
                                              for t in missed) + ")"
        out.append(f"| {what} | met on {len(met)} of {len(per_shape)} | {per_shape[0]['goal']} | "
                   f"{yes[len(met) == len(per_shape)]} |")
    for n, who, tflops in shared_throughputs(rows, shapes):
        out.append(f"| {who}, TFLOP/s of shared-level flops over the whole step, `{n}` | {fmt(tflops)} | | |")
    decode = sweep_order(shapes)
    for head, f in (("fastest flat stage / 05", lambda s: speedups(rows, s)[0]),
                    ("FlashInfer cascade / 05",
                     lambda s: ratio(us(rows, f"{FI_CASCADE}/{s['name']}"), us(rows, f"{STAGE}/{s['name']}")))):
        rr = [(f(s), s["name"]) for s in decode]
        rr = [x for x in rr if x[0] is not None]
        if rr:
            lo, hi = min(rr), max(rr)
            out.append(f"| {head} (time ratio), over {len(rr)} decode shapes: lowest (`{lo[1]}`) - highest "
                       f"(`{hi[1]}`) | {times(lo[0])} - {times(hi[0])} | | |")
    out += ["", "![Speedup of the cascades over flat attention per decode shape]"
                f"(../../docs/results/05_cascade/{PLOT})"]
    errors = peer_errors(run, shapes)
    if errors:
        out += ["", "Peers that did not run:", ""] + errors
    folder = os.path.relpath(os.path.dirname(path), repo)
    out += ["", f"Every row of `{os.path.relpath(path, repo)}` (each shape's time for stage 05 as planned and "
            "forced, the flat stages and every peer) is on the docs site's results page, generated from "
            f"[{folder}](../../{folder}/) by `scripts/docs_results.py`; `bench/reports/cascade_report.py --full` "
            "prints the decode and append tables with their ratios."]
    return "\n".join(out)


def shared_throughputs(rows, shapes):
    """(shape, who, TFLOP/s) of the shared level on the target shapes, as shared_level words them."""
    out = []
    for s in shapes:
        if s["set"] != "target":
            continue
        n = s["name"]
        for name, who in [(f"{STAGE}/{n}", "05_cascade"), (f"{STAGE}[cascade]/{n}", "05_cascade, cascade forced"),
                          (f"{FI_CASCADE}/{n}", "FlashInfer's cascade")]:
            r = rows.get(name)
            if r is None:
                continue
            if "shared_TFLOP/s" in r:
                out.append((n, who, float(r["shared_TFLOP/s"])))
            elif r.get("shared_flops"):
                out.append((n, who, float(r["shared_flops"]) / (us(rows, name) * 1e-6) * 1e-12))
    return out


def full_tables(path, run, rows, shapes, repo):
    """Provenance, the decode and append tables, the shared level, the plot and the goals (--full)."""
    ctx = context(run)
    fs = run["raw"].get("flashstep", {})
    peers = fs.get("peers", {}) or {}
    versions = ", ".join(f"{k} {peers[k]}" for k in ("flashinfer", "torch", "cuda", "cudnn") if peers.get(k))
    out = [f"Generated by `bench/reports/cascade_report.py` from `{os.path.relpath(path, repo)}`: "
           f"{ctx.get('device', '?')}, commit `{ctx.get('commit', '?')}`, {ctx.get('date', '?')}"
           + (f", command `{fs['command']}`" if fs.get("command") else "") + ". "
           f"Ceilings measured in the same process: cuBLAS bf16 GEMM "
           f"{fmt(float(ctx['gemm_bf16_ceiling_TFLOP/s']))} TFLOP/s, device-to-device copy "
           f"{fmt(float(ctx['copy_ceiling_GB/s']))} GB/s. Each number is the median of 5 repetitions "
           f"of CUDA-event-timed calls, L2 flushed before each call"
           + (f"; peers: {versions}" if versions else "") + ".", ""]
    if fs.get("tree") not in (None, "clean"):
        out += [f"Built from a tree that was {fs['tree']}: not a run for docs/results/.", ""]
    if fs.get("note"):
        out += [f"Note recorded with this run: {fs['note']}.", ""]
    dec = decode_table(rows, shapes)
    if dec:
        out += ["Decode, one query per request; every request holds the shared prefix and its own suffix. "
                "The flat stages and FlashInfer's flat decode read the prefix once per request, the "
                "cascades once per batch. Speedups are time ratios (above 1: the cascade is faster).", ""] + dec
    app = append_table(rows, shapes)
    if app:
        out += ["", "Append: each request adds its queries after the shared prefix and its own keys "
                "(causal, bottom-right aligned; cuDNN SDPA runs non-causal, its causal mask being "
                "top-left aligned).", ""] + app
    shared = shared_level(rows, shapes)
    if shared:
        out += [""] + shared
    out += ["", "![Speedup of the cascades over flat attention per decode shape]"
                f"(../../docs/results/05_cascade/{PLOT})"]
    errors = peer_errors(run, shapes)
    if errors:
        out += ["", "Peers that did not run:", ""] + errors
    targets = fs.get("targets", [])
    # one goal per decode shape (a denominator chosen among candidates): summarised below
    per_shape = [t for t in targets if "candidates" in t]
    if targets:
        out += ["", "Speed goals of this run (computed by `bench/reports/merge_results.py`):", ""]
        for t in targets:
            if "candidates" in t:
                continue
            verdict = {True: "met", False: "missed", None: "not measured"}[t.get("met")]
            r = f"{t['ratio']:.2f}" if "ratio" in t else "–"
            if "measured" in t and "ratio" in t:  # the worst of the decode shapes: which, against what
                r += f" (`{t['numerator'].split('/', 1)[1]}`, against `{t['denominator'].split('/', 1)[0]}`)"
            out.append(f"- {t['target']}: {r} (goal {t['goal']}), {verdict}")
    if per_shape:
        met = [t for t in per_shape if t.get("met")]
        missed = [t for t in per_shape if t.get("met") is False]
        unmeasured = [t for t in per_shape if t.get("met") is None]
        line = (f"- Each decode shape, 05_cascade vs the fastest flat stage (goal {per_shape[0]['goal']}, the "
                f"table's \"fastest flat stage / 05\"): met on {len(met)} of {len(per_shape)}")
        if missed:
            line += "; missed on " + ", ".join(f"`{t['numerator'].split('/', 1)[1]}` ({t['ratio']:.2f})"
                                               for t in missed)
        if unmeasured:
            line += "; not measured on " + ", ".join(f"`{t['numerator'].split('/', 1)[1]}`" for t in unmeasured)
        out.append(line + ".")
    return "\n".join(out)


def main():
    ap = parser(__doc__, what="results JSON of a bench/shapes_cascade.csv run")
    ap.add_argument("--full", action="store_true", help="print the full tables (the chapter shows a summary)")
    a = ap.parse_args()
    found = run_of_shapes(a.results, "shapes_cascade.csv", "cascade_report.py")
    if found is None:
        return 2
    run, rows = found
    chapter = os.path.join(a.repo, "stages", "05_cascade", "README.md")
    shapes = load_shapes(a.repo, "shapes_cascade.csv")
    if a.full:
        print(full_tables(a.results, run, rows, shapes, a.repo))
        return 0
    rc = write_section(chapter, BEGIN, END, "cascade_report.py", a.repo,
                       lambda: section(a.results, run, rows, shapes, a.repo), a.check,
                       lambda: plot_sweep(run, rows, shapes, results_path(a.repo, "05_cascade", PLOT)))
    if rc == 0 and not a.check:
        print(f"wrote {os.path.relpath(chapter, a.repo)} and docs/results/05_cascade/{PLOT}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
