#!/usr/bin/env python3
"""Generates the results section of every stage chapter, and the bandwidth plot, from a
results JSON (docs/results/*.json, written by bench/merge_results.py).

    python3 bench/report.py [--results docs/results/FILE.json] [--repo .]

Rewrites, in each stages/NN_name/README.md, the text between the lines
`<!-- results:begin -->` and `<!-- results:end -->`: provenance (file, device,
commit, date, ceilings), a table of every shape the stage ran (time, GB/s, % of the copy
ceiling and, where the run measured it, of the read ceiling; the previous stage and the
peers on the same shape: SDPA's, and FlashInfer's decode wrappers where the run has
them), the speed goals that
concern the stage, and a link to the plot. Between `<!-- history:begin -->` and
`<!-- history:end -->`, if present, a table of the stage's earlier versions on the
target shapes, from docs/results/history/*.json (each with its flashstep.note) and the
current file. Writes docs/results/decode_bandwidth.png: GB/s of each stage and peer per
shape against the copy ceiling. Nothing here is typed by hand.

Which run: the tables are rows of bench/shapes.csv, so only a run of that shapes file
(its flashstep.shapes_file, written by bench/merge_results.py) is reported here; without
--results, the newest such run (by its context date). A run of another shapes file, such
as stage 03's split-KV sweep (bench/shapes_split_kv.csv), is reported by its own script
(bench/split_kv_report.py) and refused here, even when it also timed stages 01 or 02 for
its own comparisons. A chapter whose stage the run did not measure keeps the section it
has (from another run, or written by its own script, such as bench/prefill_report.py).
"""
import argparse
import glob
import json
import os
import re
import sys

from gbench_rows import load_medians  # bench/, beside this script

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
HISTORY_BEGIN, HISTORY_END = "<!-- history:begin -->", "<!-- history:end -->"
PEERS = [("peer_torch_sdpa_cudnn", "cuDNN SDPA"), ("peer_torch_sdpa_flash", "flash SDPA")]
# Shown where the run has their rows (bench/peers.py times them where FlashInfer imports).
FLASHINFER_PEERS = [("peer_flashinfer_cuda_core_decode", "FlashInfer decode"),
                    ("peer_flashinfer_tc_decode", "FlashInfer tensor-core decode")]
PLOT = "decode_bandwidth.png"
SHAPES_FILE = "bench/shapes.csv"  # the shape set the chapters' tables are made of
CITES_RUN = re.compile(r"docs/results/[\w./-]+\.json")


def load_shapes(repo, name="shapes.csv"):
    """The rows of bench/`name` (comment lines skipped) as dicts keyed by its header."""
    import csv
    with open(os.path.join(repo, "bench", name), encoding="utf-8") as f:
        lines = [line for line in f if line.strip() and not line.startswith("#")]
    return list(csv.DictReader(lines))


def split_chapter(chapter, begin, end, script, repo):
    """(text, head, tail) of a chapter whose generated section lies between a line `begin`
    and, after it, a line `end` (head ends before `begin`, tail starts after `end`); or
    None after saying on stderr, as `script`, what is missing."""
    shown = os.path.relpath(chapter, repo)
    if not os.path.exists(chapter):
        print(f"{script}: no chapter {shown}", file=sys.stderr)
        return None
    with open(chapter, encoding="utf-8") as f:
        text = f.read()
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        print(f"{script}: {shown} needs one line `{begin}` and, after it, one line `{end}` where the section goes",
              file=sys.stderr)
        return None
    head, rest = text.split(begin, 1)
    return text, head, rest.split(end, 1)[1]


def write_section(chapter, begin, end, script, repo, render, check, before_write=None):
    """Puts render() between a chapter's `begin` and `end` lines (split_chapter; render is
    called only when the chapter has them). With `check`,
    writes nothing and says whether the chapter is up to date (0) or stale (1); otherwise
    calls `before_write` (a plot, say), writes the chapter and returns 0. 2 where the
    chapter or its markers are missing."""
    parts = split_chapter(chapter, begin, end, script, repo)
    if parts is None:
        return 2
    text, head, tail = parts
    new = head + begin + "\n" + render() + "\n" + end + tail
    if check:
        print("up to date" if new == text else "stale")
        return 0 if new == text else 1
    if before_write:
        before_write()
    with open(chapter, "w", encoding="utf-8") as f:
        f.write(new)
    return 0


def ratio(a, b):
    """a / b, or None where either is missing (or b is 0)."""
    return None if a is None or b is None or b == 0 else a / b


def fmt(x, digits=3):
    if x is None:
        return "–"
    if x == 0:
        return "0"
    import math
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def provenance(path, data, repo):
    ctx = data["context"]
    read = ""
    if "read_ceiling_GB/s" in ctx:  # measured since flashstep_bench has bench/read_ceiling.cu
        read = f", a kernel that only reads {fmt(float(ctx['read_ceiling_GB/s']))} GB/s (bytes read)"
    return (f"Measured by `scripts/gpu-run.sh` (stages, ceilings and peers in one run) and generated by `bench/report.py` from "
            f"`{os.path.relpath(path, repo)}`: {ctx.get('device', '?')}, commit `{ctx.get('commit', '?')}`, "
            f"{ctx.get('date', '?')}. Ceilings measured in the same process: device-to-device copy "
            f"{fmt(float(ctx['copy_ceiling_GB/s']))} GB/s (bytes read + written){read}, cuBLAS bf16 GEMM "
            f"{fmt(float(ctx['gemm_bf16_ceiling_TFLOP/s']))} TFLOP/s. Each number is the median of 5 "
            f"repetitions of CUDA-event-timed calls, L2 flushed before each call.")


def peers_of(rows):
    """The peers a run's table shows: SDPA's always ("–" where not measured), FlashInfer's
    where the run has rows of them."""
    return PEERS + [(key, label) for key, label in FLASHINFER_PEERS if any(n.startswith(key + "/") for n in rows)]


def size_key(s):
    return tuple(s[k] for k in ("batch", "kv_len", "num_qo_heads", "num_kv_heads", "head_dim"))


def prev_row(rows, stage, shape, shapes):
    """The previous stage's row for the same sizes (it may have run them under another
    shape name: a ragged stage runs each size once, whatever the page size or layout)."""
    for s in shapes:
        if size_key(s) == size_key(shape) and f"{stage}/{s['name']}" in rows:
            return rows[f"{stage}/{s['name']}"]
    return None


def stage_section(stage, prev_stage, path, data, rows, shapes, repo, chapter_dir):
    ours = [s for s in shapes if f"{stage}/{s['name']}" in rows]
    if not ours:
        return [f"No results for `{stage}` in `{os.path.relpath(path, repo)}` yet."]
    lines = [provenance(path, data, repo), ""]
    read = "read_ceiling_GB/s" in data["context"]
    peers = peers_of(rows)
    head = ["shape", "batch x kv_len", "page", "layout", f"{stage} (us)", "GB/s", "% of copy"]
    if read:
        head += ["% of read"]
    if prev_stage:
        head += [f"{prev_stage} (us)", f"speedup vs {prev_stage[:2]}"]
    head += [f"{label} GB/s" for _, label in peers] + ["speed vs cuDNN"]
    lines += ["| " + " | ".join(head) + " |", "|" + ":--|" * 4 + "--:|" * (len(head) - 4)]
    for s in ours:
        r = rows[f"{stage}/{s['name']}"]
        cells = [f"`{s['name']}`", f"{s['batch']} x {s['kv_len']}", s["page_size"], s["layout"],
                 fmt(r["real_time"]), fmt(r.get("GB/s")), fmt(r.get("pct_of_ceiling"))]
        if read:
            cells.append(fmt(r.get("pct_of_read_ceiling")))
        if prev_stage:
            p = prev_row(rows, prev_stage, s, shapes)
            cells += [fmt(p["real_time"]), f"{p['real_time'] / r['real_time']:.1f}x"] if p else ["–", "–"]
        peer = {key: rows.get(f"{key}/{s['name']}") for key, _ in peers}
        for key, _ in peers:
            cells.append(fmt(peer[key].get("GB/s")) if peer[key] else "–")
        cudnn = peer["peer_torch_sdpa_cudnn"]
        # A time ratio, so that a stage moving other bytes (01 in fp32) compares fairly.
        cells.append(f"{cudnn['real_time'] / r['real_time']:.2f}x" if cudnn else "–")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    label = rows[f"{stage}/{ours[0]['name']}"].get("label", "")
    if read:
        ceilings = ("a kernel that only reads can exceed the copy ceiling, which counts a read and a write per "
                    "byte; the read ceiling is what a decode, which almost only reads, can reach.")
    else:
        ceilings = ("a kernel that only reads can exceed the copy ceiling, which counts a read and a write per "
                    "byte.")
    if len(peers) > len(PEERS):
        who = ("SDPA peers read contiguous KV (batch, kv_heads, kv_len, head_dim), where page size, layout and "
               "page order do not apply; FlashInfer's decode wrappers read the same paged pool as the stage "
               "(page size, layout, page order), checked against cuDNN's output on the same K/V (a row that "
               "differed is left out).")
    else:
        who = ("Peers read contiguous KV (batch, kv_heads, kv_len, head_dim); page size, layout and page order "
               "do not apply to them.")
    lines += ["", f"Rows run as: {label}. \"speed vs cuDNN\" is cuDNN's time over this stage's on "
              "the same sizes (above 1: faster). GB/s counts the bytes the call must move (q, K, V, o, "
              f"lse in the row's dtype); {ceilings} {who}"]
    targets = [t for t in data.get("flashstep", {}).get("targets", []) if t["numerator"].startswith(stage + "/")]
    if targets:
        lines += ["", "The stage's speed goals, as ratios within this run:", "",
                  "| target | goal | measured | met |", "|:--|--:|--:|:--|"]
        for t in targets:
            ratio = f"{t['ratio']:.3f}" if "ratio" in t else "not measured"
            met = {True: "yes", False: "**no**", None: "–"}[t.get("met")]
            lines.append(f"| {t['target']} | {t['goal']} | {ratio} | {met} |")
    plot = os.path.join(repo, "docs", "results", PLOT)
    if os.path.exists(plot):
        lines += ["", f"![GB/s per stage and peer against the copy ceiling]"
                      f"({os.path.relpath(plot, chapter_dir)})"]
    return lines


def commit_cell(commit):
    """A commit as the run recorded it; a run of a modified tree says so in words."""
    if commit.endswith("-dirty"):
        return f"`{commit[:-len('-dirty')]}` + changes (modified tree)"
    return f"`{commit}`"


def history_section(stage, current, repo, shapes):
    """Earlier versions of `stage` (docs/results/history/*.json) and the current file, on
    the target shapes: this stage's GB/s and its speed against cuDNN in the same run."""
    files = sorted(glob.glob(os.path.join(repo, "docs", "results", "history", "*.json")))
    runs = []
    for path in files + [current]:
        data, rows = load_medians(path)
        if any(k.startswith(stage + "/") for k in rows):
            runs.append((path, data, rows))
    targets = [s for s in shapes if s["set"] == "target"]
    if not runs or not targets:
        return ["No earlier versions recorded."]
    head = ["version (file)", "commit"] + [f"`{s['name']}` GB/s (vs cuDNN)" for s in targets]
    lines = ["| " + " | ".join(head) + " |", "|:--|:--|" + "--:|" * len(targets)]
    for path, data, rows in runs:
        note = data.get("flashstep", {}).get("note", "")
        if path != current:  # a note written when its run was the current one
            note = note.replace(" (this version)", "")
        cells = [note + f" (`{os.path.basename(path)}`)",
                 commit_cell(data['context'].get('commit', '?'))]
        for s in targets:
            r = rows.get(f"{stage}/{s['name']}")
            c = rows.get(f"peer_torch_sdpa_cudnn/{s['name']}")
            if not r:
                cells.append("–")
                continue
            vs = f" ({c['real_time'] / r['real_time']:.2f}x)" if c else ""
            cells.append(fmt(r.get("GB/s")) + vs)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot_bandwidth(path, data, rows, shapes, stages, out_png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [s for s in shapes if s["set"] in ("target", "sweep") and s["layout"] == "NHD"
             and s["page_order"] == "sequential" and s["page_size"] == "16"]
    shown.sort(key=lambda s: (int(s["batch"]) * int(s["kv_len"]), int(s["batch"])))
    def legend(st):  # a stage that ran another dtype than the shapes says so (01: fp32)
        row = next((rows[f"{st}/{s['name']}"] for s in shown if f"{st}/{s['name']}" in rows), None)
        dtype = row.get("label", "").split(" ")[0] if row else ""
        return f"{st} ({dtype})" if dtype and dtype != shown[0]["dtype"] else st
    impls = [(st, legend(st)) for st in stages] + peers_of(rows)
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / len(impls)
    for i, (key, label) in enumerate(impls):
        xs, ys = [], []
        for j, s in enumerate(shown):
            r = rows.get(f"{key}/{s['name']}")
            if r and r.get("GB/s"):
                xs.append(j + (i - (len(impls) - 1) / 2) * width)
                ys.append(r["GB/s"])
        if xs:
            ax.bar(xs, ys, width, label=label)
    copy = float(data["context"]["copy_ceiling_GB/s"])
    ax.axhline(copy, color="black", linestyle="--", linewidth=1, label=f"copy ceiling {copy:,.0f} GB/s")
    if "read_ceiling_GB/s" in data["context"]:
        read = float(data["context"]["read_ceiling_GB/s"])
        ax.axhline(read, color="black", linestyle=":", linewidth=1, label=f"read ceiling {read:,.0f} GB/s")
    ax.set_xticks(range(len(shown)))
    ax.set_xticklabels([f"{s['batch']}x{s['kv_len']}" for s in shown], rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("batch x kv_len (bf16, 32 q / 8 kv heads, head_dim 128, page 16)")
    ax.set_ylabel("GB/s (q + K + V + o + lse bytes / time)")
    ax.set_title(f"Decode bandwidth — {data['context'].get('device', '')}, commit {data['context'].get('commit', '')}",
                 fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def shapes_file(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f).get("flashstep", {}).get("shapes_file")


def newest(repo):
    """The newest run of bench/shapes.csv in docs/results (by context date), or None."""
    runs = []
    for path in glob.glob(os.path.join(repo, "docs", "results", "*.json")):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("flashstep", {}).get("shapes_file") == SHAPES_FILE:
            runs.append((data.get("context", {}).get("date", ""), path))
        else:
            print(f"report.py: skipping {os.path.relpath(path, repo)}: a run of "
                  f"{data.get('flashstep', {}).get('shapes_file') or 'an unrecorded shapes file'}, "
                  f"not {SHAPES_FILE}", file=sys.stderr)
    return max(runs)[1] if runs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", help="results JSON (default: the newest in docs/results)")
    ap.add_argument("--repo", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    a = ap.parse_args()
    repo = os.path.abspath(a.repo)
    path = a.results or newest(repo)
    if not path:
        print(f"report.py: no results JSON of {SHAPES_FILE} in docs/results", file=sys.stderr)
        return 1
    if shapes_file(path) != SHAPES_FILE:
        print(f"report.py: {path} is a run of {shapes_file(path) or 'an unrecorded shapes file'}; the "
              f"chapters' tables are rows of {SHAPES_FILE}, so only its runs are reported here "
              "(stage 03's sweep: bench/split_kv_report.py)", file=sys.stderr)
        return 2
    data, rows = load_medians(path)
    shapes = load_shapes(repo)
    chapters = sorted(glob.glob(os.path.join(repo, "stages", "[0-9][0-9]_*", "README.md")))
    stages = [os.path.basename(os.path.dirname(c)) for c in chapters]
    ran = [st for st in stages if any(k.startswith(st + "/") for k in rows)]
    plot_bandwidth(path, data, rows, shapes, ran, os.path.join(repo, "docs", "results", PLOT))
    for chapter in chapters:
        stage = os.path.basename(os.path.dirname(chapter))
        with open(chapter, encoding="utf-8") as f:
            text = f.read()
        if BEGIN not in text or END not in text:
            continue
        section = text[text.index(BEGIN):text.index(END)]
        other_script = re.search(r"bench/\w+_report\.py", section)
        if other_script:  # a section another script writes (bench/prefill_report.py, ...)
            print(f"report.py: {os.path.relpath(chapter, repo)} kept: written by {other_script.group(0)}")
            continue
        if stage not in ran:  # its section stays as it is: from another run, or another script's
            cited = CITES_RUN.search(section)
            print(f"report.py: {os.path.relpath(chapter, repo)} kept: {os.path.relpath(path, repo)} did not "
                  f"measure {stage}" + (f"; its section stays generated from {cited.group(0)}" if cited else ""))
            continue
        i = stages.index(stage)
        prev = stages[i - 1] if i > 0 and stages[i - 1] in ran else None
        body = stage_section(stage, prev, path, data, rows, shapes, repo, os.path.dirname(chapter))
        new = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END),
                     lambda _: BEGIN + "\n" + "\n".join(body) + "\n" + END, text, flags=re.S)
        if HISTORY_BEGIN in new and HISTORY_END in new:
            hist = history_section(stage, path, repo, shapes)
            new = re.sub(re.escape(HISTORY_BEGIN) + r".*?" + re.escape(HISTORY_END),
                         lambda _: HISTORY_BEGIN + "\n" + "\n".join(hist) + "\n" + HISTORY_END, new, flags=re.S)
        with open(chapter, "w", encoding="utf-8") as f:
            f.write(new)
        print(f"report.py: {os.path.relpath(chapter, repo)} updated from {os.path.relpath(path, repo)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
