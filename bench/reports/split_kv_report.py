#!/usr/bin/env python3
"""Stage 03's results, generated from one results JSON (`scripts/gpu-run.sh --shapes
bench/shapes_split_kv.csv` writes it: flashstep_bench + bench/peers/attention.py, merged by
bench/reports/merge_results.py): the stage's speed goals, the sweep table and the sweep plot.

    split_kv_report.py RESULTS.json --targets-only
    split_kv_report.py RESULTS.json [--tune TUNE.json [--clean CLEAN.json]] \
                       --readme stages/03_split_kv/README.md --plot stages/03_split_kv/sweep.png \
                       [--write-targets | --check]

TUNE.json is flashstep_split_kv_tune's output and CLEAN.json bench/peers/attention.py --clean-l2's,
from the same GPU run (gpu-run.sh's split_kv_tune step: tune.json, clean_l2_peers.json): they add the knob table and the read-only-flush comparison.

--readme replaces the text between the README's `<!-- split_kv results:begin -->` and
`<!-- split_kv results:end -->` markers (nothing else; markers of their own, so that
bench/reports/decode_report.py, which fills the plain `results:` markers of every chapter from
bench/shapes.csv, leaves this chapter's sweep alone); --write-targets stores the verdicts in the
JSON under flashstep.split_kv_targets and the decode goals under
flashstep.split_kv_decode_goals. --check writes nothing: it says whether the README's
section is what these files generate (exit 0) or stale (exit 1); run it from the repository
root with the paths the section cites. Every number written comes from the JSON files.

The decode goals (decode_goals below), for a run that has what they need: stage 03 against
cuDNN SDPA and against the better of FlashInfer's two decode wrappers (bench/peers/attention.py's
flashinfer_cuda_core_decode and flashinfer_tc_decode) on each of GOAL_SHAPES, their
geometric mean and worst shape; and the layout and page-order check, stage 03's time on
LAYOUT_SHAPES against sequential NHD page 16 at the same sizes. A run made before the read
ceiling (context read_ceiling_GB/s) and FlashInfer's decode rows existed has neither: its
section, its columns and its plot come out as they always did.
"""
import json
import math
import os
import sys

from common import by_name, context, load, medians, parser, write_section  # bench/reports/

STAGE, BASE = "03_split_kv", "02_paged"
CUDNN, FLASH = "peer_torch_sdpa_cudnn", "peer_torch_sdpa_flash"
FLASHINFER = ("peer_flashinfer_cuda_core_decode", "peer_flashinfer_tc_decode")  # the better one counts
BATCHES = (1, 4, 16, 64, 128)
KV_LENS = (1024, 4096, 16384, 65536)
# The decode goals: the sweep and batch 1 x kv 131072; the layout and page-order check at
# batch 128 x kv 8192 against sequential NHD page 16 (what, shape).
GOAL_SHAPES = tuple(f"b{b}_kv{kv}_p16" for b in BATCHES for kv in KV_LENS) + ("b1_kv131072_p16",)
LAYOUT_BASE = "b128_kv8192_p16"
LAYOUT_SHAPES = (("HND", "b128_kv8192_p16_hnd"), ("shuffled pages", "b128_kv8192_p16_shuffled"),
                 ("shuffled pages of one token", "b128_kv8192_p1_shuffled"))
# Stage 03 the fastest on every shape: the worst ratio (and so the geomean) at least 1; a
# layout or page order at most 3% slower (the page-size goal of stage 02, 1.03 in time).
RATIO_GOAL = 1.00
LAYOUT_GOAL_PCT = 2.0

# (what, numerator row, denominator row, goal, "gbps" for a GB/s ratio >= goal or
#  "time" for a time ratio <= goal)
TARGETS = [
    ("03 vs cuDNN SDPA decode, batch 1 x kv 16384", f"{STAGE}/b1_kv16384_p16", f"{CUDNN}/b1_kv16384_p16", 1.40, "gbps"),
    ("03 vs cuDNN SDPA decode, batch 1 x kv 131072", f"{STAGE}/b1_kv131072_p16", f"{CUDNN}/b1_kv131072_p16", 1.05, "gbps"),
    ("03 vs 02, batch 1 x kv 16384", f"{STAGE}/b1_kv16384_p16", f"{BASE}/b1_kv16384_p16", 1.8, "gbps"),
    ("03 vs 02, batch 1 x kv 65536", f"{STAGE}/b1_kv65536_p16", f"{BASE}/b1_kv65536_p16", 1.8, "gbps"),
    ("03 vs 02, batch 1 x kv 131072", f"{STAGE}/b1_kv131072_p16", f"{BASE}/b1_kv131072_p16", 1.8, "gbps"),
    ("03 time / 02 time, batch 128 x kv 8192", f"{STAGE}/b128_kv8192_p16", f"{BASE}/b128_kv8192_p16", 1.03, "time"),
]


def time_us(row):
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[row.get("time_unit", "ns")]
    return row["real_time"] * scale


def targets(rows):
    out = []
    for what, num, den, goal, how in TARGETS:
        t = {"target": what, "numerator": num, "denominator": den,
             "goal": (">= " if how == "gbps" else "<= ") + f"{goal:.2f}"}
        if num in rows and den in rows:
            if how == "gbps":
                ratio = rows[num]["GB/s"] / rows[den]["GB/s"]
                t["met"] = ratio >= goal
            else:
                ratio = time_us(rows[num]) / time_us(rows[den])
                t["met"] = ratio <= goal
            t["ratio"] = round(ratio, 3)
        else:
            t["met"] = None
            t["missing"] = [n for n in (num, den) if n not in rows]
        out.append(t)
    return out


def fmt(x, digits=0):
    return "" if x is None else f"{x:,.{digits}f}"


def cell(x, digits=0):
    """A cell of a column that only some runs have: "–" where this run has no value."""
    return "–" if x is None else f"{x:,.{digits}f}"


def gbps(rows, name):
    r = rows.get(name)
    return r["GB/s"] if r and "GB/s" in r else None


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def read_ceiling(run):
    """The run's read ceiling in GB/s, or None for a run made before it was measured."""
    value = context(run).get("read_ceiling_GB/s")
    return float(value) if value is not None else None


def has_flashinfer(rows):
    return any(n.startswith(p + "/") for n in rows for p in FLASHINFER)


def best_flashinfer(rows, shape):
    """(GB/s, row name) of the faster of FlashInfer's decode wrappers on `shape`, or (None, None)."""
    ran = [(gbps(rows, f"{p}/{shape}"), f"{p}/{shape}") for p in FLASHINFER if gbps(rows, f"{p}/{shape}")]
    return max(ran) if ran else (None, None)


def pct_of_read(rows, name, read):
    """% of the read ceiling of a row: its own counter, else its GB/s over the run's ceiling."""
    r = rows.get(name)
    if not r or "GB/s" not in r:
        return None
    if "pct_of_read_ceiling" in r:
        return r["pct_of_read_ceiling"]
    return None if not read else 100.0 * r["GB/s"] / read


def summary(ratios, goal):
    """Geometric mean and worst of {shape: ratio} (None where not measured): "geomean",
    "worst", "worst_shape", "measured" (shapes with a ratio), "missing" (shapes without),
    "met" (every shape measured and the worst at least `goal`; False as soon as one
    measured shape is below; otherwise None)."""
    measured = {k: v for k, v in ratios.items() if v is not None}
    out = {"measured": len(measured), "of": len(ratios), "missing": [k for k, v in ratios.items() if v is None]}
    if measured:
        out["geomean"] = round(math.exp(sum(math.log(v) for v in measured.values()) / len(measured)), 4)
        out["worst_shape"] = min(measured, key=measured.get)
        out["worst"] = round(measured[out["worst_shape"]], 4)
    out["met"] = (False if measured and out["worst"] < goal else
                  True if measured and len(measured) == len(ratios) else None)
    return out


def decode_goals(run, rows):
    """Stage 03's decode goals from one run: per shape of GOAL_SHAPES its GB/s, % of the read
    ceiling and ratios (GB/s over GB/s) to stage 02, cuDNN and the better FlashInfer wrapper;
    the summary of the ratios to cuDNN and to FlashInfer; the layout and page-order check
    (stage 03's time on each of LAYOUT_SHAPES over its time on LAYOUT_BASE, as a % more)."""
    read = read_ceiling(run)
    per_shape = []
    for shape in GOAL_SHAPES:
        s3 = gbps(rows, f"{STAGE}/{shape}")
        fi, fi_row = best_flashinfer(rows, shape)
        per_shape.append({"shape": shape, "GB/s": s3, "pct_of_read_ceiling": pct_of_read(rows, f"{STAGE}/{shape}", read),
                          "vs_02": ratio(s3, gbps(rows, f"{BASE}/{shape}")),
                          "vs_cudnn": ratio(s3, gbps(rows, f"{CUDNN}/{shape}")),
                          "vs_flashinfer": ratio(s3, fi), "flashinfer": fi_row})
    layout = []
    base = rows.get(f"{STAGE}/{LAYOUT_BASE}")
    for what, shape in LAYOUT_SHAPES:
        r = rows.get(f"{STAGE}/{shape}")
        pct = 100.0 * (time_us(r) / time_us(base) - 1.0) if r and base else None
        layout.append({"what": what, "shape": shape, "base": LAYOUT_BASE,
                       "time_pct_vs_base": None if pct is None else round(pct, 2),
                       "goal": f"<= +{LAYOUT_GOAL_PCT:.1f}%",
                       "met": None if pct is None else pct <= LAYOUT_GOAL_PCT})
    return {"shapes": per_shape,
            "vs_cudnn": {**summary({p["shape"]: p["vs_cudnn"] for p in per_shape}, RATIO_GOAL),
                         "goal": f">= {RATIO_GOAL:.2f}"},
            "vs_flashinfer": {**summary({p["shape"]: p["vs_flashinfer"] for p in per_shape}, RATIO_GOAL),
                              "goal": f">= {RATIO_GOAL:.2f}"},
            "layout": layout}


def goals_markdown(goals):
    """The decode goals as Markdown lines: the summary, then the layout and page-order check."""
    verdict = {True: "yes", False: "**no**", None: "not measured"}
    n = len(GOAL_SHAPES)
    lines = [f"**Decode goals** (stage 03 on the {n} shapes of the sweep and batch 1 x kv 131072; ratios of GB/s "
             "within this run; FlashInfer: the faster of its CUDA-core and tensor-core decode wrappers on each "
             "shape):", "", "| what | measured | worst shape | goal | met |", "|:--|--:|:--|--:|:--|"]
    for key, peer in (("vs_cudnn", "cuDNN SDPA"), ("vs_flashinfer", "FlashInfer")):
        g = goals[key]
        shown = f"{g['measured']} of {g['of']} shapes" if g["measured"] < g["of"] else f"{g['of']} shapes"
        worst = f"`{g['worst_shape']}`" if "worst_shape" in g else "–"
        lines.append(f"| 03 / {peer}, geomean over {shown} | {cell(g.get('geomean'), 3)} | | | |")
        lines.append(f"| 03 / {peer}, worst shape | {cell(g.get('worst'), 3)} | {worst} | {g['goal']} | "
                     f"{verdict[g['met']]} |")
    lines += ["", f"**Layout and page order** (stage 03's time at batch 128 x kv 8192 against sequential NHD "
              f"page 16, `{LAYOUT_BASE}`, in the same run; +: slower):", "",
              "| layout / page order | shape | time vs NHD page 16 | goal | met |", "|:--|:--|--:|--:|:--|"]
    for x in goals["layout"]:
        pct = "–" if x["time_pct_vs_base"] is None else f"{x['time_pct_vs_base']:+.1f}%"
        lines.append(f"| {x['what']} | `{x['shape']}` | {pct} | {x['goal']} | {verdict[x['met']]} |")
    return lines


def floor_markdown(run, rows, read, fi):
    """The sweep against the floor a call cannot beat: the launch floor (a CUDA graph of one
    empty kernel, timed like the stages; flashstep_bench's ceiling/launch_floor_1) plus the
    call's bytes at the read ceiling. Only for runs that measured both."""
    ctx = context(run)
    launch = ctx.get("launch_floor_1_us")
    if read is None or launch is None:
        return []
    launch = float(launch)
    two = ctx.get("launch_floor_2_us")
    head = ["batch", "kv_len", "floor (us)", "03 (us)", "03 / floor", "cuDNN / floor"] + \
        (["FlashInfer / floor"] if fi else [])
    lines = ["", f"**Against the floor** (times; floor = the launch floor, {launch:.1f} us for a CUDA graph of one "
             "empty kernel timed like the stages" + (f" ({float(two):.1f} us for two)" if two else "") +
             f", plus the call's bytes at the read ceiling, {read:,.0f} GB/s; 1.00 is a call that costs only "
             "its launch and its bytes):", "", "| " + " | ".join(head) + " |", "|" + "--:|" * len(head)]
    for b in BATCHES:
        for kv in KV_LENS:
            shape = f"b{b}_kv{kv}_p16"
            r3 = rows.get(f"{STAGE}/{shape}")
            if not r3 or "bytes" not in r3:
                continue
            floor = launch + r3["bytes"] / (read * 1e9) * 1e6  # the bytes the bench credits the call with

            def over(name):
                r = rows.get(name)
                return None if not r or "GB/s" not in r else time_us(r) / floor
            bf = best_flashinfer(rows, shape)[1]
            cells = [str(b), str(kv), fmt(floor, 1), fmt(time_us(r3), 1), fmt(time_us(r3) / floor, 2),
                     cell(over(f"{CUDNN}/{shape}"), 2)] + ([cell(over(bf) if bf else None, 2)] if fi else [])
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(run, rows, verdicts, results_path, tune=None, image=None, clean=None):
    ctx = context(run)
    copy = float(ctx.get("copy_ceiling_GB/s", "nan"))
    read, fi = read_ceiling(run), has_flashinfer(rows)  # neither in a run made before they existed
    peers = run["raw"].get("flashstep", {}).get("peers", {})
    ceilings = f"Copy ceiling measured in the same run: {copy:,.0f} GB/s."
    if read is not None:
        ceilings = (f"Ceilings measured in the same run: copy {copy:,.0f} GB/s (bytes read + written), read "
                    f"{read:,.0f} GB/s (bytes read by a kernel that only reads, `bench/ceilings/read_ceiling.cu`: the "
                    "most a decode, which almost only reads, can reach).")
    versions = f"torch {peers.get('torch', '?')}, cuDNN {peers.get('cudnn', '?')}"
    who_reads = "peers read contiguous KV."
    if fi:
        versions += f", FlashInfer {peers.get('flashinfer', '?')}"
        who_reads = ("SDPA peers read contiguous KV, FlashInfer's decode wrappers the same paged pool as the "
                     "stages (its page size, layout and page order).")
    lines = [f"Generated by `bench/reports/split_kv_report.py` from `{results_path}`: "
             f"{ctx.get('device', '?')}, commit {ctx.get('commit', '?')}, {ctx.get('date', '?')}; "
             f"{versions}. {ceilings} bf16, 32 query / 8 kv heads, head_dim 128, page_size 16; {who_reads}", "",
             "**Targets** (ratios within this one run):", "",
             "| target | ratio | goal | met |", "|:--|--:|--:|:--|"]
    for t in verdicts:
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {fmt(t.get('ratio'), 3)} | {t['goal']} | {met} |")
    if read is not None or fi:
        lines += [""] + goals_markdown(decode_goals(run, rows))
    head = ["batch", "kv_len", "02_paged", "03_split_kv", "cuDNN", "flash"] + (["FlashInfer"] if fi else []) + \
        ["03 % of copy"] + (["03 % of read"] if read is not None else []) + ["03 / 02", "03 / cuDNN"] + \
        (["03 / FlashInfer"] if fi else [])
    lines += ["", "**Sweep** (GB/s: the bytes a decode must move, q + K + V + o + lse, over the median time"
              + ("; FlashInfer: the faster of its two decode wrappers" if fi else "") + "):", "",
              "| " + " | ".join(head) + " |", "|" + "--:|" * len(head)]
    for b in BATCHES:
        for kv in KV_LENS:
            shape = f"b{b}_kv{kv}_p16"
            s3, s2 = gbps(rows, f"{STAGE}/{shape}"), gbps(rows, f"{BASE}/{shape}")
            cu, fl = gbps(rows, f"{CUDNN}/{shape}"), gbps(rows, f"{FLASH}/{shape}")
            bf = best_flashinfer(rows, shape)[0]
            pct = None if s3 is None else 100 * s3 / copy
            cells = [str(b), str(kv), fmt(s2), fmt(s3), fmt(cu), fmt(fl)] + ([cell(bf)] if fi else []) + \
                [fmt(pct, 1)] + ([cell(pct_of_read(rows, f"{STAGE}/{shape}", read), 1)] if read is not None else []) + \
                [fmt(ratio(s3, s2), 2), fmt(ratio(s3, cu), 2)] + ([cell(ratio(s3, bf), 2)] if fi else [])
            lines.append("| " + " | ".join(cells) + " |")
    lines += floor_markdown(run, rows, read, fi)
    extra = [n for n in rows if n.startswith(STAGE + "/") and not any(
        n == f"{STAGE}/b{b}_kv{kv}_p16" for b in BATCHES for kv in KV_LENS)]
    if extra:
        head = ["shape", "02_paged GB/s", "03_split_kv GB/s", "03 time (us)"] + \
            (["03 % of read"] if read is not None else []) + (["FlashInfer GB/s", "03 / FlashInfer"] if fi else [])
        lines += ["", "Other shapes of the same run:", "", "| " + " | ".join(head) + " |",
                  "|:--|" + "--:|" * (len(head) - 1)]
        for n in sorted(extra):
            shape = n.split("/", 1)[1]
            bf = best_flashinfer(rows, shape)[0]
            cells = [f"`{shape}`", fmt(gbps(rows, f"{BASE}/{shape}")), fmt(gbps(rows, n)), fmt(time_us(rows[n]), 1)] + \
                ([cell(pct_of_read(rows, n, read), 1)] if read is not None else []) + \
                ([cell(bf), cell(ratio(gbps(rows, n), bf), 2)] if fi else [])
            lines.append("| " + " | ".join(cells) + " |")
    if image:
        if read is not None or fi:
            lines += ["", f"![GB/s of stages 02 and 03 and the peers over the sweep, against the copy and read "
                          f"ceilings]({image})"]
        else:
            lines += ["", f"![GB/s of stages 02 and 03 and the PyTorch SDPA peers over the sweep, "
                          f"against the copy ceiling]({image})"]
    if tune:
        lines += [""] + knob_lines(tune)
    if tune and clean:
        _, trows = tune
        cdata, crows = clean
        lines += ["", f"**With a read-only L2 flush** (`bench/stages/split_kv_flush.cu`; peers from `{cdata['path']}`): "
                  "the timer above evicts the L2 by writing it, so every call starts with up to one L2 of "
                  "dirty lines to write back; here the L2 is evicted by reading, on the same shapes "
                  "(GB/s, median):", "",
                  "| shape | 03_split_kv | cuDNN | flash | 03 / cuDNN |", "|:--|--:|--:|--:|--:|"]
        for n in trows:
            _, v, shape = n.split("/", 2)
            if v != "auto_clean_l2":
                continue
            s3 = gbps(trows, n)
            cu = gbps(crows, f"peer_clean_l2_torch_sdpa_cudnn/{shape}")
            fl = gbps(crows, f"peer_clean_l2_torch_sdpa_flash/{shape}")
            lines.append(f"| `{shape}` | {fmt(s3)} | {fmt(cu)} | {fmt(fl)} | {fmt(ratio(s3, cu), 2)} |")
    return "\n".join(lines)


def summary_rows(run, rows, verdicts):
    """The chapter's one table, as (what, measured, goal, met) cells: the targets, the decode
    goals against the peers, the layout and page-order check, and the ceiling (the sweep
    shape where stage 03 comes closest to it)."""
    verdict = {True: "yes", False: "**no**", None: "not measured"}
    out = [(t["target"], fmt(t.get("ratio"), 3), t["goal"], verdict[t["met"]]) for t in verdicts]
    read, fi = read_ceiling(run), has_flashinfer(rows)
    if read is None and not fi:
        return out
    goals = decode_goals(run, rows)
    for key, peer in (("vs_cudnn", "cuDNN SDPA"), ("vs_flashinfer", "FlashInfer")):
        g = goals[key]
        shown = f"{g['measured']} of {g['of']} shapes" if g["measured"] < g["of"] else f"{g['of']} shapes"
        worst = f" (`{g['worst_shape']}`)" if "worst_shape" in g else ""
        out.append((f"03 / {peer}, geomean over {shown}", cell(g.get("geomean"), 3), "", ""))
        out.append((f"03 / {peer}, worst shape{worst}", cell(g.get("worst"), 3), g["goal"], verdict[g["met"]]))
    for x in goals["layout"]:
        pct = "–" if x["time_pct_vs_base"] is None else f"{x['time_pct_vs_base']:+.1f}%"
        out.append((f"03 time, {x['what']} vs sequential NHD page 16 (`{x['shape']}`)", pct, x["goal"],
                    verdict[x["met"]]))
    if read is not None:
        pcts = {p["shape"]: p["pct_of_read_ceiling"] for p in goals["shapes"][:len(BATCHES) * len(KV_LENS)]
                if p["pct_of_read_ceiling"] is not None}
        if pcts:
            best = max(pcts, key=pcts.get)
            out.append((f"03 % of the read ceiling, highest over the sweep (`{best}`)", fmt(pcts[best], 1), "", ""))
    return out


def chapter_markdown(run, rows, verdicts, results_path, tune=None, image=None, clean=None, page=None):
    """The chapter's section: where the numbers come from, ONE summary table (summary_rows),
    the plot, the knob table (the lesson: what each change bought), and a pointer to the
    results page, which shows every row of these files; `markdown` (--full) prints the
    derived tables (sweep, floor, other shapes, read-only flush)."""
    head = markdown(run, rows, verdicts, results_path).split("\n")[0]
    lines = [head, "", "**Summary** (ratios within this one run; +: slower):", "",
             "| measured | value | goal | met |", "|:--|--:|--:|:--|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in summary_rows(run, rows, verdicts)]
    if image:
        lines += ["", f"![GB/s of stages 02 and 03 and the peers over the sweep, against the copy and read "
                      f"ceilings]({image})" if read_ceiling(run) is not None or has_flashinfer(rows) else
                  f"![GB/s of stages 02 and 03 and the PyTorch SDPA peers over the sweep, "
                  f"against the copy ceiling]({image})"]
    if tune:
        lines += [""] + knob_lines(tune)
    cited = [f"`{results_path}`"] + ([f"`{tune[0]['path']}`"] if tune else []) + \
        ([f"peers from `{clean[0]['path']}`"] if clean else [])
    where = f"[{page}]({os.path.join('..', '..', page)}/)" if page else "its folder"
    lines += ["", "Every row of " + ", ".join(cited) + " (every shape of the sweep, each stage and peer, its time "
              f"and GB/s) is on the docs site's results page, generated from {where} by `scripts/docs_results.py`; "
              "`bench/reports/split_kv_report.py` with `--full` prints the tables derived from them: the sweep "
              "with its ratios, the sweep against the floor, the other shapes and the read-only L2 flush."]
    return "\n".join(lines)


def knob_lines(tune):
    tdata, trows = tune
    lines = [f"**Knobs** (`bench/stages/split_kv_tune.cpp`, `{tdata['path']}`, same device; GB/s, median):", ""]
    variants = []
    shapes = []
    for n in trows:
        _, v, shape = n.split("/", 2)
        if v not in variants:
            variants.append(v)
        if shape not in shapes:
            shapes.append(shape)
    lines += ["| shape | " + " | ".join(variants) + " |", "|:--|" + "--:|" * len(variants)]
    for shape in shapes:
        cells = [fmt(gbps(trows, f"tune03/{v}/{shape}")) for v in variants]
        lines.append(f"| `{shape}` | " + " | ".join(cells) + " |")
    return lines


def plot(rows, copy, out_png, title, read=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(BATCHES), figsize=(15, 3.6), sharey=True)
    series = [(BASE, "02_paged", "#8c8c8c", "o"), (STAGE, "03_split_kv", "#c44e52", "s"),
              (CUDNN, "cuDNN SDPA", "#4c72b0", "^"), (FLASH, "flash SDPA", "#55a868", "v"),
              (FLASHINFER, "FlashInfer (faster wrapper)", "#8172b2", "D")]
    for ax, b in zip(axes, BATCHES):
        for prefix, label, color, marker in series:
            xs, ys = [], []
            for kv in KV_LENS:
                shape = f"b{b}_kv{kv}_p16"
                y = best_flashinfer(rows, shape)[0] if prefix == FLASHINFER else gbps(rows, f"{prefix}/{shape}")
                if y is not None:
                    xs.append(kv)
                    ys.append(y)
            if xs:
                ax.plot(xs, ys, marker=marker, color=color, label=label)
        ax.axhline(copy, color="black", linestyle="--", linewidth=1, label="copy ceiling")
        if read is not None:
            ax.axhline(read, color="black", linestyle=":", linewidth=1, label="read ceiling")
        ax.set_xscale("log", base=2)
        ax.set_xticks(KV_LENS)
        ax.set_xticklabels([f"{kv // 1024}k" for kv in KV_LENS])
        ax.set_title(f"batch {b}")
        ax.set_xlabel("kv_len")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB/s")
    axes[0].set_ylim(bottom=0)
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def main():
    p = parser(__doc__, results=None, check=False, repo=False)
    p.add_argument("results")
    p.add_argument("--tune", help="flashstep_split_kv_tune JSON of the same device")
    p.add_argument("--clean", help="bench/peers/attention.py --clean-l2 JSON of the same GPU run")
    p.add_argument("--targets-only", action="store_true")
    p.add_argument("--readme")
    p.add_argument("--plot")
    p.add_argument("--write-targets", action="store_true")
    p.add_argument("--full", action="store_true",
                   help="print every table derived from these files (the chapter shows the summary)")
    p.add_argument("--check", action="store_true",
                   help="with --readme: exit 1 if its section differs from what these files generate; writes nothing")
    a = p.parse_args()
    if a.check and not a.readme:
        p.error("--check needs --readme")
    run = load(a.results)
    rows = by_name(run)
    verdicts = targets(rows)
    for t in verdicts:
        v = {True: "MET ", False: "MISS", None: "n/a "}[t["met"]]
        print(f"{v} {t.get('ratio', float('nan')):7.3f} ({t['goal']})  {t['target']}")
    goals = decode_goals(run, rows)
    for key, peer in (("vs_cudnn", "cuDNN SDPA"), ("vs_flashinfer", "FlashInfer")):
        g = goals[key]
        v = {True: "MET ", False: "MISS", None: "n/a "}[g["met"]]
        print(f"{v} {g.get('worst', float('nan')):7.3f} ({g['goal']})  03 / {peer}, worst of {g['measured']} of "
              f"{g['of']} shapes ({g.get('worst_shape', '-')}); geomean {g.get('geomean', float('nan')):.3f}")
    for x in goals["layout"]:
        v = {True: "MET ", False: "MISS", None: "n/a "}[x["met"]]
        print(f"{v} {x['time_pct_vs_base'] if x['time_pct_vs_base'] is not None else float('nan'):+7.2f}% "
              f"({x['goal']})  03 time, {x['what']} vs sequential NHD page 16, batch 128 x kv 8192")
    if a.targets_only:
        return 0
    if a.write_targets and not a.check:
        raw = run["raw"]
        raw.setdefault("flashstep", {})["split_kv_targets"] = verdicts
        raw["flashstep"]["split_kv_decode_goals"] = goals
        with open(a.results, "w", encoding="utf-8") as f:
            json.dump(raw, f, indent=1)
    tune = None
    if a.tune:
        tdata, trows = medians(a.tune)
        tdata["path"] = a.tune
        tune = (tdata, trows)
    clean = None
    if a.clean:
        cdata, crows = medians(a.clean)
        cdata["path"] = a.clean
        clean = (cdata, crows)
    if a.plot and not a.check:
        ctx = context(run)
        plot(rows, float(ctx["copy_ceiling_GB/s"]), a.plot,
             f"{ctx.get('device', '')}, commit {ctx.get('commit', '')}: decode GB/s, bf16 32/8 heads, head_dim 128, page 16",
             read_ceiling(run))
    if a.full:
        print(markdown(run, rows, verdicts, os.path.relpath(a.results), tune, None, clean))
    if a.readme:
        image = os.path.relpath(a.plot, os.path.dirname(os.path.abspath(a.readme))) if a.plot else None
        return write_section(a.readme, "<!-- split_kv results:begin -->", "<!-- split_kv results:end -->",
                             "split_kv_report.py", os.getcwd(),
                             lambda: chapter_markdown(run, rows, verdicts, os.path.relpath(a.results), tune, image,
                                                      clean, os.path.dirname(os.path.relpath(a.results))),
                             a.check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
