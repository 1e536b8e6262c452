"""The one reader of flashstep's results files: every report script and the docs site's
generator read a run through load(), in one shape, whatever program wrote the file.

A results file is kept exactly as the run wrote it (its numbers, commit, tree and
command are the measurement's record), so the files come in the shapes their writers
give them; each writer's shape has one function below that maps it, numbers untouched,
onto the one shape every reader sees:

    run = load("docs/results/02_paged/h100_decode_2026-11-22_1a0fe42.json")
    run["stage"]     the folder under docs/results the file lives in ("02_paged"), or None
    run["writer"]    which program's shape the file has (WRITERS)
    run["device"], run["commit"], run["tree"], run["command"], run["date"], run["note"]
                     as recorded (None where the file, or an older writer, did not record it)
    run["ceilings"]  {"copy_ceiling_GB/s": 3008.2, "read_ceiling_GB/s": ...,
                     "gemm_bf16_ceiling_TFLOP/s": ..., "launch_floor_1_us": ...}: measured
                     in the same process (empty where the writer measures none)
    run["rows"]      every measured row in the file's order, the stages' and the peers':
                     {"name": "<impl>/<shape>[/...]", "impl", "shape", "median_us",
                     "unit", "value", ...the writer's own fields (GB/s, TFLOP/s, label...)}
    run["peers"]     the rows of the peers (impl "peer_..."), named by the same shapes
    run["targets"]   the speed goals the run computed: {"what", "ratio", "goal", "met"}
                     (met None: not measured), in the file's order
    run["raw"]       the file's JSON as written, for what one report needs beyond this

A file a report script writes with --json (bench/reports/fp8_report.py) is in this shape
itself, tagged with "format": FORMAT, and is read as written.

A row's "unit" is that of its "value": GB/s (a decode: bytes moved), TFLOP/s (a prefill)
or us (a time, where the writer credits no amount). Google Benchmark files keep their
median rows only (the benchmark policy reports medians).
"""
import json
import math
import os
import re

FORMAT = "flashstep results 1"  # the "format" of a file written in the one shape itself
US_PER = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}  # microseconds in one of Google Benchmark's time units
CEILINGS = ("copy_ceiling_GB/s", "read_ceiling_GB/s", "gemm_bf16_ceiling_TFLOP/s",
            "launch_floor_1_us", "launch_floor_2_us")
GB_SUFFIX = re.compile(r"(/(min_time|min_warmup_time|repeats|iterations|threads):[^/]*"
                       r"|/manual_time|/real_time|/process_time)+$")


class ResultsError(ValueError):
    """A results file that cannot be read as results; the message names the file."""


def base_name(row):
    """A Google Benchmark row's name without what Google Benchmark appends: "02_paged/
    b16_kv4096_p16/min_time:0.050/repeats:5/manual_time_median" -> "02_paged/b16_kv4096_p16"."""
    name = row.get("run_name") or row["name"]
    aggregate = row.get("aggregate_name")
    if aggregate and name.endswith("_" + aggregate):
        name = name[:-len(aggregate) - 1]
    return GB_SUFFIX.sub("", name)


def _row(name, median_us, fields, unit=None):
    """A row of the one shape: the writer's `fields`, then name, impl, shape, median_us and
    the value in `unit` (GB/s or TFLOP/s where `fields` has it, else the time in us)."""
    parts = name.split("/")
    row = dict(fields)
    if unit is None:
        unit = next((u for u in ("GB/s", "TFLOP/s") if isinstance(fields.get(u), (int, float))), "us")
    row.update({"name": name, "impl": parts[0], "shape": parts[1] if len(parts) > 1 else "",
                "median_us": median_us, "unit": unit,
                "value": median_us if unit == "us" else float(fields[unit])})
    return row


def _run(path, raw, writer, **fields):
    run = {"path": path, "stage": stage_of(path), "writer": writer, "device": None, "commit": None,
           "tree": None, "command": None, "date": None, "note": None, "ceilings": {}, "rows": [],
           "targets": [], "raw": raw}
    run.update(fields)
    run["peers"] = [r for r in run["rows"] if r["impl"].startswith("peer_")]
    return run


def stage_of(path):
    """The stage folder (NN_name) of docs/results a file lives in, or None."""
    for part in reversed(os.path.normpath(os.path.abspath(path)).split(os.sep)[:-1]):
        if re.match(r"^\d\d_\w+$", part):
            return part
    return None


def _gbench_targets(targets):
    return [{"what": t["target"], "ratio": t.get("ratio"), "goal": t.get("goal", ""), "met": t.get("met")}
            for t in targets if isinstance(t, dict) and "target" in t]


def from_gbench(path, data):
    """flashstep_bench and flashstep_split_kv_tune (Google Benchmark's JSON), as written or
    with bench/reports/merge_results.py's "flashstep" block (command, tree, note, targets,
    peers merged in as peer_* rows), gpu-fp8.sh's "flashstep_run", a stage 07 step's
    "flashstep_step"; also bench/peers/attention.py --clean-l2 (Google Benchmark-shaped)."""
    bench = data["benchmarks"]
    have_medians = any(isinstance(b, dict) and b.get("aggregate_name") == "median" for b in bench)
    rows = []
    for i, b in enumerate(bench):
        if not isinstance(b, dict) or "name" not in b:
            raise ResultsError(f"{path}: benchmarks[{i}] has no name")
        if have_medians and b.get("aggregate_name") != "median":
            continue
        unit = b.get("time_unit", "ns")
        if unit not in US_PER:
            raise ResultsError(f"{path}: benchmarks[{i}] ({b['name']}): unknown time_unit {unit!r}")
        t = b.get("real_time")
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ResultsError(f"{path}: benchmarks[{i}] ({b['name']}): real_time {t!r} is not a time")
        rows.append(_row(base_name(b), t * US_PER[unit], b))  # a time in us stays the same number
    ctx = data.get("context", {})
    block = next((data[k] for k in ("flashstep", "flashstep_run", "flashstep_step") if isinstance(data.get(k), dict)),
                 {})
    targets = _gbench_targets(block.get("targets", []))
    for key in ("split_kv_targets",):  # stage 03's own goals, stored beside the run's
        targets += _gbench_targets(block.get(key, []))
    note = block.get("note") or block.get("label") or ctx.get("flush")
    # a step's or gpu-fp8.sh's block names the commit its binary was built from, where the
    # binary's own context may say "unknown"
    return _run(path, data, "gbench", device=ctx.get("device") or block.get("device"),
                commit=block.get("commit") or ctx.get("commit"), tree=block.get("tree"),
                command=block.get("command"), date=ctx.get("date"), note=note or None,
                ceilings={k: float(ctx[k]) for k in CEILINGS if k in ctx}, rows=rows, targets=targets)


def from_sampling(path, data):
    """bench/reports/sampling_report.py merge: stage 06's rows ("flashstep") and its peers'."""
    rows = [_row(f"06_sampling/{r['name']}", r["median_us"], r) for r in data["flashstep"]]
    rows += [_row(f"peer_{r['impl']}/{r['name']}", r["median_us"], r) for r in data.get("peers", [])
             if "median_us" in r]
    targets = [{"what": t["what"], "ratio": t.get("ratio"), "goal": f">= {t['target_ratio']:.2f}",
                "met": t.get("met")} for t in data.get("targets", [])]
    return _run(path, data, "sampling", device=data.get("device"), commit=data.get("commit"),
                tree=data.get("tree"), command=data.get("command"), date=data.get("date"),
                note=data.get("note") or None, rows=rows, targets=targets)


def from_sampling_modes(path, data):
    """flashstep_sampling_bench --modes (stage 06's pass-mode A/B, an option of the bench up
    to commit 25f7800): one row per shape and mode, its median the mean of the rounds'
    medians, and the peers' rows."""
    rows = [_row(f"06_sampling[{mode}]/{shape}", sum(times) / len(times), {"mode": mode, "rounds_us": times})
            for shape, per in data["modes"].items() for mode, times in per.items() if times]
    rows += [_row(f"peer_{r['impl']}/{r['name']}", r["median_us"], r) for r in data.get("peers", [])
             if "median_us" in r]
    return _run(path, data, "sampling_modes", device=data.get("device"), commit=data.get("commit"),
                tree=data.get("tree"), command=data.get("command"), date=data.get("date"),
                note=data.get("note") or None, rows=rows)


def from_context_parallel(path, data):
    """flashstep_cp_bench (stage 08): one row per shape, variant, exchange and GPU count."""
    ctx = data["context"]
    rows = [_row(f"08_context_parallel/{r['shape']}/{r['variant']}/{r['exchange']}/gpus:{r['world_size']}",
                 r["median_us"], r) for r in data["results"]]
    return _run(path, data, "context_parallel", device=ctx.get("device"), commit=ctx.get("commit"),
                tree=ctx.get("tree"), command=ctx.get("command"), date=ctx.get("date"), rows=rows)


def from_peers(path, data):
    """A peers file of bench/peers/attention.py (rows named peer_<impl>/<shape>; a row that
    was not timed, with its error, is left out), with gpu-fp8.sh's "flashstep_run"."""
    rows = [_row(f"peer_{r['impl']}/{r['shape']}", r["median_us"], r) for r in data["results"]
            if "median_us" in r and "shape" in r]
    block = data.get("flashstep_run", {})
    return _run(path, data, "peers", device=data.get("device") or block.get("device"),
                commit=block.get("commit"), tree=block.get("tree"), command=block.get("command"), rows=rows)


def _log_beside(path):
    """(commit, tree, device, date) from the gpu-python.sh log beside a results file, which
    records them where the file itself does not; Nones where there is no such log."""
    log = os.path.splitext(path)[0] + ".log"
    if not os.path.exists(log):
        return None, None, None, None
    with open(log, encoding="utf-8") as f:
        text = f.read()
    lib = re.search(r"\(commit=(\S+) tree=(\S+)", text)
    device = re.search(r" device (.+)", text)
    date = re.search(r"^== gpu-python\.sh (\S+)", text, re.M)
    return (lib.group(1) if lib else None, lib.group(2) if lib else None,
            device.group(1).strip() if device else None, date.group(1) if date else None)


def from_host_cost(path, data):
    """bench/peers/host_cost.py: flashstep.cuda's plan() and run() on the host against
    FlashInfer's, per wrapper and call (seconds a call). A bare list of rows records no
    provenance: that of the run is read from the gpu-python.sh log beside it."""
    if isinstance(data, list):
        commit, tree, device, date = _log_beside(path)
        block, items = {"commit": commit, "tree": tree, "device": device}, data
    else:
        block, items, date = data.get("flashstep_run", {}), data["rows"], None
    rows, targets = [], []
    for r in items:
        size = f"b{r['batch']}_vocab{r['vocab']}" if r.get("vocab") else f"b{r['batch']}_kv{r['kv_len']}"
        name = f"{r['wrapper']}/{size}/{r['call']}/{r['index arrays']}"
        if r.get("flashstep") is not None:
            rows.append(_row("flashstep_" + name, r["flashstep"] * 1e6, r))
        if r.get("FlashInfer") is not None:
            rows.append(_row("peer_flashinfer_" + name, r["FlashInfer"] * 1e6, r))
        if r.get("ratio") is not None and r.get("goal") is not None:
            call = r["call"] if "(" in r["call"] else r["call"] + "()"
            shape = f"batch {r['batch']} x vocab {r['vocab']}" if r.get("vocab") else \
                f"index arrays on the {r['index arrays']}, batch {r['batch']} x kv {r['kv_len']}"
            targets.append({"what": f"{r['wrapper']} {call} host time, {shape}, over FlashInfer's",
                            "ratio": r["ratio"], "goal": f"<= {r['goal']:g}", "met": r["ratio"] <= r["goal"]})
    return _run(path, data, "host_cost", device=block.get("device"), commit=block.get("commit"),
                tree=block.get("tree"), command=block.get("command"), date=date, rows=rows, targets=targets)


def from_results(path, data):
    """A file written in the one shape itself (its "format" is FORMAT): a report script's
    --json, bench/reports/fp8_report.py's say. Its rows and targets are read as written."""
    rows = [_row(r["name"], r["median_us"], r, r.get("unit")) for r in data["rows"]]
    targets = [{"what": t["what"], "ratio": t.get("ratio"), "goal": t.get("goal", ""), "met": t.get("met")}
               for t in data.get("targets", [])]
    return _run(path, data, "results", device=data.get("device"), commit=data.get("commit"), tree=data.get("tree"),
                command=data.get("command"), date=data.get("date"), note=data.get("note"),
                ceilings={k: float(v) for k, v in data.get("ceilings", {}).items() if k in CEILINGS}, rows=rows,
                targets=targets)


def from_mixed_step(path, data):
    """Stage 09's timing of one mixed step's attention in each form (the skipped GPU case
    "09_engine mixed step timing" of tests/stages/test_mixed_step.cpp writes it; a run
    script adds commit, date and command; bench/reports/mixed_step_report.py reads it): per
    (prefill tokens, decode rows) each form's median. One row per form and mix, named
    "09_engine_<form>[_<stage asked>]/p<prefill tokens>_d<decode rows>", in microseconds."""
    rows = []
    for r in data["rows"]:
        for v in r["variants"]:
            impl = "09_engine_" + v["form"] + ("" if v["asked"] == "default" else "_" + v["asked"])
            rows.append(_row(f"{impl}/p{r['prefill_tokens']}_d{r['decodes']}", float(v["us"]), v, "us"))
    return _run(path, data, "mixed_step", device=data.get("device"), commit=data.get("commit"),
                command=data.get("command"), date=data.get("date"), rows=rows)


# The writers' shapes, told apart by what only each one writes.
WRITERS = [
    ("results", lambda d: isinstance(d, dict) and d.get("format") == FORMAT, from_results),
    ("gbench", lambda d: isinstance(d, dict) and isinstance(d.get("benchmarks"), list), from_gbench),
    ("sampling", lambda d: isinstance(d, dict) and isinstance(d.get("flashstep"), list), from_sampling),
    ("sampling_modes", lambda d: isinstance(d, dict) and isinstance(d.get("modes"), dict), from_sampling_modes),
    ("context_parallel", lambda d: isinstance(d, dict) and "cost_model" in d, from_context_parallel),
    ("peers", lambda d: isinstance(d, dict) and isinstance(d.get("results"), list), from_peers),
    ("mixed_step", lambda d: isinstance(d, dict) and isinstance(d.get("rows"), list) and bool(d["rows"])
     and isinstance(d["rows"][0], dict) and "variants" in d["rows"][0], from_mixed_step),
    ("host_cost", lambda d: (isinstance(d, list) and d and isinstance(d[0], dict) and "wrapper" in d[0])
     or (isinstance(d, dict) and isinstance(d.get("rows"), list)), from_host_cost),
]


def load(path):
    """One results file in the one shape (the module's doc). Raises ResultsError naming the
    file and what is wrong with it."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ResultsError(f"{path}: not readable JSON: {e}") from e
    for _, matches, read in WRITERS:
        if matches(data):
            try:
                return read(path, data)
            except (KeyError, TypeError, ValueError) as e:
                if isinstance(e, ResultsError):
                    raise
                raise ResultsError(f"{path}: not a complete results file: {type(e).__name__} {e}") from e
    raise ResultsError(f"{path}: not a results file of any writer flashstep knows "
                       f"({', '.join(w for w, _, _ in WRITERS)})")


def load_tree(results_dir, history=False):
    """Every *.json under `results_dir` (docs/results), sorted by path; the superseded runs
    in history/ folders only with `history`. An absent folder gives none."""
    found = []
    for root, dirs, files in os.walk(results_dir):
        dirs[:] = sorted(d for d in dirs if history or d != "history")
        found += [os.path.join(root, n) for n in files if n.endswith(".json")]
    return [load(p) for p in sorted(found)]


def medians(path):
    """(the file's JSON as written, {row name: row}) of one results file: what the report
    scripts look rows up in."""
    run = load(path)
    return run["raw"], {r["name"]: r for r in run["rows"]}
