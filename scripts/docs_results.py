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


def impl_color(impl):
    """The same colour for a stage or peer in every plot: stage NN gets matplotlib's
    colour NN - 1, peers the last ones of the cycle."""
    m = re.match(r"^(\d\d)_", impl)
    if m:
        return f"C{(int(m.group(1)) - 1) % 7}"
    return {"peer_torch_sdpa_cudnn": "C8", "peer_torch_sdpa_flash": "C9"}.get(impl, "C7")


def plot_bandwidth(result, out_png):
    """GB/s of every '<stage or peer>/<shape>' row, grouped by shape, one bar per stage or
    peer, against the copy ceiling of the same run when the file has it. Returns False
    (and writes nothing) if no such row has a GB/s counter."""
    # Stages (NN_name) and peers (peer_*) only: the ceilings are drawn as a line, and
    # other rows (e.g. tuning variants) stay in the table.
    plotted = re.compile(r"^(\d\d_\w+|peer_\w+)/")
    rows = [r for r in result["rows"] if "GB/s" in r and plotted.match(r["name"])]
    if not rows:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({r["name"].split("/", 1)[1] for r in rows})
    impls = sorted({r["name"].split("/", 1)[0] for r in rows})
    gbps = {r["name"]: r["GB/s"] for r in rows}
    fig, ax = plt.subplots(figsize=(min(16.0, max(6.0, 0.15 * len(shapes) * len(impls) + 2)), 4.2))
    width = 0.8 / len(impls)
    for k, impl in enumerate(impls):
        xs = [i + k * width for i, sh in enumerate(shapes) if f"{impl}/{sh}" in gbps]
        ys = [gbps[f"{impl}/{sh}"] for sh in shapes if f"{impl}/{sh}" in gbps]
        ax.bar(xs, ys, width, label=impl, color=impl_color(impl))
    ceiling = result["ceilings"].get("copy_ceiling_GB/s")
    if ceiling is not None:
        ax.axhline(ceiling, color="k", ls=":", label=f"copy ceiling ({ceiling:,.0f} GB/s)")
    read = result["ceilings"].get("read_ceiling_GB/s")
    if read is not None:
        ax.axhline(read, color="k", ls="--", label=f"read ceiling ({read:,.0f} GB/s)")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))], shapes, rotation=60,
                  ha="right", fontsize=7)
    ax.set_ylabel("GB/s (higher is better)")
    ax.set_title(os.path.basename(result["path"]) + " - " + str(result["device"] or ""),
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # outside the bars
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return True


def results_page(results, out_dir):
    """Writes pages/results.md and its plots; returns the page path."""
    lines = ["# Measured results {#results}", ""]
    if not results:
        lines += ["No results yet: `docs/results/` holds no JSON. Results are produced on a",
                  "GPU machine by `flashstep bench --out docs/results/<name>.json`; this page",
                  "and the stage pages are generated from those files at docs build time.", ""]
    else:
        lines += ["Every table and plot on this page is generated from the JSON files in",
                  "`docs/results/` by `scripts/docs_results.py` while the docs are built: one",
                  "section per folder (a stage's runs, its plots and checks beside them; earlier",
                  "runs in its `history/`), one table per run.", ""]
    folder = None
    for i, res in enumerate(results):
        name = os.path.splitext(os.path.basename(res["path"]))[0]
        here = os.path.dirname(res.get("shown") or "") or "."
        if here != folder:
            folder = here
            lines += [f"## {folder}", ""]
        lines += [f"### {name}", "", "From " + provenance(res) + ".", ""]
        if res.get("targets"):
            lines += ["Targets, as ratios within this one run:", "", targets_table(res["targets"]), ""]
        if res["rows"]:
            lines += [table(res["rows"]), ""]
        png = f"results_{re.sub(r'[^0-9A-Za-z_]', '_', name)}.png"
        if plot_bandwidth(res, os.path.join(out_dir, "images", png)):
            lines += [f"![GB/s per shape, each stage and peer, {name}]({png})", ""]
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
