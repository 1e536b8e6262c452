#!/usr/bin/env python3
"""Result tables and plots for the docs, generated from the benchmark's results JSON.

    docs_results.py RESULTS_DIR --out GENERATED_DIR
        writes GENERATED_DIR/pages/results.md (page label `results`) and the plots it
        shows into GENERATED_DIR/images/.

The JSON files in docs/results/<stage>/ are written by the benchmark programs and the
scripts of bench/ (bench/reports/results.py reads each in one shape). Nothing here is typed by hand:
every number on the page is read from those files, and the page says which file, which
device and which commit produced it. Used by scripts/docs_stage_pages.py for the
per-stage tables too.
"""
import argparse
import html
import math
import os
import re
import sys

# The one reader of results files (bench/reports/results.py): every file, whatever wrote it,
# in one shape (device, commit, tree, command, date, ceilings, rows with their unit, peers,
# targets), so this page needs no case per writer.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "reports"))
from results import ResultsError, load, load_tree  # noqa: E402,F401  (load: for the tests)

# Counters a row may carry, in the order the table shows them, with their headings.
COUNTER_COLUMNS = [
    ("GB/s", "GB/s"),
    ("TFLOP/s", "TFLOP/s"),
    ("pct_of_ceiling", "% of ceiling"),
    ("pct_of_read_ceiling", "% of read ceiling"),
]


def load_dir(results_dir):
    """Every current run under `results_dir` (docs/results/<stage>/*.json and the other
    folders', not history/), sorted by path, each with "shown": its path under results_dir."""
    runs = load_tree(results_dir)
    for run in runs:
        run["shown"] = os.path.relpath(run["path"], results_dir).replace(os.sep, "/")
    return runs


def _fmt(x, digits=3):
    if x is None:
        return ""
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - mag)
    return f"{x:,.{decimals}f}"


def provenance(result):
    """'file, device, commit, date' as one line of Markdown."""
    parts = [f"`{result.get('shown') or os.path.basename(result['path'])}`"]
    for key, label in (("device", "device"), ("commit", "commit"), ("date", "date")):
        if result.get(key):
            parts.append(f"{label} {result[key]}")
    return ", ".join(parts)


def table(rows):
    """A Markdown table of benchmark rows: name, median time, and the counters present."""
    cols = [(k, h) for k, h in COUNTER_COLUMNS if any(isinstance(r.get(k), (int, float)) for r in rows)]
    head = "| benchmark | time (us) | " + " | ".join(h for _, h in cols) + " |"
    rule = "|:--|--:|" + "--:|" * len(cols)
    lines = [head.replace(" |  |", " |"), rule]
    for r in rows:
        cells = [f"`{r['name']}`", _fmt(r["median_us"])] + [_fmt(r.get(k)) for k, _ in cols]
        lines.append("| " + " | ".join(cells) + " |")
    if any(r.get("pct_of_ceiling", 0) > 100 for r in rows):
        note = CEILING_NOTE + (READ_CEILING_NOTE if any("pct_of_read_ceiling" in r for r in rows) else "")
        lines = [note, ""] + lines  # before the table: a reader meets it first
    return "\n".join(lines)


# Said above every table with a "% of ceiling" above 100, which otherwise reads as an error.
CEILING_NOTE = (
    "\"% of ceiling\" is the row's GB/s (the bytes the call must move: its inputs read, its "
    "outputs written) over the copy ceiling of the same run, a device-to-device copy whose "
    "GB/s counts every byte twice, once read and once written. Above 100 is possible and "
    "no error: an attention kernel almost only reads, and DRAM serves a stream of reads "
    "faster than the copy's mix of reads and writes, which also pays for turning the bus "
    "around. The copy is a yardstick measured in the same process, not the memory's peak.")
# Added to it where the run also measured the read ceiling (flashstep_bench's ceiling/read_only).
READ_CEILING_NOTE = (
    " \"% of read ceiling\" is the same GB/s over the read ceiling of the run: a kernel that "
    "only reads a buffer far larger than the L2 with 16-byte loads (bench/ceilings/read_ceiling.cu), "
    "which is the most a decode, which almost only reads, can reach: near it, a decode takes the least "
    "time its bytes allow.")


def targets_table(targets):
    """The stage's speed goals as the run computed them: target, ratio, goal, verdict."""
    lines = ["| target | ratio | goal | verdict |", "|:--|--:|:--|:--|"]
    for t in targets:
        ratio = t.get("ratio")
        verdict = {True: "met", False: "**missed**"}.get(t.get("met"), "not measured")
        lines.append(f"| {t['what']} | {'' if ratio is None else f'{ratio:.3f}'} | "
                     f"{t.get('goal', '')} | {verdict} |")
    return "\n".join(lines)


def rows_for_stage(results, stage):
    """Rows (with their file) whose benchmark name mentions `stage` (e.g. '02_paged')."""
    pattern = re.compile(r"(^|[^0-9A-Za-z])" + re.escape(stage) + r"($|[^0-9A-Za-z])")
    return [(res, [r for r in res["rows"] if pattern.search(r["name"])]) for res in results]


# ---- plots ----------------------------------------------------------------------------------
# Series are stages ("02_paged", "04_tensor_core_ragged", "05_cascade[flat]") and peers
# ("peer_..."); each gets a colour and a marker no other series of its plot has
# (bench/reports/plot_style.py, which the chapters' plots use too).
PLOTTED = re.compile(r"^(\d\d_[\w\[\]+.-]+|peer_\w+)/[^/]+$")
SHAPES_PER_PANEL = 20  # a run of more shapes is drawn as several panels, one above the other
PLOT_WIDTH_IN, PLOT_DPI = 10.0, 100  # 1000 px: the page's width, so a plot is not shrunk to fit


def plotted_rows(result):
    """The rows a run's plot shows, and their unit: the stages' and peers' rows of
    `impl/shape` in the unit most of them have (GB/s for a decode, TFLOP/s for a prefill);
    ([], None) when there is too little to plot (fewer than two such rows, or a handful of
    one stage's, which its table shows as well)."""
    rows = [r for r in result["rows"] if PLOTTED.match(r["name"])]
    counts = {u: sum(1 for r in rows if isinstance(r.get(u), (int, float))) for u in ("GB/s", "TFLOP/s")}
    unit = max(counts, key=counts.get)
    series = {r["name"].split("/", 1)[0] for r in rows if isinstance(r.get(unit), (int, float))}
    if counts[unit] < 2 or (len(series) < 2 and counts[unit] < 6):  # a few rows of one stage: the table says it
        return [], None
    return [r for r in rows if isinstance(r.get(unit), (int, float))], unit


def plot_run(result, out_png):
    """One marker per (shape, stage or peer) in the run's unit, against the ceilings of the
    same run, in panels of at most SHAPES_PER_PANEL shapes. Returns False (and writes
    nothing) when the run has nothing to plot."""
    rows, unit = plotted_rows(result)
    if not rows:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from plot_style import series_styles

    shapes = list(dict.fromkeys(r["name"].split("/", 1)[1] for r in rows))
    impls = sorted({r["name"].split("/", 1)[0] for r in rows}, key=lambda i: (i.startswith("peer_"), i))
    value = {r["name"]: r[unit] for r in rows}
    styles = series_styles(impls)
    count = -(-len(shapes) // SHAPES_PER_PANEL)
    per_panel = -(-len(shapes) // count)  # panels of equal length
    panels = [shapes[i:i + per_panel] for i in range(0, len(shapes), per_panel)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(PLOT_WIDTH_IN, 0.6 + 3.2 * len(panels)), squeeze=False)
    ceilings = {"GB/s": [("copy_ceiling_GB/s", "copy ceiling", ":"), ("read_ceiling_GB/s", "read ceiling", "--")],
                "TFLOP/s": [("gemm_bf16_ceiling_TFLOP/s", "cuBLAS bf16 GEMM", "--")]}[unit]
    offsets = {impl: (k - (len(impls) - 1) / 2) * min(0.08, 0.7 / len(impls)) for k, impl in enumerate(impls)}
    for ax, panel in zip(axes[:, 0], panels):
        for impl in impls:
            xs = [i + offsets[impl] for i, sh in enumerate(panel) if f"{impl}/{sh}" in value]
            ys = [value[f"{impl}/{sh}"] for sh in panel if f"{impl}/{sh}" in value]
            if xs:
                ax.plot(xs, ys, linestyle="none", markersize=6, markeredgecolor="black", markeredgewidth=0.4,
                        label=impl, **styles[impl].line)
        for key, label, ls in ceilings:
            c = result["ceilings"].get(key)
            if c is not None:
                ax.axhline(c, color="black", ls=ls, lw=1, label=f"{label} ({c:,.0f} {unit})")
        ax.set_xticks(range(len(panel)), panel, rotation=35, ha="right", fontsize=8)
        ax.set_xlim(-0.6, len(panel) - 0.4)
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylabel(f"{unit} (higher is better)", fontsize=9)
        ax.set_ylim(bottom=0)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    for ax in axes[1:, 0]:  # a series missing from the first panel still gets its legend entry
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    axes[0, 0].set_title(f"{result.get('shown') or os.path.basename(result['path'])}: {result['device'] or ''}",
                         fontsize=9)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    rows_of_legend = (len(labels) + 2) // 3
    fig.tight_layout(rect=(0, 0.045 * rows_of_legend / len(panels) + 0.02, 1, 1))
    fig.savefig(out_png, dpi=PLOT_DPI)
    plt.close(fig)
    return True


# ---- the page --------------------------------------------------------------------------------

RUN_NAME = re.compile(r"^(?P<gpu>[a-z0-9]+)_(?P<what>.+?)_(?P<date>\d{4}-\d\d-\d\d)(?:_(?P<commit>[0-9a-f]{7,}))?$")
FOLDER_TITLES = {"notebooks": "Notebooks run on a GPU", "python": "flashstep.cuda from Python"}


def anchor(text):
    """A section label: results_<folder>[_<file stem>]."""
    return "results_" + re.sub(r"[^0-9A-Za-z_]", "_", re.sub(r"\.json$", "", text))


def run_heading(result):
    """'decode, H100, 2026-11-22, commit 1a0fe42' from the file name (the device, date and
    commit as the file records them where it does)."""
    stem = os.path.splitext(os.path.basename(result["path"]))[0]
    m = RUN_NAME.match(stem)
    if not m:
        return stem
    parts = [m.group("what").replace("_", " "), m.group("gpu").upper(), (result.get("date") or "")[:10] or m.group("date")]
    commit = result.get("commit") or m.group("commit")
    if commit:
        parts.append(f"commit {commit}")
    return ", ".join(p for p in parts if p)


def by_shape(result):
    """The run's rows as one table: a line per shape, a column per stage or peer, each cell
    the row's value in its unit. None where a row's name is not `impl/shape` (tuning
    variants, multi-GPU variants: those runs keep their table of every row)."""
    others = [r for r in result["rows"] if not r["name"].startswith("ceiling/")]
    rows = [r for r in others if r["name"].count("/") == 1]
    if not rows or len(rows) < len(others) / 2:
        return None
    impls = list(dict.fromkeys(sorted((r["name"].split("/")[0] for r in rows),
                                      key=lambda i: (i.startswith("peer_"), i))))
    shapes = list(dict.fromkeys(r["name"].split("/")[1] for r in rows))
    cell = {r["name"]: r for r in rows}
    one_unit = len({r["unit"] for r in rows}) == 1
    # column heads with spaces for underscores, so that a long name wraps between its words
    heads = [i.replace("_", " ") for i in impls]
    if one_unit:
        lines = [f"Every cell in {rows[0]['unit']}; a column per stage or peer (\"–\": not measured in this run).", "",
                 "| shape | " + " | ".join(heads) + " |", "|:--|" + "--:|" * len(impls)]
    else:
        lines = ["A column per stage or peer, each row in its unit (\"–\": not measured in this run).", "",
                 "| shape | unit | " + " | ".join(heads) + " |", "|:--|:--|" + "--:|" * len(impls)]
    for sh in shapes:
        present = [cell[f"{i}/{sh}"] for i in impls if f"{i}/{sh}" in cell]
        units = {r["unit"] for r in present}
        unit = units.pop() if len(units) == 1 else ""
        cells = []
        for i in impls:
            r = cell.get(f"{i}/{sh}")
            cells.append("–" if r is None else _fmt(r["value"]) + ("" if unit else f" {r['unit']}"))
        lead = f"| `{sh}` | " if one_unit else f"| `{sh}` | {unit or 'mixed'} | "
        lines.append(lead + " | ".join(cells) + " |")
    if len(rows) < len(others):
        lines += ["", f"{len(others) - len(rows)} rows with longer names (variants of a stage, such as its tuning "
                  "knobs) are listed under \"Every row\" only."]
    return "\n".join(lines)


def html_table(rows):
    """table() as HTML, for the collapsed list of every row (Doxygen passes it through)."""
    cols = [(k, h) for k, h in COUNTER_COLUMNS if any(isinstance(r.get(k), (int, float)) for r in rows)]
    out = ['<table class="markdownTable">', "<tr class=\"markdownTableHead\"><th>benchmark</th><th>time (us)</th>" +
           "".join(f"<th>{html.escape(h)}</th>" for _, h in cols) + "</tr>"]
    for r in rows:
        cells = [_fmt(r["median_us"])] + [_fmt(r.get(k)) for k, _ in cols]
        out.append(f"<tr><td><code>{html.escape(r['name'])}</code></td>" +
                   "".join(f'<td class="markdownTableBodyRight">{c}</td>' for c in cells) + "</tr>")
    return "\n".join(out + ["</table>"])


def ceilings_line(result):
    shown = [("copy_ceiling_GB/s", "copy", "GB/s"), ("read_ceiling_GB/s", "read", "GB/s"),
             ("gemm_bf16_ceiling_TFLOP/s", "cuBLAS bf16 GEMM", "TFLOP/s"), ("launch_floor_1_us", "launch floor", "us")]
    parts = [f"{label} {_fmt(result['ceilings'][k])} {unit}" for k, label, unit in shown if k in result["ceilings"]]
    return ("Ceilings measured in the same run: " + "; ".join(parts) + ".") if parts else ""


def results_page(results, out_dir, titles=None):
    """Writes pages/results.md and its plots; returns the page path. `titles`: {stage
    folder: (page label, chapter title)} for the stage sections' headings and links."""
    titles = titles or {}
    lines = ["# Measured results {#results}", ""]
    if not results:
        lines += ["No results yet: `docs/results/` holds no JSON. Results are produced on a",
                  "GPU machine by `flashstep bench --out docs/results/<name>.json`; this page",
                  "and the stage pages are generated from those files at docs build time.", ""]
    else:
        lines += ["Every table and plot on this page is generated from the JSON files in `docs/results/` by "
                  "`scripts/docs_results.py` while the docs are built. One section per stage folder, one per run "
                  "in it: the run's goals (ratios within the one run), a plot of its stages and peers by shape, "
                  "its rows as a table by shape (one column per stage or peer), and every row of the file with "
                  "its time and counters under \"Every row\". Runs a newer one replaced are in each folder's "
                  "`history/`.", ""]
    folders = {}
    for res in results:
        folders.setdefault(os.path.dirname(res.get("shown") or "") or ".", []).append(res)

    def folder_heading(folder):
        if folder in titles:
            return titles[folder][1]
        return FOLDER_TITLES.get(folder, folder)

    if results:
        lines += ["## Contents {#results_contents}", ""]
        for folder, runs in folders.items():
            links = ", ".join(f"[{run_heading(r)}](#{anchor(r['shown'])})" for r in runs)
            lines.append(f"- [{folder_heading(folder)}](#{anchor(folder)}): {links}")
        lines.append("")
    for folder, runs in folders.items():
        lines += [f"## {folder_heading(folder)} {{#{anchor(folder)}}}", ""]
        if folder in titles:
            lines += [f"The chapter: \\ref {titles[folder][0]}. Files: `docs/results/{folder}/`.", ""]
        for res in runs:
            name = os.path.splitext(os.path.basename(res["path"]))[0]
            lines += [f"### {run_heading(res)} {{#{anchor(res['shown'])}}}", "", "From " + provenance(res) + ".", ""]
            ceil = ceilings_line(res)
            if ceil:
                lines += [ceil, ""]
            if res.get("targets"):
                lines += ["Targets, as ratios within this one run:", "", targets_table(res["targets"]), ""]
            png = f"results_{re.sub(r'[^0-9A-Za-z_]', '_', name)}.png"
            if plot_run(res, os.path.join(out_dir, "images", png)):
                lines += [f"![{plotted_rows(res)[1]} by shape, each stage and peer: {name}]({png})", ""]
            pivot = by_shape(res)
            if pivot:
                lines += [pivot, ""]
            if res["rows"]:
                note = CEILING_NOTE if any(r.get("pct_of_ceiling", 0) > 100 for r in res["rows"]) else ""
                lines += ["\\htmlonly", f"<details class=\"flashstep-rows\"><summary>Every row of "
                          f"<code>{html.escape(res['shown'])}</code> ({len(res['rows'])}): time, GB/s, TFLOP/s, "
                          "% of ceiling</summary>",
                          (f"<p>{html.escape(note)}</p>" if note else ""), html_table(res["rows"]), "</details>",
                          "\\endhtmlonly", ""]
    path = os.path.join(out_dir, "pages", "results.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir")
    parser.add_argument("--out", required=True, help="generated docs folder")
    args = parser.parse_args()
    try:
        results = load_dir(args.results_dir)
    except ResultsError as e:
        print(f"docs_results.py: {e}", file=sys.stderr)
        return 1
    os.makedirs(os.path.join(args.out, "pages"), exist_ok=True)
    os.makedirs(os.path.join(args.out, "images"), exist_ok=True)
    results_page(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
