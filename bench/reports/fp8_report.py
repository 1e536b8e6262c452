#!/usr/bin/env python3
"""The FP8 decode table of one run: flashstep_bench's rows and bench/peers/attention.py's FlashInfer
rows on bench/shapes_fp8.csv, measured in the same GPU run, and the FP8 speed goals.

    python3 bench/reports/fp8_report.py --bench bench.json [--bench more.json] --peers peers.json [--shapes bench/shapes_fp8.csv]
        [--prefill-bench bench_prefill.json [--prefill-shapes bench/shapes_fp8_prefill.csv]]
        [--json results.json] [--markdown table.md]
    python3 bench/reports/fp8_report.py --chapter docs/results/fp8/<gpu>_fp8_results_<date>_<commit>.json [--check]

For every FP8 shape (a kv_dtype of e4m3 or e5m2): stage 02's and stage 03's median times,
the same stage's time on the bf16 pool of the same sizes (the row whose name ends in _bf16
instead of _<kv_dtype>[_scaled]), FlashInfer's two decode wrappers on the same FP8 pool,
and the floor: the bytes the row is credited with (q, K and V at one byte an element, o,
lse) over the read ceiling measured in the same run. Then the goals, each MET or MISS with
its ratio, judged on stage 03 (the decode stage that chooses between its split and stage
02's kernel):
  time <= 0.55 x the same stage's bf16 time      b128 x kv 8192 and b1 x kv 131072
  >= 1.15 x FlashInfer's faster FP8 wrapper       those two, b64 x kv 4096, b16 x kv 4096
  time <= 1.10 x the FP8 read floor               b128 x kv 8192 and b1 x kv 131072
  >= 1.0 x FlashInfer's faster FP8 wrapper        b1 x kv 16384, b16 x kv 1024 (launch-bound)
  with scales no slower than without             every shape and format
Stage 04 (tensor cores: the FP8 tiles widened in shared memory) has its own two columns,
its time on the FP8 pool and on the bf16 pool, and the same goals judged on it, marked 04.
With --prefill-bench (flashstep_bench on bench/shapes_fp8_prefill.csv, the same run):
stage 04's TFLOP/s on each FP8 prefill/append shape against the bf16 row of the same
sizes, and the append goal:
  append 512 on 8192: FP8 TFLOP/s >= 0.9 x bf16    every format, with and without scales
A number the run did not measure is "-" and its goal "n/a", never filled in from elsewhere.
Nothing here is typed by hand: every number comes from the files, read through
bench/reports/results.py. --json writes all of it for docs/results in the results files'
one shape (results.py's doc: device, commit, ceilings, rows, targets with ratio, goal and
met), which results.py reads back as it is, with the table beside it ("decode",
"prefill") and FlashInfer's version; --markdown the chapter's table of the goal shapes and
the goals. --chapter FILE writes that table, from a committed --json file alone, into the
FP8 lesson's chapter (stages/fp8/README.md) between its `<!-- fp8 results:begin -->` and `<!-- fp8 results:end -->` lines
(--check: write nothing, exit 1 where the chapter's section differs)."""
import json
import re
import sys

import os

from common import load, parser, write_section  # bench/reports/
from results import FORMAT  # bench/reports/results.py: the one shape's tag
from shapes import decode_bytes, load_shapes  # bench/shapes.py (common puts bench/ on the path)

STAGES = ("02_paged", "03_split_kv")
CORES = "03_split_kv[fp8_cuda_cores]"  # stage 03 with its tensor-core FP8 kernel off: the CUDA-core loop
APPEND_GOAL = 0.9  # stage 04 FP8 TFLOP/s / bf16 TFLOP/s, append shapes
RATIO_GOALS = {  # sizes -> (time vs bf16, speedup vs FlashInfer's best, time vs floor)
    "b128_kv8192": (0.55, 1.15, 1.10),
    "b1_kv131072": (0.55, 1.15, 1.10),
    "b64_kv4096": (None, 1.15, None),
    "b16_kv4096": (None, 1.15, None),
    "b1_kv16384": (None, 1.0, None),
    "b16_kv1024": (None, 1.0, None),
}


def bench_medians(runs, counter=None):
    """{row name: median time in microseconds} of flashstep_bench's runs (rows in error left
    out), or of each median row's `counter` (e.g. "TFLOP/s") when given."""
    out = {}
    for run in runs:
        for r in run["rows"]:
            if r.get("error_occurred"):
                continue
            if counter is None:
                out[r["name"]] = r["median_us"]
            elif isinstance(r.get(counter), (int, float)):
                out[r["name"]] = r[counter]
    return out


def shape_bytes(s):
    """The bytes a decode of shape `s` is credited with (bench/shapes.py's decode_bytes): K and V
    at one byte an element on an FP8 pool."""
    elem = 4 if s["dtype"] == "f32" else 2
    kv_elem = 1 if s["kv_dtype"] in ("e4m3", "e5m2") else elem
    return decode_bytes(int(s["batch"]), int(s["kv_len"]), int(s["num_qo_heads"]), int(s["num_kv_heads"]),
                        int(s["head_dim"]), elem, kv_elem)


def fmt(x, spec="8.1f"):
    return format(x, spec) if x is not None else "-".rjust(int(spec.split(".")[0]))


def md(x, spec=".1f"):
    return format(x, spec) if x is not None else "-"


def sibling(name, kv):
    """The bf16 row of the same sizes: name with _<kv>[_scaled] replaced by _bf16."""
    return name.split("_" + kv)[0] + "_bf16"


def append_rows(bench_path, shapes_path):
    """Stage 04 on the FP8 prefill shapes: [(shape, kv, FP8 TFLOP/s, bf16 TFLOP/s, ratio)]."""
    tflops = bench_medians([load(bench_path)], "TFLOP/s")
    shapes = load_shapes(shapes_path)
    names = {s["name"] for s in shapes}
    rows = []
    for s in shapes:
        kv = s.get("kv_dtype", "")
        if kv not in ("e4m3", "e5m2") or s.get("mode") != "prefill":
            continue
        bf16 = sibling(s["name"], kv)
        t, t_bf16 = tflops.get("04_tensor_core/" + s["name"]), tflops.get("04_tensor_core/" + bf16)
        if bf16 not in names:
            t_bf16 = None
        rows.append((s["name"], kv, t, t_bf16, t / t_bf16 if t and t_bf16 else None))
    return rows


BEGIN, END = "<!-- fp8 results:begin -->", "<!-- fp8 results:end -->"


def chapter(path, repo, check):
    """Stage 03's FP8 section from a results file this script wrote with --json (its table,
    prefill rows and goals as stored; nothing measured again)."""
    with open(path, encoding="utf-8") as f:
        r = json.load(f)
    cited = os.path.relpath(os.path.abspath(path), os.path.abspath(repo))
    goal_rows = [{"goal": t["what"], "ratio": t["ratio"],
                  "verdict": "n/a" if t["met"] is None else ("MET" if t["met"] else "MISS")} for t in r["targets"]]
    appends = [(x["shape"], x["kv_dtype"], x["tflops_04"], x["tflops_04_bf16"], x["x_bf16"]) for x in r["prefill"]]

    # The command as it was run; a file it names that has since moved (a git mv, never a
    # rewrite) is shown where it is now, beside the results file, and the line says so.
    here = os.path.dirname(cited)
    command, moved = r["command"], False
    for named in sorted(set(re.findall(r"docs/results/[\w./-]+", command))):
        now = os.path.join(here, os.path.basename(named))
        if not os.path.exists(os.path.join(repo, named)) and os.path.exists(os.path.join(repo, now)):
            command, moved = command.replace(named, now), True
    said = "the run's files" + (f", since moved to {here}/" if moved else "")

    def render():
        return (f"Generated by `python3 bench/reports/fp8_report.py --chapter {cited}` from {said} "
                f"(`{command}`).\n\n"
                + markdown({"device": r["device"], "commit": r["commit"]},
                           r["ceilings"].get("read_ceiling_GB/s", float("nan")), r.get("flashinfer"), r["decode"],
                           appends, goal_rows).rstrip("\n"))

    return write_section(os.path.join(repo, "stages", "fp8", "README.md"), BEGIN, END, "fp8_report.py", repo,
                         render, check)


def main():
    if "--chapter" in sys.argv:
        c = parser(__doc__, results=None)
        c.add_argument("--chapter", required=True, help="a results file this script wrote with --json")
        a = c.parse_args()
        return chapter(a.chapter, a.repo, a.check)
    p = parser(__doc__, results=None, check=False, repo=False)
    p.add_argument("--chapter", help="write stage 03's FP8 section from this results file (then nothing else)")
    p.add_argument("--bench", required=True, action="append",
                   help="flashstep_bench's JSON (again for more rows of the same run; the first file's ceilings)")
    p.add_argument("--peers", action="append", default=[], help="bench/peers/attention.py's JSON (again for another file)")
    p.add_argument("--shapes", default="bench/shapes_fp8.csv")
    p.add_argument("--prefill-bench", help="flashstep_bench's JSON on the FP8 prefill shapes (same run)")
    p.add_argument("--prefill-shapes", default="bench/shapes_fp8_prefill.csv")
    p.add_argument("--json", help="write the rows and goals here")
    p.add_argument("--markdown", help="write the chapter's table here")
    a = p.parse_args()
    runs = [load(path) for path in a.bench]
    bench = runs[0]  # the first file's device, commit and ceilings
    times = bench_medians(runs)
    read_gbps = bench["ceilings"].get("read_ceiling_GB/s", float("nan"))
    peers = {}
    fi_version = None
    for path in a.peers:
        try:
            run = load(path)
        except ValueError:  # a peers step cut short before its first shape: no file, or half of one
            continue
        raw = run["raw"] if isinstance(run["raw"], dict) else {}
        fi_version = fi_version or raw.get("flashinfer")
        for r in run["peers"]:
            if "error" not in r:
                peers[(r["impl"][len("peer_"):], r["shape"])] = r["median_us"]
    shapes = load_shapes(a.shapes)
    by_name = {s["name"]: s for s in shapes}

    context = {"device": bench["device"] or "?", "commit": bench["commit"] or "?"}
    print(f"device: {context['device']}, read ceiling {read_gbps:.0f} GB/s, commit {context['commit']}")
    table = []
    head = (f"{'shape':30s} {'02 us':>8s} {'03 us':>8s} {'03 bf16':>8s} {'04 us':>8s} {'04 bf16':>8s} "
            f"{'03 cores':>8s} {'FI cc':>8s} {'FI tc':>8s} "
            f"{'floor':>8s} {'x bf16':>7s} {'vs FI':>6s} {'% read':>7s}")
    print(head)
    goals = []
    for s in shapes:
        kv = s["kv_dtype"]
        if kv not in ("e4m3", "e5m2"):
            continue
        name = s["name"]
        sizes = name.split("_" + kv)[0]
        bf16_name = sizes + "_bf16"
        t02, t03 = times.get("02_paged/" + name), times.get("03_split_kv/" + name)
        t03_bf16 = times.get("03_split_kv/" + bf16_name) if bf16_name in by_name else None
        t_cores = times.get(CORES + "/" + name)
        t04 = times.get("04_tensor_core/" + name)
        t04_bf16 = times.get("04_tensor_core/" + bf16_name) if bf16_name in by_name else None
        cc, tc = peers.get(("flashinfer_cuda_core_decode", name)), peers.get(("flashinfer_tc_decode", name))
        fi_best = min([t for t in (cc, tc) if t is not None], default=None)
        floor = shape_bytes(s) / (read_gbps * 1e9) * 1e6 if read_gbps == read_gbps else None
        x_bf16 = t03 / t03_bf16 if t03 and t03_bf16 else None
        vs_fi = fi_best / t03 if t03 and fi_best else None
        pct = 100 * floor / t03 if t03 and floor else None
        print(f"{name:30s} {fmt(t02)} {fmt(t03)} {fmt(t03_bf16)} {fmt(t04)} {fmt(t04_bf16)} {fmt(t_cores)} {fmt(cc)} {fmt(tc)} {fmt(floor)} "
              f"{fmt(x_bf16, '7.3f')} {fmt(vs_fi, '6.2f')} {fmt(pct, '7.1f')}")
        table.append({"shape": name, "set": s.get("set"), "kv_dtype": kv, "k_scale": float(s.get("k_scale") or 1),
                      "v_scale": float(s.get("v_scale") or 1), "us_02": t02, "us_03": t03, "us_03_bf16": t03_bf16,
                      "us_04": t04, "us_04_bf16": t04_bf16, "us_03_cuda_cores": t_cores, "flashinfer_cuda_core_us": cc,
                      "flashinfer_tensor_core_us": tc, "floor_us": floor, "x_bf16_03": x_bf16,
                      "flashinfer_best_over_03": vs_fi, "pct_of_read_ceiling_03": pct,
                      "x_bf16_04": t04 / t04_bf16 if t04 and t04_bf16 else None,
                      "flashinfer_best_over_04": fi_best / t04 if t04 and fi_best else None})
        g_bf16, g_fi, g_floor = RATIO_GOALS.get(sizes, (None, None, None))
        if g_bf16 is not None:
            goals.append((f"{name}: 03 time / bf16 time <= {g_bf16}", x_bf16, x_bf16 is not None and x_bf16 <= g_bf16))
        if g_fi is not None:
            goals.append((f"{name}: FlashInfer best / 03 time >= {g_fi}", vs_fi, vs_fi is not None and vs_fi >= g_fi))
        if g_floor is not None:
            r = t03 / floor if t03 and floor else None
            goals.append((f"{name}: 03 time / FP8 read floor <= {g_floor}", r, r is not None and r <= g_floor))
        if name.endswith("_scaled"):
            plain = times.get("03_split_kv/" + name[: -len("_scaled")])
            r = t03 / plain if t03 and plain else None
            goals.append((f"{name}: time with scales / without <= 1.0", r, r is not None and r <= 1.0))
        if t04 is not None:  # the same goals on stage 04's tensor-core FP8 decode
            r = t04 / t04_bf16 if t04_bf16 else None
            if g_bf16 is not None:
                goals.append((f"{name}: 04 time / 04 bf16 time <= {g_bf16}", r, r is not None and r <= g_bf16))
            r = fi_best / t04 if fi_best else None
            if g_fi is not None:
                goals.append((f"{name}: FlashInfer best / 04 time >= {g_fi}", r, r is not None and r >= g_fi))
            r = t04 / floor if floor else None
            if g_floor is not None:
                goals.append((f"{name}: 04 time / FP8 read floor <= {g_floor}", r, r is not None and r <= g_floor))
    appends = append_rows(a.prefill_bench, a.prefill_shapes) if a.prefill_bench else []
    if appends:
        print()
        print(f"{'stage 04 prefill shape':40s} {'TFLOP/s':>8s} {'bf16':>8s} {'x bf16':>7s}")
        for name, kv, t, t_bf16, r in appends:
            print(f"{name:40s} {fmt(t)} {fmt(t_bf16)} {fmt(r, '7.3f')}")
            if name.startswith("append_"):
                goals.append((f"{name}: 04 TFLOP/s / bf16 TFLOP/s >= {APPEND_GOAL}", r,
                              r is not None and r >= APPEND_GOAL))
    print()
    for text, ratio, met in goals:
        verdict = "n/a " if ratio is None else ("MET " if met else "MISS")
        print(f"{verdict} {fmt(ratio, '7.3f')}  {text}")
    goal_rows = [{"goal": text, "ratio": ratio, "verdict": "n/a" if ratio is None else ("MET" if met else "MISS")}
                 for text, ratio, met in goals]
    if a.json:
        out = results_json(bench, runs, peers, fi_version, a, table, appends, goals)
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    if a.markdown:
        with open(a.markdown, "w", encoding="utf-8") as f:
            f.write(markdown(context, read_gbps, fi_version, table, appends, goal_rows))
    return 0


def results_json(bench, runs, peers, fi_version, a, table, appends, goals):
    """The report in the results files' one shape (bench/reports/results.py): the run's
    provenance and ceilings, one row per number measured (each stage's and peer's median on
    every FP8 shape and its bf16 sibling, stage 04's prefill rows with their TFLOP/s), the
    goals as targets; the decode and prefill tables beside them."""
    rows, seen = [], set()

    def add(name, median_us, **fields):
        if median_us is None or name in seen:
            return
        seen.add(name)
        impl, shape = name.split("/", 1)
        unit = "TFLOP/s" if isinstance(fields.get("TFLOP/s"), (int, float)) else "us"
        rows.append(dict(fields, name=name, impl=impl, shape=shape, median_us=median_us, unit=unit,
                         value=fields["TFLOP/s"] if unit == "TFLOP/s" else median_us))

    times = {r["name"]: r for run in runs for r in run["rows"] if not r.get("error_occurred")}
    for t in table:
        kv = t["kv_dtype"]
        for shape in (t["shape"], t["shape"].split("_" + kv)[0] + "_bf16"):
            for stage in ("02_paged", "03_split_kv", CORES, "04_tensor_core"):
                r = times.get(f"{stage}/{shape}")
                add(f"{stage}/{shape}", r and r["median_us"])
        for impl in ("flashinfer_cuda_core_decode", "flashinfer_tc_decode"):
            add(f"peer_{impl}/{t['shape']}", peers.get((impl, t["shape"])))
    if appends:
        prefill = {r["name"]: r for r in load(a.prefill_bench)["rows"] if not r.get("error_occurred")}
        for n, kv, _, _, _ in appends:
            for shape in (n, n.split("_" + kv)[0] + "_bf16"):
                r = prefill.get("04_tensor_core/" + shape)
                if r is not None:
                    add(r["name"], r["median_us"], **{"TFLOP/s": r.get("TFLOP/s")})
    targets = [{"what": text, "ratio": ratio, "goal": text.rsplit(" ", 2)[-2] + " " + text.rsplit(" ", 1)[-1],
                "met": None if ratio is None else bool(met)} for text, ratio, met in goals]
    command = "python3 bench/reports/fp8_report.py " + " ".join(sys.argv[1:])
    return {"format": FORMAT, "device": bench["device"], "commit": bench["commit"], "tree": bench["tree"],
            "command": command, "date": bench["date"], "note": None, "ceilings": bench["ceilings"],
            "rows": rows, "targets": targets, "flashinfer": fi_version, "shapes": a.shapes,
            "prefill_shapes": a.prefill_shapes if a.prefill_bench else None, "decode": table,
            "prefill": [{"shape": n, "kv_dtype": kv, "tflops_04": t, "tflops_04_bf16": tb, "x_bf16": r}
                        for n, kv, t, tb, r in appends]}


def markdown(context, read_gbps, fi_version, table, appends, goal_rows):
    """The chapter's table: the goal shapes without and with scales, then every goal."""
    lines = [f"Measured on {context.get('device', '?')} at commit `{context.get('commit', '?')}` "
             f"(read ceiling {read_gbps:.0f} GB/s; FlashInfer {fi_version or 'not in this run'}), "
             "median microseconds of CUDA-graph replays; bf16 q and o, 32/8 heads, head_dim 128, page 16. "
             "03 cores: stage 03 with its tensor-core FP8 kernel off (the CUDA-core loop); "
             "FI cc / FI tc: FlashInfer's decode wrapper on CUDA cores / tensor cores on the same FP8 pool; "
             "floor: the row's bytes (K and V at one byte an element) over the read ceiling.",
             "",
             "| shape | 03 us | 03 bf16 us | x bf16 | 03 cores us | 04 us | FI cc us | FI tc us | floor us "
             "| % of read ceiling | FI best / 03 |",
             "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in table:
        if r["set"] not in ("target", "sweep"):
            continue
        lines.append(f"| {r['shape']} | {md(r['us_03'])} | {md(r['us_03_bf16'])} | {md(r['x_bf16_03'], '.3f')} "
                     f"| {md(r.get('us_03_cuda_cores'))} | {md(r['us_04'])} | {md(r['flashinfer_cuda_core_us'])} | {md(r['flashinfer_tensor_core_us'])} "
                     f"| {md(r['floor_us'])} | {md(r['pct_of_read_ceiling_03'])} "
                     f"| {md(r['flashinfer_best_over_03'], '.2f')} |")
    if appends:
        lines += ["", "| stage 04, prefill shape | TFLOP/s | bf16 TFLOP/s | x bf16 |", "|:--|--:|--:|--:|"]
        lines += [f"| {n} | {md(t)} | {md(tb)} | {md(r, '.3f')} |" for n, _, t, tb, r in appends]
    lines += ["", "| goal | ratio | verdict |", "|:--|--:|:--|"]
    lines += [f"| {g['goal']} | {md(g['ratio'], '.3f')} | {g['verdict']} |" for g in goal_rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
