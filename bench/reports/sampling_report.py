#!/usr/bin/env python3
"""Stage 06 results: merge flashstep_sampling_bench's JSON and bench/peers/sampling.py's
JSON into one results file, and regenerate the chapter's results section from it.

    python3 bench/reports/sampling_report.py merge --bench sampling_bench.json --peers peers_sampling.json \\
        --source-state build-gpu/source-state.txt --command "bench/stages/sampling_run.sh ..." \\
        --out docs/results/06_sampling/h100_sampling_DATE_COMMIT.json
    python3 bench/reports/sampling_report.py chapter --results docs/results/06_sampling/h100_sampling_DATE_COMMIT.json \
        [--history OLDER.json ... NEWER.json] [--repo .] [--check | --full]
    python3 bench/reports/sampling_report.py modes --results docs/results/06_sampling/h100_sampling_modes_DATE_COMMIT.json

`modes` writes the chapter's table of the pass techniques, each on and off, from the
results file of flashstep_sampling_bench --modes (an option of the bench up to commit
25f7800, when the techniques were still switches).

The chapter section lies between `<!-- sampling-results:begin -->` and
`<!-- sampling-results:end -->` in stages/06_sampling/README.md; nothing in it is typed. It
holds one table, the goals against their peers, and points to the docs site's results page
for every shape; `chapter --full` prints the table of every shape too and writes nothing.
Ratios are peer time / flashstep time (above 1: flashstep is faster), within one run.
Provenance is read, never typed: the commit and whether the tree was clean come from the
build folder's source-state.txt (scripts/gpu-build.sh), the date from the benchmark's JSON.
"""
import datetime
import json
import os
import re
import sys

from common import REPO, add_arguments, load, parser  # bench/reports/
from merge_results import source_state  # bench/reports/

SECTION = re.compile(r"(<!-- sampling-results:begin -->\n).*?(<!-- sampling-results:end -->)", re.S)
HISTORY = re.compile(r"(<!-- sampling-history:begin -->\n).*?(<!-- sampling-history:end -->)", re.S)
# the columns of the "how it got there" table: (shape, heading)
HISTORY_COLUMNS = [
    ("b128_v128256_top_p", "top_p b128"), ("b128_v128256_top_k_top_p_joint", "joint b128"),
    ("b128_v128256_logits", "from_logits b128"), ("b128_v128256_top_k_renorm", "top_k_renorm b128"),
    ("b128_v128256_top_p_renorm", "top_p_renorm b128"), ("b128_v128256_top_k_mask", "top_k_mask b128"),
    ("b1_v128256_top_p", "top_p b1"), ("b1_v128256_top_k_top_p_joint", "joint b1"),
]

# (flashstep shape, peer, least ratio peer/flashstep, what it stands for)
TARGETS = [
    ("b128_v128256_top_p", "flashinfer", 1.0, "top_p p=0.9, batch 128 x 128256 vs FlashInfer"),
    ("b128_v128256_top_k_top_p_joint", "torch_sort_top_k_top_p", 10.0,
     "top_k_top_p k=50 p=0.9 joint, batch 128 vs PyTorch sort-based"),
    ("b128_v128256_top_k_top_p_top_k_first", "torch_sort_top_k_top_p", 10.0,
     "top_k_top_p k=50 p=0.9 top_k_first, batch 128 vs PyTorch sort-based"),
    ("b128_v128256_top_k_top_p_joint", "flashinfer", 1.0, "top_k_top_p joint, batch 128 vs FlashInfer joint"),
    ("b128_v128256_top_k_top_p_top_k_first", "torch_topk_top_p", 1.0,
     "top_k_top_p top_k_first, batch 128 vs PyTorch topk + top-p"),
    ("b128_v128256_logits", "flashinfer", 1.0, "sampling_from_logits, batch 128 vs FlashInfer"),
    ("b1_v128256_logits", "flashinfer", 1.0, "sampling_from_logits, batch 1 vs FlashInfer"),
    ("b128_v128256_top_k_renorm", "flashinfer", 1.0, "top_k_renorm_probs, batch 128 vs FlashInfer"),
    ("b128_v128256_top_p_renorm", "flashinfer", 1.0, "top_p_renorm_probs, batch 128 vs FlashInfer"),
    ("b1_v128256_top_p", "flashinfer", 2.0, "top_p, batch 1 vs FlashInfer"),
    ("b1_v128256_top_k_top_p_joint", "flashinfer", 2.0, "top_k_top_p joint, batch 1 vs FlashInfer"),
    ("b1_v128256_plain", "flashinfer", 1.0, "sampling_from_probs, batch 1 vs FlashInfer"),
    ("b1_v128256_top_k", "flashinfer", 1.0, "top_k k=50, batch 1 vs FlashInfer"),
    ("b1_v128256_min_p", "flashinfer", 1.0, "min_p 0.05, batch 1 vs FlashInfer"),
]


def bench_rows(path):
    """(the run, its rows) of flashstep_sampling_bench's JSON, read by the one reader: one
    row per shape (its median), in the shape of the merged file's "flashstep" list."""
    run = load(path)
    rows = [{"name": r["shape"], "operator": r.get("label", ""), "median_us": r["median_us"],
             "batch": int(r.get("batch", 0)), "vocab": int(r.get("vocab", 0)), "GB/s": r.get("GB/s"),
             "rounds_mean": r.get("rounds_mean"), "rounds_max": r.get("rounds_max")}
            for r in run["rows"] if r["impl"] == "06_sampling"]
    return run, rows


def merge(args):
    run, rows = bench_rows(args.bench)
    peers = {"results": []}
    if args.peers:
        with open(args.peers, encoding="utf-8") as f:
            peers = json.load(f)
    commit, tree = source_state(args.source_state)
    out = {"stage": "06_sampling", "device": run["device"] or peers.get("device"),
           "commit": commit + ("-dirty" if tree == "modified" else ""), "tree": tree,
           "command": args.command, "note": args.note,
           "date": run["date"] or datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
           "torch": peers.get("torch"), "flashinfer": peers.get("flashinfer"), "flashstep": rows,
           "peers": [r for r in peers["results"] if "median_us" in r],
           "peer_errors": [r for r in peers["results"] if "error" in r]}
    ours = {r["name"]: r for r in rows}
    theirs = {(r["name"], r["impl"]): r for r in out["peers"]}
    out["targets"] = []
    for shape, peer, least, what in TARGETS:
        t = {"shape": shape, "peer": peer, "target_ratio": least, "what": what}
        if shape in ours and (shape, peer) in theirs:
            t["ratio"] = theirs[(shape, peer)]["median_us"] / ours[shape]["median_us"]
            t["met"] = t["ratio"] >= least
        out["targets"].append(t)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")
    return 0


def fmt(x, digits=1):
    return "—" if x is None else f"{x:.{digits}f}"


def section(run, path, repo, full=False):
    """The chapter's section: provenance and ONE summary table, the goals (each against its
    peer: least ratio, measured ratio, met); with `full` (--full, printed) also the table of
    every shape with its peers' times, which the docs site's results page shows too."""
    res = run["raw"]  # the writer's own fields: operators, rounds, peers by impl
    lines = [f"Results from `{os.path.relpath(path, repo)}` ({run['device']}, commit `{run['commit']}`, "
             f"{run['date']}; FlashInfer {res.get('flashinfer') or 'not measured'}, torch {res.get('torch')}). "
             "Times are medians of CUDA-graph replays with the L2 flushed; ratios are peer time / "
             "flashstep time.", ""]
    if run["command"]:
        note = f". Note recorded with this run: {run['note']}." if run["note"] else ""
        lines += [f"Command: `{run['command']}`" + note, ""]
    peers = {}
    for r in res["peers"]:
        peers.setdefault(r["name"], {})[r["impl"]] = r["median_us"]
    rows = res["flashstep"] if full else []
    if rows:
        lines += ["| shape | operator | flashstep us | rounds mean / max | GB/s | peers (us) |", "|---|---|---|---|---|---|"]
    for r in rows:
        p = ", ".join(f"{k} {v:.1f}" for k, v in sorted(peers.get(r["name"], {}).items())) or "—"
        rounds = "—" if r.get("rounds_mean") is None else f"{r['rounds_mean']:.2f} / {int(r['rounds_max'])}"
        lines.append(f"| {r['name']} | {r['operator']} | {fmt(r['median_us'])} | {rounds} | {fmt(r.get('GB/s'), 0)} | {p} |")
    lines += ([""] if rows else []) + ["| target | peer | least ratio | ratio | met |", "|---|---|---|---|---|"]
    for t in res["targets"]:
        met = "—" if "met" not in t else ("yes" if t["met"] else "no")
        lines.append(f"| {t['what']} | {t['peer']} | {t['target_ratio']:.1f} | {fmt(t.get('ratio'), 2)} | {met} |")
    if not full:
        folder = os.path.relpath(os.path.dirname(path), repo)
        lines += ["", f"Every row of `{os.path.relpath(path, repo)}` (each shape's time, rounds and GB/s, and every "
                  "peer's time) is on the docs site's results page, generated from "
                  f"[{folder}](../../{folder}/) by `scripts/docs_results.py`; `bench/reports/sampling_report.py "
                  "chapter --full` prints the table of every shape with its peers."]
    return "\n".join(lines) + "\n"


def history(paths):
    """The "how it got there" table: one row per results file (oldest first), flashstep's
    median us per shape, the FlashInfer time of the newest file's run below."""
    heads = " | ".join(h for _, h in HISTORY_COLUMNS)
    lines = ["Each row is one committed results file (the step's commit and its recorded note); "
             "flashstep's median time in us per shape. The last row is FlashInfer in the newest run.", "",
             f"| results | commit | step | {heads} |", "|---|---|---|" + "---|" * len(HISTORY_COLUMNS)]
    newest = None
    for path in paths:
        run = load(path)
        newest = run
        ours = {r["shape"]: r["median_us"] for r in run["rows"] if r["impl"] == "06_sampling"}
        cells = " | ".join(fmt(ours.get(shape)) for shape, _ in HISTORY_COLUMNS)
        lines.append(f"| `{os.path.basename(path)}` | `{run['commit']}` | {run['note'] or '—'} | {cells} |")
    if newest is not None:
        fi = {r["shape"]: r["median_us"] for r in newest["peers"] if r["impl"] == "peer_flashinfer"}
        cells = " | ".join(fmt(fi.get(shape)) for shape, _ in HISTORY_COLUMNS)
        lines.append(f"| FlashInfer {newest['raw'].get('flashinfer')} | same run as `{newest['commit']}` | — | "
                     f"{cells} |")
    return "\n".join(lines) + "\n"


def chapter(args):
    run = load(args.results)
    if args.full:
        print(section(run, os.path.abspath(args.results), args.repo, full=True), end="")
        return 0
    chapter = os.path.join(args.repo, "stages", "06_sampling", "README.md")
    with open(chapter, encoding="utf-8") as f:
        old = f.read()
    if not SECTION.search(old):
        sys.exit(f"{chapter}: no sampling-results section")
    text = SECTION.sub(lambda m: m.group(1) + section(run, os.path.abspath(args.results), args.repo) + m.group(2), old)
    if args.history:
        if not HISTORY.search(text):
            sys.exit(f"{chapter}: no sampling-history section")
        text = HISTORY.sub(lambda m: m.group(1) + history(args.history) + m.group(2), text)
    if args.check:
        print("up to date" if text == old else "stale")
        return 0 if text == old else 1
    with open(chapter, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"regenerated the results section of {os.path.relpath(chapter, args.repo)}")
    return 0


CHAPTER = os.path.join(REPO, "stages", "06_sampling", "README.md")
MODES = re.compile(r"(<!-- sampling-modes:begin -->\n).*?(<!-- sampling-modes:end -->)", re.S)
MODE_HEADINGS = {
    "off": "off", "lean": "lean", "online+compact+lean": "+ online + compact",
    "stream+serp+online+compact+lean": "+ stream + serpentine (default)",
    "stream+online+compact+lean": "default − serpentine",
    "stream+serp+online+compact+lean+fuse": "default + fuse", "stream+serp+online+compact+lean+solo": "default + solo",
}


def modes_section(res, path):
    """The pass-mode A/B table: flashstep us per shape and mode (the mean of the rounds'
    medians), FlashInfer's in the same session."""
    modes = list(next(iter(res["modes"].values())).keys())
    fi = {r["name"]: r["median_us"] for r in res["peers"] if r["impl"] == "flashinfer"}
    lines = [f"From `{os.path.relpath(path, REPO)}` ({res['device']}, commit `{res['commit']}`, {res['date']}; "
             f"FlashInfer {res.get('flashinfer')}): us, the mean of the rounds' medians.", "",
             "| shape | " + " | ".join(MODE_HEADINGS.get(m, m) for m in modes) + " | FlashInfer |",
             "|---|" + "---|" * (len(modes) + 1)]
    for shape, per in res["modes"].items():
        cells = [fmt(sum(per[m]) / len(per[m])) if per.get(m) else "—" for m in modes]
        lines.append(f"| {shape} | " + " | ".join(cells) + f" | {fmt(fi.get(shape))} |")
    return "\n".join(lines) + "\n"


def modes(args):
    with open(args.results, encoding="utf-8") as f:
        res = json.load(f)
    with open(CHAPTER, encoding="utf-8") as f:
        text = f.read()
    if not MODES.search(text):
        sys.exit(f"{CHAPTER}: no sampling-modes section")
    text = MODES.sub(lambda m: m.group(1) + modes_section(res, os.path.abspath(args.results)) + m.group(2), text)
    with open(CHAPTER, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"regenerated the pass-modes section of {os.path.relpath(CHAPTER, REPO)}")
    return 0


def main():
    ap = parser(__doc__, results=None, check=False, repo=False)
    sub = ap.add_subparsers(dest="action", required=True)
    m = sub.add_parser("merge")
    m.add_argument("--bench", required=True)
    m.add_argument("--peers")
    m.add_argument("--source-state", required=True,
                   help="source-state.txt of the build folder the benchmark ran from (commit and tree)")
    m.add_argument("--command", required=True, help="the command that produced --bench and --peers")
    m.add_argument("--note", default="", help="what a reader of the results should know about the run")
    m.add_argument("--out", required=True)
    c = add_arguments(sub.add_parser("chapter"), what="results JSON of bench/reports/sampling_report.py merge")
    c.add_argument("--history", nargs="*", default=[],
                   help="results files, oldest first, for the chapter's \"how it got there\" table")
    c.add_argument("--full", action="store_true", help="print the table of every shape too; write nothing")
    d = sub.add_parser("modes", help="the chapter's pass-mode A/B table from a modes results file")
    d.add_argument("--results", required=True)
    args = ap.parse_args()
    if args.action == "modes":
        return modes(args)
    return merge(args) if args.action == "merge" else chapter(args)


if __name__ == "__main__":
    sys.exit(main())
